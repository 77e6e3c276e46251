"""A bench's report as a person sees it: the table, acceptance by position, the adaptive rows,
speedup by kind of prompt, a chart and the verdict with the command to use it, all within 80
columns, so a file or a pipe gets the whole of it (Rich renderables; ``cli_bench`` prints them).
"""

from __future__ import annotations

from pathlib import Path

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from specgen.bench.report import FEW_GUESSES, Report
from specgen.cli.output import figure
from specgen.session.memo import Variant, variant_name, variant_options


def render(
    report: Report,
    pair: str | None,
    target: Path | None = None,
    draft: Path | None = None,
    mtp: bool = False,
    ran_with: str = "",
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
            f"{row.variant}!" if row.disturbed else str(row.variant),
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
    marked = [r for r in report.per_k if r.disturbed]
    if marked:
        parts.append(
            Text(
                "! disturbed: other processes kept the CPUs busy during "
                + ", ".join(f"{r.disturbed} runs of {variant_name(r.variant)}" for r in marked)
                + " (or their target-alone runs); not recommended from",
                style="yellow",
            )
        )
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
            f"  specgen run {variant_options(best.variant, pair, target, draft, mtp)}"
            f"{_workers_option(report)}{ran_with}"
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
        if row.variant in ("hybrid", "cache") and row.ngram_share is not None:
            line += f", {row.ngram_share:.0%} of guesses from n-grams"
        if row.variant == "cache" and row.cache_share is not None:
            line += f", {row.cache_share:.0%} from earlier prompts"
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


def remembered_note(reports: list[Report]) -> Text:
    """What `specgen run` will use from now on, said once a whole bench is done."""
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
