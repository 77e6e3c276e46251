"""A bench's reports written out: JSON (every figure and the setting), CSV (the per-K table),
and a PNG chart of speedup against K (needs ``specgen[plot]``)."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path

from specgen.bench.report import Report
from specgen.errors import UserError

CSV_FIELDS = [
    "temperature",
    "lookahead",
    "tokens_per_second",
    "speedup",
    "predicted_speedup",
    "disagreement",
    "accept_rate",
    "tokens_per_cycle",
    "predicted_tokens_per_cycle",
    "draft_ms_per_token",
    "verify_ms",
    "cost_ratio",
    "verify_ratio",
    "position_accept_rates",
    "explanation",
]


def write_json(reports: Sequence[Report], path: Path) -> None:
    """One report as it is, or ``{"reports": [...]}`` for several sampling settings."""
    body = (
        reports[0].as_dict() if len(reports) == 1 else {"reports": [r.as_dict() for r in reports]}
    )
    path.write_text(json.dumps(body, indent=2) + "\n")


def write_csv(reports: Sequence[Report], path: Path) -> None:
    """One row per K (or variant) and sampling setting; the header on line 1, nothing else:
    the metadata is in the JSON."""
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(CSV_FIELDS)
        for report in reports:
            for row in report.per_k:
                record = {**row.as_dict(), "temperature": report.temperature}
                values = []
                for key in CSV_FIELDS:
                    value = record[key]
                    if isinstance(value, list):
                        value = ";".join(f"{v:.4f}" for v in value)
                    elif isinstance(value, float):
                        value = f"{value:.4f}"
                    values.append("" if value is None else value)
                writer.writerow(values)


def write_plot(report: Report, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise UserError("--plot needs matplotlib: pip install 'specgen[plot]'") from err
    fixed = [r for r in report.per_k if isinstance(r.variant, int)]
    ks = [0] + [int(r.variant) for r in fixed]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    ax.plot(ks, [1.0] + [r.speedup for r in fixed], "o-", label="measured")
    ax.plot(
        ks,
        [1.0] + [r.predicted_speedup or float("nan") for r in fixed],
        "s--",
        label="predicted (Leviathan et al. 2023)",
    )
    for row, style in zip(
        (r for r in report.per_k if not isinstance(r.variant, int)), (":", "-.", (0, (5, 1)))
    ):
        ax.axhline(
            row.speedup, ls=style, color="tab:green", lw=1, label=f"{row.variant} (adaptive K)"
        )
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("lookahead K (0 = target alone)")
    ax.set_ylabel("speedup over the target alone")
    ax.set_xticks(ks)
    ax.set_title(report.title or "specgen bench", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
