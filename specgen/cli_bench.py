"""``specgen bench``: the K sweep on the user's own machine, rendered as a table and a chart."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console, Group
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from specgen.bench import Report
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
    lookaheads: Annotated[str, typer.Option("--lookahead", "-k", help="The K values to sweep, "
                                            "comma-separated (K=0, the target alone, always "
                                            "runs).")] = "1,2,3,4,6,8",
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
    from specgen.bench import BUILTIN_PROMPTS, load_prompts, parse_lookaheads, summarize, sweep
    from specgen.core.sampling import SamplingParams
    from specgen.engine import Finished, GenerationConfig, Stats
    from specgen.errors import UserError
    from specgen.registry import Registry, resolve
    from specgen.session import PairOptions, choose, load_pair, prompt_tokens

    ks = parse_lookaheads(lookaheads)
    prompts = load_prompts(prompts_file) if prompts_file else BUILTIN_PROMPTS
    choice = choose(Registry.load(), pair, target, draft)
    if choice.draft is None:
        raise UserError("bench needs a draft: name a pair, or both --target and --draft")
    target_path, draft_path = resolve(choice.target), resolve(choice.draft)
    loaded = load_pair(target_path, draft_path, PairOptions(
        n_ctx=ctx_size, target_threads=threads, draft_threads=threads,
        target_gpu_layers=gpu_layers, draft_gpu_layers=gpu_layers, verbose=verbose))
    encoded = [prompt_tokens(loaded.target, p, choice.chat) for p in prompts]
    sampling = SamplingParams(temperature=temperature)
    base_seed = seed if seed is not None else 0
    engine = loaded.engine()

    def run_one(prompt: int, k: int, run_seed: int) -> Stats:
        config = GenerationConfig(lookahead=k, sampling=sampling, max_tokens=max_tokens,
                                  seed=run_seed, draft_p_min=draft_p_min)
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
    report = summarize(runs)
    report.meta = {
        "title": f"{choice.pair.name if choice.pair else target_path.name}, "
                 f"{loaded.target.n_threads} threads, T={temperature}",
        "pair": choice.pair.name if choice.pair else None,
        "target": {"spec": choice.target.label(), "file": str(target_path),
                   "size_bytes": target_path.stat().st_size,
                   "description": loaded.target.description},
        "draft": {"spec": choice.draft.label(), "file": str(draft_path),
                  "size_bytes": draft_path.stat().st_size,
                  "description": loaded.draft.description if loaded.draft else None},
        "params": {"lookaheads": ks, "draft_p_min": draft_p_min, "max_tokens": max_tokens,
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
    out.print(render(report, choice.pair.name if choice.pair else None))
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


def _f(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render(report: Report, pair: str | None) -> Group:
    """The table, a small chart of speedup against K, and the recommendation."""
    table = Table(title=f"specgen bench: {report.meta.get('title', '')}", title_justify="left")
    for name, justify in (("K", "right"), ("tok/s", "right"), ("speedup", "right"),
                          ("pred.", "right"), ("alpha", "right"), ("tok/cyc", "right"),
                          ("alpha by pos. %", "left"), ("draft ms", "right"),
                          ("verify ms", "right"), ("c", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    table.add_row("0", f"{report.baseline_tokens_per_second:.1f}", "1.00x", "1.00x", "-", "1.00",
                  "-", "-", f"{report.target_ms_per_token:.1f}", "-")
    for row in report.per_k:
        style = "bold green" if row.lookahead == report.recommended else None
        table.add_row(
            str(row.lookahead), f"{row.tokens_per_second:.1f}", f"{row.speedup:.2f}x",
            _f(row.predicted_speedup, ".2f") + "x",
            _f(None if row.accept_rate is None else row.accept_rate * 100, ".0f") + "%",
            f"{row.tokens_per_cycle:.2f}",
            " ".join(f"{r * 100:.0f}" for r in row.position_accept_rates),
            _f(row.draft_ms_per_token, ".1f"), f"{row.verify_ms:.1f}",
            _f(row.cost_ratio, ".2f"), style=style)
    parts: list[object] = [table, _chart(report)]
    notes = [f"K={r.lookahead}: {r.explanation}" for r in report.per_k if r.explanation]
    if notes:
        parts.append(Text("\n".join(notes), style="yellow"))
    if report.warning:
        parts.append(Text(f"warning: {report.warning}", style="bold red"))
    best = report.best()
    if best is not None:
        target = f"--pair {pair}" if pair else "--target ... --draft ..."
        parts.append(Text.assemble(
            ("recommended: ", "bold"), (f"K={best.lookahead}", "bold green"),
            f" ({best.speedup:.2f}x the target alone; "
            f"{best.tokens_per_second:.1f} tok/s against {report.baseline_tokens_per_second:.1f})"
            f"\n  specgen run {target} -k {best.lookahead} \"...\""))
    parts.append(Text("speedup: median of per-run ratios to the target alone on the same prompt; "
                      "predicted: E[tokens/cycle] / (K*c + verify/target), c = draft/target "
                      "time per token", style="dim"))
    return Group(*parts)  # type: ignore[arg-type]


def _chart(report: Report, width: int = 40) -> Text:
    """Speedup against K as horizontal bars: measured (#) and predicted (|)."""
    rows = [(0, 1.0, 1.0)] + [(r.lookahead, r.speedup, r.predicted_speedup)
                               for r in report.per_k]
    top = max(max(m, p or 0) for _, m, p in rows) or 1.0
    chart = Text("speedup against K (# measured, | predicted)\n", style="bold")
    for k, measured, predicted in rows:
        bar = ["#" if i < round(measured / top * width) else " " for i in range(width + 1)]
        if predicted is not None:
            bar[min(width, round(predicted / top * width))] = "|"
        chart.append(f"K={k:<2} ")
        chart.append("".join(bar), style="green" if k else "dim")
        chart.append(f" {measured:.2f}x\n")
    return chart
