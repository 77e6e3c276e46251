"""``specgen bench``: the K sweep on the user's own machine, rendered as a table and a chart."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich import box
from rich.console import Console, Group
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from specgen.bench import DEFAULT_VARIANTS, FEW_GUESSES, Report, Run, Variant, variant_name
from specgen.errors import Interrupted
from specgen.options import (
    RUN_SAMPLING,
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
from specgen.stats import Stats

if TYPE_CHECKING:
    from specgen.session import Choice, Pair

out = Console()
err = Console(stderr=True)


def bench(
    pair: PairOpt = None,
    target: TargetOpt = None,
    draft: DraftOpt = None,
    lookaheads: Annotated[str, typer.Option(
        "--lookahead", "-k", metavar="LIST", help="What to measure, comma-separated: fixed K's "
        "of the draft model, 'auto' (the draft model, K chosen each cycle), 'ngram' (prompt "
        "lookup alone) and 'hybrid' (both); K=0, the target alone, always runs.")
    ] = DEFAULT_VARIANTS,
    draft_p_min: DraftPMinOpt = 0.0,
    prompts_file: Annotated[Path | None, typer.Option(
        "--prompts", metavar="FILE", help="Prompts, one per line or JSON lines with a "
        "\"prompt\" field (default: a built-in set of thirteen).", show_default=False)] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", "-n", min=4,
                                            help="New tokens per run.")] = 64,
    repeats: Annotated[int, typer.Option("--repeats", "-r", min=1,
                                         help="Times to run the whole sweep.")] = 1,
    temperature: Annotated[float | None, typer.Option(
        "--temperature", "--temp", min=0.0, help="Measure at this temperature only (with "
        "run's --top-k/--top-p/--min-p); default: both greedy (0) and run's default, "
        f"{RUN_SAMPLING.temperature}, with a recommendation for each.",
        show_default=False)] = None,
    seed: SeedOpt = None,
    json_path: Annotated[Path | None, typer.Option(
        "--json", metavar="FILE", help="Write every figure, the machine and the parameters as "
        "JSON here.", show_default=False)] = None,
    csv_path: Annotated[Path | None, typer.Option(
        "--csv", metavar="FILE", help="Write the per-K table as CSV here.",
        show_default=False)] = None,
    plot_path: Annotated[Path | None, typer.Option(
        "--plot", metavar="FILE", help="Write a PNG chart of speedup against K (needs "
        "specgen[plot]).", show_default=False)] = None,
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
    from specgen.bench import BUILTIN_KINDS, BUILTIN_PROMPTS, load_prompts, parse_lookaheads
    from specgen.errors import UsageError
    from specgen.registry import Registry, resolve
    from specgen.selftest import ensure_cpu_works
    from specgen.session import PairOptions, bench_memo, choose, load_pair

    ks = parse_lookaheads(lookaheads)
    if prompts_file:
        prompts, kinds = load_prompts(prompts_file), None
    else:
        prompts, kinds = BUILTIN_PROMPTS, BUILTIN_KINDS
    choice = choose(Registry.load(), pair, target, draft, rpc=rpc)
    if choice.draft is None:
        if lookaheads == DEFAULT_VARIANTS:
            ks = ["ngram"]  # a target alone can still draft by prompt lookup
        elif any(k != "ngram" for k in ks):
            raise UsageError("bench needs a draft model for K's, auto and hybrid: name a pair, "
                             "or both --target and --draft (or -k ngram)")
    target_path = resolve(choice.target)
    draft_path = resolve(choice.draft) if choice.draft else None
    ensure_cpu_works([p for p in (target_path, draft_path) if p is not None])
    loaded = load_pair(target_path, draft_path, PairOptions(
        n_ctx=ctx_size, target_threads=threads, draft_threads=threads,
        target_gpu_layers=gpu_layers, draft_gpu_layers=gpu_layers, verbose=verbose,
        workers=choice.workers, local_head=rpc_local_head))
    settings = [temperature] if temperature is not None else [0.0, RUN_SAMPLING.temperature]
    bench_run = _BenchRun(loaded, prompts, kinds, ks, choice.chat, max_tokens, repeats,
                          seed if seed is not None else 0, draft_p_min)
    reports, interrupted = bench_run.all(settings)
    if not reports:
        err.print("interrupted before anything was measured; nothing written", style="yellow")
        raise Interrupted()
    meta = _meta(choice, loaded, target_path, draft_path, bench_run, prompts_file,
                 rpc_local_head)
    where = f", target on {','.join(choice.workers)}" if choice.workers else ""
    for report in reports:
        report.meta = {**meta, "title": f"{meta['name']}, {loaded.target.n_threads} threads"
                       f"{where}, T={report.meta['params']['temperature']}"  # type: ignore[index]
                       + (" (partial: interrupted)" if report.meta.get("partial") else ""),
                       "params": {**meta["params"], **report.meta["params"]},  # type: ignore[dict-item]
                       "partial": report.meta.get("partial", False)}
        out.print(render(report, choice.pair.name if choice.pair else None, target_path,
                         draft_path), crop=False)
    learned = bench_run.remembered
    if bench_run.costs_file is not None and (learned.greedy.verify_by_n
                                             or learned.sampled.verify_by_n):
        from specgen.session import save_costs

        save_costs(bench_run.costs_file, learned)
    if not interrupted:
        from specgen.bench import remember

        remember(bench_memo(choice, threads, gpu_layers), reports,
                 datetime.date.today().isoformat())
        out.print(_remembered_note(reports))
    _write_outputs(reports, json_path, csv_path, plot_path)
    if interrupted:
        err.print("interrupted: the tables above hold what was measured so far (partial)",
                  style="yellow")
        raise Interrupted()


class _BenchRun:
    """One bench: the engines over the loaded pair, the encoded prompts, the sweep per setting."""

    def __init__(self, loaded: Pair, prompts: list[str], kinds: list[str] | None,
                 ks: list[Variant], chat: bool | None, max_tokens: int, repeats: int,
                 seed: int, draft_p_min: float) -> None:
        from specgen.session import bench_engines, prompt_tokens, wants_chat

        self.use_chat = wants_chat(loaded, chat, None, None)
        self.encoded = [prompt_tokens(loaded.target, p, self.use_chat) for p in prompts]
        self.engines = bench_engines(loaded, draft_p_min)
        # What `-k auto` has measured of these models here: each adaptive run starts from it,
        # as `specgen run` does, and leaves what it learned for the next.
        self.costs_file, self.remembered = loaded.costs_file, loaded.costs
        self.kinds, self.ks, self.max_tokens = kinds, ks, max_tokens
        self.repeats, self.seed, self.draft_p_min = repeats, seed, draft_p_min

    def all(self, temperatures: list[float]) -> tuple[list[Report], bool]:
        """A report per temperature; stops at Ctrl-C with the partial report of the one cut
        short (True: interrupted)."""
        reports = []
        for temperature in temperatures:
            runs: list[Run] = []
            try:
                self.sweep(temperature, runs)
            except KeyboardInterrupt:
                partial = self.summarize(temperature, runs, partial=True)
                return reports + ([partial] if partial else []), True
            reports.append(self.summarize(temperature, runs))
        return reports, False

    def summarize(self, temperature: float, runs: list[Run], partial: bool = False
                  ) -> Report | None:
        from specgen.bench import summarize

        if not any(r.lookahead != 0 for r in runs):
            return None
        report = summarize(runs, self.kinds)
        report.meta = {"params": {"temperature": temperature, **self.sampling_of(temperature)},
                       "partial": partial}
        return report

    @staticmethod
    def sampling_of(temperature: float) -> dict[str, object]:
        return {"top_k": RUN_SAMPLING.top_k, "top_p": RUN_SAMPLING.top_p,
                "min_p": RUN_SAMPLING.min_p} if temperature > 0 else {}

    def sweep(self, temperature: float, runs: list[Run]) -> None:
        from dataclasses import replace

        from specgen.bench import sweep
        from specgen.engine import Finished, GenerationConfig, SpeculativeEngine
        from specgen.lookahead import CostBook

        sampling = replace(RUN_SAMPLING, temperature=temperature)

        def run_one(prompt: int, k: Variant, run_seed: int) -> Stats:
            way = self.engines["alone" if k == 0 else k if isinstance(k, str) else "model"]
            adaptive = isinstance(k, str)
            engine = SpeculativeEngine(way.target, way.drafter,
                                       costs=self.remembered.copy() if adaptive else CostBook())
            config = GenerationConfig(lookahead="auto" if adaptive else k, sampling=sampling,
                                      max_tokens=self.max_tokens, seed=run_seed)
            for event in engine.generate(self.encoded[prompt], config):
                if isinstance(event, Finished):
                    if adaptive:
                        self.remembered = engine.costs
                    return event.stats
            raise AssertionError("the engine always finishes")

        adaptive = [k for k in self.ks if isinstance(k, str)]
        if adaptive and not self.remembered.of(sampling.greedy).verify_by_n:
            # Nothing measured here yet: the warm-up learns the costs, as a first `specgen run`
            # would, so the rows show auto as every later run uses it.
            run_one(0, adaptive[0], self.seed)

        n = len(self.encoded)
        progress = Progress(TextColumn(f"[bold]bench[/] T={temperature} {{task.description}}"),
                            BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                            console=err, transient=True)
        with progress:
            task = progress.add_task("warm-up", total=self.repeats * n * (len(self.ks) + 1))

            def on_run(repeat: int, prompt: int, k: Variant) -> None:
                if progress.tasks[task].description != "warm-up":
                    progress.advance(task)
                progress.update(task, description=f"prompt {prompt + 1}/{n} K={k}"
                                + (f" repeat {repeat + 1}" if self.repeats > 1 else ""))

            sweep(run_one, n, self.ks, self.repeats, self.seed, on_run, runs=runs)


def _meta(choice: Choice, loaded: Pair, target_path: Path, draft_path: Path | None,
          bench_run: _BenchRun, prompts_file: Path | None, local_head: bool
          ) -> dict[str, object]:
    from specgen import backend
    from specgen.machine import cpu_name

    return {
        "name": choice.pair.name if choice.pair else target_path.name,
        "pair": choice.pair.name if choice.pair else None,
        "target": {"spec": choice.target.label(), "file": str(target_path),
                   "size_bytes": target_path.stat().st_size,
                   "description": loaded.target.description,
                   "workers": list(choice.workers), "local_head": local_head},
        "draft": None if draft_path is None or choice.draft is None else {
            "spec": choice.draft.label(), "file": str(draft_path),
            "size_bytes": draft_path.stat().st_size,
            "description": loaded.draft.description if loaded.draft else None},
        "params": {"lookaheads": bench_run.ks, "draft_p_min": bench_run.draft_p_min,
                   "max_tokens": bench_run.max_tokens, "prompt_kinds": bench_run.kinds,
                   "repeats": bench_run.repeats, "seed": bench_run.seed,
                   "prompts": len(bench_run.encoded),
                   "prompts_file": str(prompts_file) if prompts_file else None,
                   "chat": bench_run.use_chat, "n_ctx": loaded.target.n_ctx},
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpu": cpu_name(), "logical_cpus": os.cpu_count(),
                    "target_threads": loaded.target.n_threads,
                    "draft_threads": loaded.draft.n_threads if loaded.draft else None,
                    "gpu_offload": backend.supports_gpu_offload(),
                    "llama_cpp_python": backend.library_version(),
                    "llama_cpp_system_info": backend.system_info()},
    }


def _remembered_note(reports: list[Report]) -> Text:
    parts = []
    for report in reports:
        best = report.best()
        temperature = report.meta["params"]["temperature"]  # type: ignore[index]
        what = "-k 0 (the target alone)" if best is None else variant_name(best.lookahead)
        parts.append(f"{what} at T={temperature}")
    return Text("specgen run will now use " + " and ".join(parts) + " for these models on "
                "this machine, unless -k says otherwise", style="dim")


def _write_outputs(reports: list[Report], json_path: Path | None, csv_path: Path | None,
                   plot_path: Path | None) -> None:
    if json_path:
        body = reports[0].as_dict() if len(reports) == 1 else {
            "reports": [r.as_dict() for r in reports]}
        json_path.write_text(json.dumps(body, indent=2) + "\n")
    if csv_path:
        from specgen.bench import write_csv

        write_csv(reports, csv_path)
    if plot_path:
        from specgen.bench import write_plot

        write_plot(reports[-1], plot_path)
    for path in (json_path, csv_path, plot_path):
        if path:
            err.print(f"wrote {path}", style="dim", highlight=False)


def render(report: Report, pair: str | None, target: Path | None = None,
           draft: Path | None = None) -> Group:
    """The table, acceptance by position, speedup by kind of prompt, a chart, the verdict.

    Everything fits 80 columns, so a file or a pipe gets the whole table.
    """
    table = Table(title=f"specgen bench: {report.meta.get('title', '')}", title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
    for name in ("K", "tok/s", "speedup", "pred.", "alpha", "tok/cyc", "draft", "verify", "c"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_row("0", f"{report.baseline_tokens_per_second:.1f}", "1.00x", "1.00x", "-", "1.00",
                  "-", f"{report.target_ms_per_token:.1f}", "-")
    for row in report.per_k:
        style = "bold green" if row.lookahead == report.recommended else None
        table.add_row(
            str(row.lookahead), f"{row.tokens_per_second:.1f}", f"{row.speedup:.2f}x",
            _f(row.predicted_speedup, ".2f", "x"),
            _f(None if row.accept_rate is None else row.accept_rate * 100, ".0f", "%"),
            f"{row.tokens_per_cycle:.2f}", _f(row.draft_ms_per_token, ".1f"),
            f"{row.verify_ms:.1f}", _f(row.cost_ratio, ".2f"), style=style)
    parts: list[object] = [table, _positions(report)]
    adaptive = _adaptive_notes(report)
    if adaptive:
        parts.append(adaptive)
    if report.per_kind:
        parts.append(_kinds_table(report))
    parts.append(_chart(report))
    notes = [f"{variant_name(r.lookahead)}: {r.explanation}" for r in report.per_k
             if r.explanation]
    if notes:
        parts.append(Text("\n".join(notes), style="yellow"))
    if report.warning:
        parts.append(Text(f"warning: {report.warning}", style="bold red"))
    best = report.best()
    if report.note:
        parts.append(Text(report.note, style="yellow"))
    if best is not None:
        name = variant_name(best.lookahead)
        parts.append(Text.assemble(
            ("recommended: ", "bold"), (name, "bold green"),
            f" ({best.speedup:.2f}x the target alone; "
            f"{best.tokens_per_second:.1f} tok/s against {report.baseline_tokens_per_second:.1f})"))
        # One line however long, so a copy of it pastes as one command.
        command = (f"  specgen run {recommended_options(best.lookahead, pair, target, draft)}"
                   f"{_workers_option(report)}"
                   f"{_temperature_option(report)} \"Your prompt\"")
        parts.append(Text(command, no_wrap=True, overflow="ignore"))
    if _workers_option(report):
        parts.append(Text("the target runs on RPC workers: 'verify' and the K=0 row include the "
                          "network round trip; K was chosen against that cost", style="dim"))
    parts.append(Text("speedup: median of per-run ratios to the target alone on the same prompt; "
                      "draft: ms per guess; verify: ms per target pass; c: draft/target time "
                      "per token; pred.: E[tokens/cycle] / (K*c + verify/target) "
                      "(Leviathan et al. 2023); auto, ngram, hybrid choose K before each cycle",
                      style="dim"))
    return Group(*parts)  # type: ignore[arg-type]


def recommended_options(variant: Variant, pair: str | None, target: Path | None,
                        draft: Path | None) -> str:
    """The `specgen run` options that reproduce one bench row."""
    if pair:
        models = f"--pair {pair}"
    else:
        models = f"--target {shlex.quote(str(target))}"
        if draft is not None and variant != "ngram":
            models += f" --draft {shlex.quote(str(draft))}"
    if variant == "ngram":
        return f"{models} --draft ngram -k auto"
    if variant == "hybrid":
        return f"{models} --ngram -k auto"
    return f"{models} --no-ngram -k {variant}"


def _workers_option(report: Report) -> str:
    target = report.meta.get("target")
    workers = target.get("workers") if isinstance(target, dict) else None
    if not workers:
        return ""
    return f" --rpc {','.join(workers)}" + ("" if target.get("local_head", True)  # type: ignore[union-attr]
                                            else " --no-rpc-local-head")


def _temperature_option(report: Report) -> str:
    params = report.meta.get("params")
    temperature = params.get("temperature") if isinstance(params, dict) else None
    return f" --temperature {temperature:g}" if isinstance(temperature, float) else ""


def _f(value: float | None, spec: str, unit: str = "") -> str:
    return "-" if value is None else format(value, spec) + unit


def _positions(report: Report, shown: int = 12) -> Text:
    """Acceptance by position, one compact line per row: the first ``shown`` positions."""
    text = Text("acceptance by position, % (guess 1, 2, ...)\n", style="bold")
    for row in report.per_k:
        rates = row.position_accept_rates
        cells = " ".join(f"{r * 100:.0f}" for r in rates[:shown])
        more = " ..." if len(rates) > shown else ""
        text.append(f"  {str(row.lookahead):>6}  {cells or '-'}{more}\n")
    return text


def _adaptive_notes(report: Report) -> Text | None:
    """What the adaptive rows chose: their mean K, how often the target ran alone, n-gram use."""
    rows = [r for r in report.per_k if not isinstance(r.lookahead, int)]
    if not rows:
        return None
    text = Text("adaptive K\n", style="bold")
    for row in rows:
        line = (f"  {row.lookahead:>6}  mean K {_f(row.mean_lookahead, '.1f')}, target alone in "
                f"{row.target_alone_share:.0%} of cycles")
        if row.lookahead == "hybrid" and row.ngram_share is not None:
            line += f", {row.ngram_share:.0%} of guesses from n-grams"
        if 0 < row.paid_guesses < FEW_GUESSES:
            line += (f"; draft and c rest on {row.paid_guesses} draft-model "
                     f"guess{'es' if row.paid_guesses > 1 else ''}")
        text.append(line + "\n")
    return text


def _kinds_table(report: Report) -> Table:
    """Median speedup for each kind of prompt, one column per K or variant."""
    table = Table(title="speedup by kind of prompt", title_justify="left", box=box.SIMPLE_HEAD,
                  pad_edge=False, padding=(0, 1))
    table.add_column("kind", no_wrap=True)
    best_of = {kind: max(speedups.values(), default=0.0)
               for kind, speedups in report.per_kind.items()}
    for row in report.per_k:
        table.add_column(str(row.lookahead), justify="right", no_wrap=True)
    for kind, speedups in report.per_kind.items():
        cells = []
        for row in report.per_k:
            value = speedups.get(row.lookahead)
            cell = _f(value, ".2f")
            cells.append(f"[bold]{cell}[/]" if value and value == best_of[kind] else cell)
        table.add_row(kind, *cells)
    return table


def _chart(report: Report, width: int = 40) -> Text:
    """Speedup against K as horizontal bars: measured (#) and predicted (|)."""
    rows: list[tuple[object, float, float | None]] = [(0, 1.0, 1.0)]
    rows += [(r.lookahead, r.speedup, r.predicted_speedup) for r in report.per_k]
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
