"""``specgen bench``: the K sweep on the user's own machine, rendered as a table and a chart.

The sweep, the report and what is remembered are library code (``specgen.bench``,
``specgen.memo``); this module renders a report (everything fits 80 columns) and shows progress.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.console import Group, RenderableType
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from specgen.bench.report import FEW_GUESSES, Report
from specgen.bench.sweep import DEFAULT_VARIANTS
from specgen.core.sampling import DEFAULT_SAMPLING
from specgen.errors import Interrupted
from specgen.memo import Variant, variant_name, variant_options
from specgen.options import (
    CtxOpt,
    DraftOpt,
    DraftPMinOpt,
    GpuLayersOpt,
    LocalHeadOpt,
    PairOpt,
    RpcOpt,
    SeedOpt,
    TargetOpt,
    ThreadsOpt,
    VerboseOpt,
)
from specgen.output import figure, out


def bench(
    pair: PairOpt = None,
    target: TargetOpt = None,
    draft: DraftOpt = None,
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
    threads: ThreadsOpt = 0,
    gpu_layers: GpuLayersOpt = -1,
    ctx_size: CtxOpt = 0,
    rpc: RpcOpt = None,
    rpc_local_head: LocalHeadOpt = True,
    verbose: VerboseOpt = False,
) -> None:
    """Measure the pair on this machine: sweep K, compare with the target alone, recommend K.

    What it finds best is remembered: `specgen run` and `serve` use it for these models here.
    """
    from specgen.bench.prompts import BUILTIN_KINDS, BUILTIN_PROMPTS, load_prompts
    from specgen.bench.runner import BenchSession
    from specgen.bench.sweep import parse_lookaheads
    from specgen.choice import decide
    from specgen.errors import UsageError
    from specgen.memo import remember
    from specgen.pair import PairOptions, open_pair

    variants = parse_lookaheads(lookaheads)
    if prompts_file:
        prompts, kinds = load_prompts(prompts_file), None
    else:
        prompts, kinds = BUILTIN_PROMPTS, BUILTIN_KINDS
    # Every row but K=0 needs the draft model loaded, whatever K the pair itself runs at.
    decision = decide(
        pair,
        target,
        draft,
        ngram=False,
        lookahead="auto",
        rpc=rpc,
        threads=threads,
        gpu_layers=gpu_layers,
    )
    choice = decision.choice
    if choice.draft is None:
        if lookaheads == DEFAULT_VARIANTS:
            variants = ["ngram"]  # a target alone can still draft by prompt lookup
        elif any(k != "ngram" for k in variants):
            raise UsageError(
                "bench needs a draft model for K's, auto and hybrid: name a pair, "
                "or both --target and --draft (or -k ngram)"
            )
    loaded = open_pair(
        decision,
        PairOptions.for_both(ctx_size, threads, gpu_layers, verbose, rpc_local_head),
    )
    session = BenchSession(
        loaded,
        choice,
        prompts,
        kinds,
        variants,
        max_tokens=max_tokens,
        repeats=repeats,
        seed=seed if seed is not None else 0,
        draft_p_min=draft_p_min,
        prompts_file=prompts_file,
        local_head=rpc_local_head,
    )
    settings = [temperature] if temperature is not None else [0.0, DEFAULT_SAMPLING.temperature]
    reports, interrupted = session.all(settings, _ProgressBar(len(prompts), repeats))
    if not reports:
        out.warning("interrupted before anything was measured; nothing written")
        raise Interrupted()
    for report in reports:
        out.show(
            render(
                report,
                decision.name,
                loaded.target.path,
                loaded.draft.path if loaded.draft else None,
            )
        )
    session.remember_costs()
    if not interrupted:
        remember(decision.memo, reports, datetime.date.today().isoformat())
        out.show(_remembered_note(reports))
    _write_outputs(reports, json_path, csv_path, plot_path)
    if interrupted:
        out.warning("interrupted: the tables above hold what was measured so far (partial)")
        raise Interrupted()


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


def _remembered_note(reports: list[Report]) -> Text:
    parts = []
    for report in reports:
        best = report.best()
        what = "-k 0 (the target alone)" if best is None else variant_name(best.variant)
        parts.append(f"{what} at T={report.temperature}")
    return Text(
        "specgen run will now use " + " and ".join(parts) + " for these models on "
        "this machine, unless -k says otherwise",
        style="dim",
    )


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


def render(
    report: Report, pair: str | None, target: Path | None = None, draft: Path | None = None
) -> Group:
    """The table, acceptance by position, speedup by kind of prompt, a chart, the verdict.

    Everything fits 80 columns, so a file or a pipe gets the whole table.
    """
    table = Table(
        title=f"specgen bench: {report.title}",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 1),
    )
    for name in ("K", "tok/s", "speedup", "pred.", "alpha", "tok/cyc", "draft", "verify", "c"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_row(
        "0",
        f"{report.baseline_tokens_per_second:.1f}",
        "1.00x",
        "1.00x",
        "-",
        "1.00",
        "-",
        f"{report.target_ms_per_token:.1f}",
        "-",
    )
    for row in report.per_k:
        style = "bold green" if row.variant == report.recommended else None
        table.add_row(
            str(row.variant),
            f"{row.tokens_per_second:.1f}",
            f"{row.speedup:.2f}x",
            figure(row.predicted_speedup, ".2f", "x"),
            figure(None if row.accept_rate is None else row.accept_rate * 100, ".0f", "%"),
            f"{row.tokens_per_cycle:.2f}",
            figure(row.draft_ms_per_token, ".1f"),
            f"{row.verify_ms:.1f}",
            figure(row.cost_ratio, ".2f"),
            style=style,
        )
    parts: list[RenderableType] = [table, _positions(report)]
    adaptive = _adaptive_notes(report)
    if adaptive:
        parts.append(adaptive)
    if report.per_kind:
        parts.append(_kinds_table(report))
    parts.append(_chart(report))
    notes = [f"{variant_name(r.variant)}: {r.explanation}" for r in report.per_k if r.explanation]
    if notes:
        parts.append(Text("\n".join(notes), style="yellow"))
    if report.warning:
        parts.append(Text(f"warning: {report.warning}", style="bold red"))
    best = report.best()
    if report.note:
        parts.append(Text(report.note, style="yellow"))
    if best is not None:
        name = variant_name(best.variant)
        parts.append(
            Text.assemble(
                ("recommended: ", "bold"),
                (name, "bold green"),
                f" ({best.speedup:.2f}x the target alone; {best.tokens_per_second:.1f} tok/s "
                f"against {report.baseline_tokens_per_second:.1f})",
            )
        )
        # One line however long, so a copy of it pastes as one command.
        command = (
            f"  specgen run {variant_options(best.variant, pair, target, draft)}"
            f"{_workers_option(report)}"
            f'{_temperature_option(report)} "Your prompt"'
        )
        parts.append(Text(command, no_wrap=True, overflow="ignore"))
    if _workers_option(report):
        parts.append(
            Text(
                "the target runs on RPC workers: 'verify' and the K=0 row include the "
                "network round trip; K was chosen against that cost",
                style="dim",
            )
        )
    parts.append(
        Text(
            "speedup: median of per-run ratios to the target alone on the same prompt; "
            "draft: ms per guess; verify: ms per target pass; c: draft/target time "
            "per token; pred.: E[tokens/cycle] / (K*c + verify/target) "
            "(Leviathan et al. 2023); auto, ngram, hybrid choose K before each cycle",
            style="dim",
        )
    )
    return Group(*parts)


def _workers_option(report: Report) -> str:
    setting = report.setting
    if setting is None or not setting.workers:
        return ""
    return f" --rpc {','.join(setting.workers)}" + (
        "" if setting.local_head else " --no-rpc-local-head"
    )


def _temperature_option(report: Report) -> str:
    return f" --temperature {report.temperature:g}" if report.temperature is not None else ""


def _positions(report: Report, shown: int = 12) -> Text:
    """Acceptance by position, one compact line per row: the first ``shown`` positions."""
    text = Text("acceptance by position, % (guess 1, 2, ...)\n", style="bold")
    for row in report.per_k:
        rates = row.position_accept_rates
        cells = " ".join(f"{r * 100:.0f}" for r in rates[:shown])
        more = " ..." if len(rates) > shown else ""
        text.append(f"  {str(row.variant):>6}  {cells or '-'}{more}\n")
    return text


def _adaptive_notes(report: Report) -> Text | None:
    """What the adaptive rows chose: their mean K, how often the target ran alone, n-gram use."""
    rows = [r for r in report.per_k if not isinstance(r.variant, int)]
    if not rows:
        return None
    text = Text("adaptive K\n", style="bold")
    for row in rows:
        line = (
            f"  {row.variant:>6}  mean K {figure(row.mean_lookahead, '.1f')}, target "
            f"alone in {row.target_alone_share:.0%} of cycles"
        )
        if row.variant == "hybrid" and row.ngram_share is not None:
            line += f", {row.ngram_share:.0%} of guesses from n-grams"
        if 0 < row.model_guesses < FEW_GUESSES:
            line += (
                f"; draft and c rest on {row.model_guesses} draft-model "
                f"guess{'es' if row.model_guesses > 1 else ''}"
            )
        text.append(line + "\n")
    return text


def _kinds_table(report: Report) -> Table:
    """Median speedup for each kind of prompt, one column per K or variant."""
    table = Table(
        title="speedup by kind of prompt",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 1),
    )
    table.add_column("kind", no_wrap=True)
    best_of = {
        kind: max(speedups.values(), default=0.0) for kind, speedups in report.per_kind.items()
    }
    for row in report.per_k:
        table.add_column(str(row.variant), justify="right", no_wrap=True)
    for kind, speedups in report.per_kind.items():
        cells = []
        for row in report.per_k:
            value = speedups.get(row.variant)
            cell = figure(value, ".2f")
            cells.append(f"[bold]{cell}[/]" if value and value == best_of[kind] else cell)
        table.add_row(kind, *cells)
    return table


def _chart(report: Report, width: int = 40) -> Text:
    """Speedup against K as horizontal bars: measured (#) and predicted (|)."""
    rows: list[tuple[Variant, float, float | None]] = [(0, 1.0, 1.0)]
    rows += [(r.variant, r.speedup, r.predicted_speedup) for r in report.per_k]
    top = max(max(m, p or 0) for _, m, p in rows) or 1.0
    chart = Text("speedup against K (# measured, | predicted)\n", style="bold")
    for k, measured, predicted in rows:
        bar = ["#" if i < round(measured / top * width) else " " for i in range(width + 1)]
        if predicted is not None:
            bar[min(width, round(predicted / top * width))] = "|"
        chart.append(f"{k!s:>6} ")
        chart.append("".join(bar), style="green" if k else "dim")
        chart.append(f" {measured:.2f}x\n")
    return chart
