"""``specgen bench`` as a library: sweep the ways of drafting on the user's own machine, measure
the target alone beside them, explain the figures, recommend one.

- ``sweep``: the interleaved runs; ``runner``: the session that runs them on a loaded pair;
- ``report``: the figures against the expected-tokens model, and the verdict;
- ``prompts``: the built-in prompts and prompt files;
- ``export``: JSON, CSV and a chart.

The CLI (``specgen.cli_bench``) only renders a report and shows progress; what bench found is
remembered for ``run`` and ``serve`` in ``specgen.memo``.
"""

from __future__ import annotations

from specgen.bench.export import CSV_FIELDS, write_csv, write_json, write_plot
from specgen.bench.prompts import BUILTIN, BUILTIN_KINDS, BUILTIN_PROMPTS, load_prompts
from specgen.bench.report import (
    ADAPTS,
    FEW_GUESSES,
    BenchSetting,
    KReport,
    Report,
    summarize,
)
from specgen.bench.runner import BenchSession, SweepWatcher, sampling_at, sampling_params
from specgen.bench.sweep import (
    ADAPTIVE_VARIANTS,
    DEFAULT_VARIANTS,
    Run,
    Variant,
    parse_lookaheads,
    sweep,
    variant_name,
)

__all__ = ["ADAPTIVE_VARIANTS", "ADAPTS", "BUILTIN", "BUILTIN_KINDS", "BUILTIN_PROMPTS",
           "CSV_FIELDS", "DEFAULT_VARIANTS", "FEW_GUESSES", "BenchSession", "BenchSetting",
           "KReport", "Report", "Run", "SweepWatcher", "Variant", "load_prompts",
           "parse_lookaheads", "sampling_at", "sampling_params", "summarize", "sweep",
           "variant_name", "write_csv", "write_json", "write_plot"]
