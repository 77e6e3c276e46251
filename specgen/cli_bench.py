"""``specgen bench``: the K sweep on the user's own machine, rendered as a table and a chart."""

from __future__ import annotations

import json
import os
import platform
import shlex
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.console import Console, Group
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from specgen.bench import DEFAULT_VARIANTS, Report, Variant
from specgen.options import (
    CtxOpt,
    DraftOpt,
    DraftPMinOpt,
    GpuLayersOpt,
    PairOpt,
    SeedOpt,
    TargetOpt,
    ThreadsOpt,
    VerboseOpt,
)

out = Console()
err = Console(stderr=True)


def bench(
    pair: PairOpt = None,
    target: TargetOpt = None,
    draft: DraftOpt = None,
    lookaheads: Annotated[str, typer.Option(
        "--lookahead", "-k", help="What to measure, comma-separated: fixed K's of the draft "
        "model, 'auto' (the draft model, K chosen each cycle), 'ngram' (prompt lookup alone) "
        "and 'hybrid' (both); K=0, the target alone, always runs.")] = DEFAULT_VARIANTS,
    draft_p_min: DraftPMinOpt = 0.0,
    prompts_file: Annotated[Path | None, typer.Option(
        "--prompts", help="Prompts, one per line or JSON lines with a \"prompt\" field "
        "(default: a built-in set of ten).", show_default=False)] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", "-n", min=4,
                                            help="New tokens per run.")] = 64,
    repeats: Annotated[int, typer.Option("--repeats", "-r", min=1,
                                         help="Times to run the whole sweep.")] = 1,
    temperature: Annotated[float, typer.Option("--temperature", "--temp",
                                               help="Sampling temperature; 0 is greedy.")] = 0.0,
    seed: SeedOpt = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write every figure, the "
                                                   "machine and the parameters as JSON here.",
                                                   show_default=False)] = None,
    csv_path: Annotated[Path | None, typer.Option("--csv", help="Write the per-K table as CSV "
                                                  "here.", show_default=False)] = None,
    plot_path: Annotated[Path | None, typer.Option("--plot", help="Write a PNG chart of speedup "
                                                   "against K (needs specgen[plot]).",
                                                   show_default=False)] = None,
    threads: ThreadsOpt = 0,
    gpu_layers: GpuLayersOpt = -1,
    ctx_size: CtxOpt = 0,
    verbose: VerboseOpt = False,
) -> None:
    """Measure the pair on this machine: sweep K, compare with the target alone, recommend K."""
    from specgen import backend
    from specgen.bench import (
        BUILTIN_KINDS,
        BUILTIN_PROMPTS,
        load_prompts,
        parse_lookaheads,
        summarize,
        sweep,
    )
    from specgen.core.sampling import SamplingParams
    from specgen.engine import Finished, GenerationConfig, Stats
    from specgen.errors import UserError
    from specgen.lookahead import Costs
    from specgen.registry import Registry, resolve
    from specgen.session import PairOptions, bench_engines, choose, load_pair, prompt_tokens

    ks = parse_lookaheads(lookaheads)
    if prompts_file:
        prompts, kinds = load_prompts(prompts_file), None
    else:
        prompts, kinds = BUILTIN_PROMPTS, BUILTIN_KINDS
    choice = choose(Registry.load(), pair, target, draft)
    if choice.draft is None:
        if lookaheads == DEFAULT_VARIANTS:
            ks = ["ngram"]  # a target alone can still draft by prompt lookup
        elif any(k != "ngram" for k in ks):
            raise UserError("bench needs a draft model for K's, auto and hybrid: name a pair, "
                            "or both --target and --draft (or -k ngram)")
    target_path = resolve(choice.target)
    draft_path = resolve(choice.draft) if choice.draft else None
    loaded = load_pair(target_path, draft_path, PairOptions(
        n_ctx=ctx_size, target_threads=threads, draft_threads=threads,
        target_gpu_layers=gpu_layers, draft_gpu_layers=gpu_layers, verbose=verbose))
    encoded = [prompt_tokens(loaded.target, p, choice.chat) for p in prompts]
    sampling = SamplingParams(temperature=temperature)
    base_seed = seed if seed is not None else 0
    engines = bench_engines(loaded, draft_p_min)

    def run_one(prompt: int, k: Variant, run_seed: int) -> Stats:
        engine = engines["alone" if k == 0 else k if isinstance(k, str) else "model"]
        # Each run learns its costs afresh, as `specgen run` does in a new process.
        engine.costs = Costs()
        config = GenerationConfig(lookahead="auto" if isinstance(k, str) else k,
                                  sampling=sampling, max_tokens=max_tokens, seed=run_seed)
        for event in engine.generate(encoded[prompt], config):
            if isinstance(event, Finished):
                return event.stats
        raise AssertionError("the engine always finishes")

    total = repeats * len(prompts) * (len(ks) + 1)
    progress = Progress(TextColumn("[bold]bench[/] {task.description}"), BarColumn(),
                        MofNCompleteColumn(), TimeRemainingColumn(), console=err,
                        transient=True)
    with progress:
        task = progress.add_task("warm-up", total=total)

        def on_run(repeat: int, prompt: int, k: int) -> None:
            if progress.tasks[task].description != "warm-up":
                progress.advance(task)
            progress.update(task, description=f"prompt {prompt + 1}/{len(prompts)} K={k}"
                            + (f" repeat {repeat + 1}" if repeats > 1 else ""))

        runs = sweep(run_one, len(prompts), ks, repeats, base_seed, on_run)
        progress.advance(task)
    report = summarize(runs, kinds)
    report.meta = {
        "title": f"{choice.pair.name if choice.pair else target_path.name}, "
                 f"{loaded.target.n_threads} threads, T={temperature}",
        "pair": choice.pair.name if choice.pair else None,
        "target": {"spec": choice.target.label(), "file": str(target_path),
                   "size_bytes": target_path.stat().st_size,
                   "description": loaded.target.description},
        "draft": None if draft_path is None or choice.draft is None else {
            "spec": choice.draft.label(), "file": str(draft_path),
            "size_bytes": draft_path.stat().st_size,
            "description": loaded.draft.description if loaded.draft else None},
        "params": {"lookaheads": ks, "draft_p_min": draft_p_min, "max_tokens": max_tokens,
                   "prompt_kinds": kinds,
                   "repeats": repeats,
                   "temperature": temperature, "seed": base_seed, "prompts": len(prompts),
                   "prompts_file": str(prompts_file) if prompts_file else None,
                   "chat": choice.chat, "n_ctx": loaded.target.n_ctx},
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpu": _cpu_name(), "logical_cpus": os.cpu_count(),
                    "target_threads": loaded.target.n_threads,
                    "draft_threads": loaded.draft.n_threads if loaded.draft else None,
                    "gpu_offload": backend.supports_gpu_offload(),
                    "llama_cpp_python": backend.library_version(),
                    "llama_cpp_system_info": backend.system_info()},
    }
    out.print(render(report, choice.pair.name if choice.pair else None, target_path,
                     draft_path))
    if json_path:
        json_path.write_text(json.dumps(report.as_dict(), indent=2) + "\n")
    if csv_path:
        from specgen.bench import write_csv

        write_csv(report, csv_path)
    if plot_path:
        from specgen.bench import write_plot

        write_plot(report, plot_path)
    for path in (json_path, csv_path, plot_path):
        if path:
            err.print(f"wrote {path}", style="dim", highlight=False)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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
    notes = [f"K={r.lookahead}: {r.explanation}" for r in report.per_k if r.explanation]
    if notes:
        parts.append(Text("\n".join(notes), style="yellow"))
    if report.warning:
        parts.append(Text(f"warning: {report.warning}", style="bold red"))
    best = report.best()
    if best is not None:
        name = f"K={best.lookahead}" if isinstance(best.lookahead, int) else best.lookahead
        parts.append(Text.assemble(
            ("recommended: ", "bold"), (name, "bold green"),
            f" ({best.speedup:.2f}x the target alone; "
            f"{best.tokens_per_second:.1f} tok/s against {report.baseline_tokens_per_second:.1f})"
            f"\n  specgen run {recommended_options(best.lookahead, pair, target, draft)} "
            f"\"...\""))
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
