"""``specgen bench``: the K sweep on the user's own machine, rendered as a table and a chart.

The sweep, the report and what is remembered are library code (``specgen.bench``,
``specgen.session.memo``); the report is drawn by ``specgen.cli.bench_report``; this module shows
progress and prints.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)

from specgen.bench.report import Report
from specgen.bench.sweep import DEFAULT_VARIANTS, LOOKUP_VARIANTS
from specgen.cli.bench_report import remembered_note, render
from specgen.core.sampling import DEFAULT_SAMPLING
from specgen.errors import Interrupted
from specgen.session.memo import Variant

if TYPE_CHECKING:
    from specgen.api import Specgen
    from specgen.bench.streams import StreamsRow
    from specgen.session.pair import Pair
    from specgen.structured.grammar import Grammar
from specgen.cli.options import (
    CtxOpt,
    DraftOpt,
    DraftPMinOpt,
    GpuLayersOpt,
    LocalHeadOpt,
    MtpOpt,
    PairOpt,
    RpcOpt,
    SeedOpt,
    TargetOpt,
    ThreadsOpt,
    VerboseOpt,
    seed_of,
)
from specgen.cli.output import out


def bench(
    pair: PairOpt = None,
    target: TargetOpt = None,
    draft: DraftOpt = None,
    mtp: MtpOpt = None,
    lookaheads: Annotated[
        str,
        typer.Option(
            "--lookahead",
            "-k",
            metavar="LIST",
            help="What to measure, comma-separated: fixed K's "
            "of the draft model, 'auto' (the draft model, K chosen each cycle), 'ngram' (prompt "
            "lookup alone) and 'hybrid' (both); K=0, the target alone, always runs.",
        ),
    ] = DEFAULT_VARIANTS,
    draft_p_min: DraftPMinOpt = 0.0,
    prompts_file: Annotated[
        Path | None,
        typer.Option(
            "--prompts",
            metavar="FILE",
            help="Prompts, one per line or JSON lines with a "
            '"prompt" field (default: a built-in set of thirteen).',
            show_default=False,
        ),
    ] = None,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", "-n", min=4, help="New tokens per run.")
    ] = 64,
    repeats: Annotated[
        int, typer.Option("--repeats", "-r", min=1, help="Times to run the whole sweep.")
    ] = 1,
    temperature: Annotated[
        float | None,
        typer.Option(
            "--temperature",
            "--temp",
            min=0.0,
            help="Measure at this temperature only (with "
            "run's --top-k/--top-p/--min-p); default: both greedy (0) and run's default, "
            f"{DEFAULT_SAMPLING.temperature}, with a recommendation for each.",
            show_default=False,
        ),
    ] = None,
    seed: SeedOpt = None,
    json_path: Annotated[
        Path | None,
        typer.Option(
            "--json",
            metavar="FILE",
            help="Write every figure, the machine and the parameters as JSON here.",
            show_default=False,
        ),
    ] = None,
    csv_path: Annotated[
        Path | None,
        typer.Option(
            "--csv", metavar="FILE", help="Write the per-K table as CSV here.", show_default=False
        ),
    ] = None,
    plot_path: Annotated[
        Path | None,
        typer.Option(
            "--plot",
            metavar="FILE",
            help="Write a PNG chart of speedup against K (needs specgen[plot]).",
            show_default=False,
        ),
    ] = None,
    no_remember: Annotated[
        bool,
        typer.Option(
            "--no-remember",
            help="Measure and report only: leave run's and serve's defaults as they are.",
        ),
    ] = False,
    forget: Annotated[
        bool,
        typer.Option(
            "--forget",
            help="Forget what bench found for these models on this machine (run and serve go "
            "back to their own defaults), and measure nothing.",
        ),
    ] = False,
    streams: Annotated[
        str | None,
        typer.Option(
            "--streams",
            metavar="LIST",
            help="Also measure several streams at once, e.g. 1,2,4: the aggregate tokens/s "
            "with -k auto and with the target alone, S prompts at a time on one context (what "
            "serve --parallel S does).",
            show_default=False,
        ),
    ] = None,
    threads: ThreadsOpt = 0,
    gpu_layers: GpuLayersOpt = -1,
    ctx_size: CtxOpt = 0,
    rpc: RpcOpt = None,
    rpc_local_head: LocalHeadOpt = True,
    verbose: VerboseOpt = False,
) -> None:
    """Measure the pair on this machine: sweep K, compare with the target alone, recommend K.

    What it finds best is remembered (a whole bench of 3 prompts and 256 tokens a row at
    least): `specgen run` and `serve` use it for these models here.
    """
    from specgen.api import Specgen
    from specgen.bench.prompts import (
        BUILTIN_KINDS,
        BUILTIN_PROMPTS,
        builtin_grammars,
        load_prompts,
    )
    from specgen.bench.runner import BenchSession
    from specgen.bench.sweep import parse_lookaheads
    from specgen.errors import UsageError
    from specgen.lookahead import snapshots_for
    from specgen.session import memo
    from specgen.session.decide import decide

    if plot_path is not None:  # before the work, not after it
        _needs_matplotlib()
    variants = parse_lookaheads(lookaheads)
    counts = _stream_counts(streams) if streams else []
    kinds: list[str] | None
    if prompts_file:
        (prompts, grammars), kinds = load_prompts(prompts_file), None
    else:
        prompts, kinds, grammars = BUILTIN_PROMPTS, BUILTIN_KINDS, builtin_grammars()
    # Every row but K=0 needs the draft model loaded, whatever K the pair itself runs at; a
    # recurrent target keeps snapshots for the largest K swept, as `run -k K` would.
    fixed = [k for k in variants if isinstance(k, int)]
    probe = decide(pair, target, draft, ngram=False, mtp=mtp, rpc=rpc, keep_draft=True)
    choice = probe.choice
    if forget:
        removed = memo.forget(choice)
        out.note(
            f"forgot what bench found for these models here ({len(removed)} record"
            f"{'s' if len(removed) != 1 else ''}); run and serve use their own defaults"
            if removed
            else "bench has remembered nothing for these models here"
        )
        return
    if choice.draft is None and not choice.mtp:
        if lookaheads == DEFAULT_VARIANTS:
            variants = list(LOOKUP_VARIANTS)  # a target alone can still draft by prompt lookup
        elif any(k not in LOOKUP_VARIANTS for k in variants):
            raise UsageError(
                "bench needs a draft model for K's, auto and hybrid: name a pair, "
                "or both --target and --draft (or -k ngram,cache)"
            )
    snapshots = max([snapshots_for("auto", choice.mtp), *(snapshots_for(k) for k in fixed)])
    sg = Specgen(
        pair,
        target,
        draft,
        ngram=False,
        mtp=mtp,
        n_ctx=ctx_size,
        threads=threads,
        gpu_layers=gpu_layers,
        draft_p_min=draft_p_min,
        verbose=verbose,
        progress=True,
        keep_draft=True,
        snapshots=snapshots,
        rpc=rpc,
        rpc_local_head=rpc_local_head,
    )
    decision, loaded = sg.decision, sg.pair
    if kinds is not None:  # the built-in prompts
        prompts, kinds, grammars = _constrained_if_possible(loaded, prompts, kinds, grammars)
    session = BenchSession(
        loaded,
        choice,
        prompts,
        kinds,
        variants,
        max_tokens=max_tokens,
        repeats=repeats,
        seed=seed_of(seed) or 0,
        prompts_file=prompts_file,
        local_head=rpc_local_head,
        grammars=grammars,
    )
    settings = [temperature] if temperature is not None else [0.0, DEFAULT_SAMPLING.temperature]
    out.note(
        _estimate(loaded, len(settings) * repeats * len(prompts) * (len(variants) + 1), max_tokens)
    )
    reports, interrupted = session.all(settings, _ProgressBar(len(prompts), repeats))
    if not reports:
        out.warning("interrupted before anything was measured; nothing written")
        raise Interrupted()
    ran_with = "".join(
        f" {flag} {value}"
        for flag, value, default in (
            ("-t", threads, 0),
            ("-ngl", gpu_layers, -1),
            ("-c", ctx_size, 0),
        )
        if value != default
    )
    for report in reports:
        out.show(
            render(
                report,
                decision.name,
                loaded.target.path,
                loaded.draft.path if loaded.draft else None,
                mtp=loaded.mtp,
                ran_with=ran_with,
            )
        )
    session.remember_costs()
    small = memo.too_small(len(prompts), repeats, max_tokens)
    disturbed = sum(report.disturbed_runs for report in reports)
    if disturbed:
        small = (
            f"other processes kept the CPUs busy during {disturbed} of the runs: nothing "
            "remembered; bench again when the machine is quiet"
        )
    if interrupted:
        pass  # said below: a partial bench changes nothing
    elif no_remember:
        out.note("--no-remember: run's and serve's defaults are as they were")
    elif small is not None:
        out.warning(small)
    else:
        memo.remember(
            decision.memo,
            [report.finding() for report in reports],
            datetime.date.today().isoformat(),
        )
        out.show(remembered_note(reports))
    _write_outputs(reports, json_path, csv_path, plot_path)
    if counts and not interrupted:
        del sg, loaded, session  # one pair in memory at a time
        many = Specgen(
            pair, target, draft, ngram=False, mtp=mtp, n_ctx=ctx_size, threads=threads,
            gpu_layers=gpu_layers, verbose=verbose, progress=True, rpc=rpc,
            rpc_local_head=rpc_local_head, parallel=max(counts),
        )  # fmt: skip
        best = _streams_row(many, prompts, counts, max_tokens, settings[0], seed)
        if small is None and not no_remember:  # as the sweep's: serve's default slots
            memo.remember_streams(
                decision.memo,
                best.streams,
                best.tokens_per_second,
                datetime.date.today().isoformat(),
            )
            out.note(f"remembered: serve opens {best.streams} slots here (--parallel to choose)")
    if interrupted:
        out.warning(
            "interrupted: the tables above hold what was measured so far (partial); "
            "nothing remembered"
        )
        raise Interrupted()


def _needs_matplotlib() -> None:
    from importlib.util import find_spec

    from specgen.errors import UsageError

    if find_spec("matplotlib") is None:
        raise UsageError("--plot needs matplotlib: pip install 'specgen[plot]' (or drop --plot)")


def _estimate(loaded: Pair, runs: int, max_tokens: int) -> str:
    """What the bench is about to do, and how long the target alone would take for it (the
    slowest row; speculation shortens the rest) where its speed here is known."""
    what = f"bench: {runs} runs of up to {max_tokens} tokens"
    step = loaded.costs.of(True).verify(1)
    if step is None:
        return what + "; the bar shows the time left once it starts"
    minutes = runs * max_tokens * step / 60
    return (
        what + f", at most about {max(1, round(minutes))} min here (Ctrl-C keeps the tables so far)"
    )


class _ProgressBar:
    """The sweep's progress on stderr: one bar per sampling setting, the run in progress."""

    def __init__(self, prompts: int, repeats: int) -> None:
        self.prompts, self.repeats = prompts, repeats
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    def started(self, temperature: float, total: int) -> None:
        self._bar = Progress(
            TextColumn(f"[bold]bench[/] T={temperature} {{task.description}}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=out.err,
            transient=True,
        )
        self._bar.start()
        self._task = self._bar.add_task("warm-up", total=total)

    def running(self, repeat: int, prompt: int, variant: Variant) -> None:
        assert self._bar is not None and self._task is not None
        if self._bar.tasks[self._task].description != "warm-up":
            self._bar.advance(self._task)
        self._bar.update(
            self._task,
            description=f"prompt {prompt + 1}/{self.prompts} "
            f"K={variant}" + (f" repeat {repeat + 1}" if self.repeats > 1 else ""),
        )

    def ended(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def _write_outputs(
    reports: list[Report], json_path: Path | None, csv_path: Path | None, plot_path: Path | None
) -> None:
    from specgen.bench.export import write_csv, write_json, write_plot

    if json_path:
        write_json(reports, json_path)
    if csv_path:
        write_csv(reports, csv_path)
    if plot_path:
        write_plot(reports[-1], plot_path)
    for path in (json_path, csv_path, plot_path):
        if path:
            out.note(f"wrote {path}")


def _constrained_if_possible(
    loaded: Pair, prompts: list[str], kinds: list[str], grammars: list[Grammar | None]
) -> tuple[list[str], list[str], list[Grammar | None]]:
    """The built-in prompts, less the constrained ones where the target cannot run a grammar
    (a vocabulary without an end of generation, or one llguidance cannot read): said on
    stderr, and the rest measured."""
    from specgen.errors import UserError

    try:
        for found in {g for g in grammars if g is not None}:
            loaded.target.constrain(found)
    except UserError as err:
        out.warning(f"the constrained prompts are left out: {err}")
        keep = [i for i, g in enumerate(grammars) if g is None]
        return [prompts[i] for i in keep], [kinds[i] for i in keep], [None] * len(keep)
    return prompts, kinds, grammars


def _stream_counts(text: str) -> list[int]:
    from specgen.errors import UsageError

    try:
        counts = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        counts = []
    if not counts or counts[0] < 1 or counts[-1] > 64:
        raise UsageError(f"--streams takes counts from 1 to 64, comma-separated (got {text!r})")
    return counts


def _streams_row(
    many: Specgen,
    prompts: list[str],
    counts: list[int],
    max_tokens: int,
    temperature: float,
    seed: int | None,
) -> StreamsRow:
    """The concurrency table: aggregate tokens/s by streams at once, -k auto and -k 0; the
    count that gave the most."""
    from rich.table import Table

    from specgen.bench.runner import sampling_at
    from specgen.bench.streams import best_streams, measure_streams, streams_advice
    from specgen.engine import GenerationConfig

    config = GenerationConfig(
        sampling=sampling_at(temperature),
        max_tokens=max_tokens,
        seed=seed or 0,
        coupling="residual",
    )
    chat = many.wants_chat(prompts[0], None)
    with out.err.status(f"bench: {', '.join(map(str, counts))} streams at once"):
        rows = measure_streams(many.pair, prompts, counts, config, chat)
    by = {(r.streams, r.lookahead): r.tokens_per_second for r in rows}
    table = Table(title=f"Streams at once (T={temperature}, {len(prompts)} prompts each)")
    table.add_column("streams", justify="right")
    table.add_column("-k auto tok/s", justify="right")
    table.add_column("-k 0 tok/s", justify="right")
    table.add_column("auto / one stream", justify="right")
    one = by.get((counts[0], "auto")) or 0.0
    for count in counts:
        auto, alone = by[(count, "auto")], by[(count, "0")]
        ratio = f"{auto / one:.2f}x" if one else "-"
        table.add_row(str(count), f"{auto:.1f}", f"{alone:.1f}", ratio)
    out.show(table)
    best = best_streams([r for r in rows if r.lookahead == "auto"])
    for line in streams_advice(rows, best):
        out.show(line)
    return best
