"""``specgen bench``: sweep the lookahead K, measure the target alone beside it, explain, choose.

The sweep interleaves runs (K=0, K1, K2, ... for a prompt, then the next prompt, then again) so a
machine whose speed drifts does not bias the ratios, and every run starts from empty caches. The
report compares what was measured with the seed's model of the speedup:

    E[tokens per cycle] = (1 - alpha^(K+1)) / (1 - alpha)
    cost of a cycle     = K * c + v(K)       (in units of one target step)
    predicted speedup   = E[tokens per cycle] / cost of a cycle

where c = draft time per token / target time per token, and v(K) = time of the target's verify
pass over K+1 tokens / target time per token, all measured in the same run. This module is pure:
it drives a ``run_one`` callable and reads the ``Stats`` it returns, so tests feed it fakes.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specgen.core.speculative import expected_tokens
from specgen.engine import Stats
from specgen.errors import UserError

DISAGREEMENT = 0.15

BUILTIN_PROMPTS = [
    "Explain in a few sentences why the sky is blue.",
    "What are the main differences between a list and a tuple in Python?",
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "Write a SQL query that finds the ten customers with the highest total order value.",
    "Summarize this passage in two sentences: The printing press, developed by Johannes "
    "Gutenberg around 1440, made books cheaper and faster to produce. Ideas spread across "
    "Europe within years instead of decades, literacy rose, and the Reformation and the "
    "scientific revolution both owed much to pamphlets and journals that could be printed in "
    "thousands of copies.",
    "Rewrite this sentence in a formal tone: hey, the meeting got moved to friday, can u make it?",
    "List ten countries in Europe and their capital cities.",
    "Give a step-by-step recipe for a simple tomato soup.",
    "Write the opening paragraph of a story about a lighthouse keeper who finds a message in a "
    "bottle.",
    "Translate to French: The train leaves at eight o'clock tomorrow morning.",
]


def load_prompts(path: Path) -> list[str]:
    """One prompt per line, or JSON lines with a "prompt" field; blank lines are skipped."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise UserError(f"cannot read prompts from {path}: {err.strerror}") from err
    prompts = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise UserError(f"{path}, line {number}: not valid JSON ({err.msg})") from err
            if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
                raise UserError(f"{path}, line {number}: a JSON line needs a \"prompt\" string")
            prompts.append(record["prompt"])
        else:
            prompts.append(line.replace("\\n", "\n"))
    if not prompts:
        raise UserError(f"{path} holds no prompts")
    return prompts


def parse_lookaheads(text: str) -> list[int]:
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError as err:
        raise UserError(f"-k takes numbers separated by commas, like 1,2,4,8 (got {text!r})")\
            from err
    values = [v for v in values if v != 0]
    if not values or min(values) < 0 or max(values) > 64:
        raise UserError("-k needs at least one K from 1 to 64 (the target alone always runs)")
    return values


@dataclass(frozen=True)
class Run:
    """One measured generation."""

    lookahead: int
    prompt: int
    repeat: int
    stats: Stats

    @property
    def tokens_per_second(self) -> float:
        return self.stats.n_generated / self.stats.gen_seconds if self.stats.gen_seconds else 0.0


RunOne = Callable[[int, int, int], Stats]  # (prompt index, K, seed) -> finished Stats


def sweep(run_one: RunOne, n_prompts: int, lookaheads: Sequence[int], repeats: int, seed: int,
          on_run: Callable[[int, int, int], None] | None = None, warmup: bool = True
          ) -> list[Run]:
    """Every prompt at K=0 and each K, interleaved, ``repeats`` times; a warm-up run first."""
    ks = [0, *lookaheads]
    if warmup:
        run_one(0, max(ks), seed)
    runs = []
    for repeat in range(repeats):
        for prompt in range(n_prompts):
            for k in ks:
                if on_run:
                    on_run(repeat, prompt, k)
                runs.append(Run(k, prompt, repeat, run_one(prompt, k, seed + repeat)))
    return runs


@dataclass
class KReport:
    """Everything measured and predicted for one K."""

    lookahead: int
    tokens_per_second: float
    speedup: float
    accept_rate: float | None
    position_accept_rates: list[float]
    tokens_per_cycle: float
    draft_ms_per_token: float | None
    verify_ms: float
    cost_ratio: float | None
    verify_ratio: float
    predicted_tokens_per_cycle: float | None
    predicted_speedup: float | None
    explanation: str = ""

    @property
    def disagreement(self) -> float | None:
        if self.predicted_speedup is None or not self.speedup:
            return None
        return self.predicted_speedup / self.speedup - 1.0


@dataclass
class Report:
    target_ms_per_token: float
    baseline_tokens_per_second: float
    per_k: list[KReport]
    recommended: int | None
    warning: str = ""
    runs: int = 0
    meta: dict[str, object] = field(default_factory=dict)

    def best(self) -> KReport | None:
        return next((r for r in self.per_k if r.lookahead == self.recommended), None)

    def as_dict(self) -> dict[str, object]:
        rows = []
        for row in self.per_k:
            record = asdict(row)
            record["disagreement"] = row.disagreement
            rows.append(record)
        return {"meta": self.meta, "target_ms_per_token": self.target_ms_per_token,
                "baseline_tokens_per_second": self.baseline_tokens_per_second,
                "recommended_lookahead": self.recommended, "warning": self.warning,
                "runs": self.runs, "per_k": rows}


def _pooled(runs: Iterable[Run], attr: str) -> float:
    return float(sum(getattr(r.stats, attr) for r in runs))


def summarize(runs: Sequence[Run]) -> Report:
    """Medians, pooled rates, the fitted costs, the prediction, and the verdict."""
    base = [r for r in runs if r.lookahead == 0]
    if not base:
        raise ValueError("a sweep needs target-alone runs (K=0)")
    base_by_key = {(r.prompt, r.repeat): r for r in base}
    target_one = _pooled(base, "target_seconds") / max(_pooled(base, "n_cycles"), 1)
    baseline_tps = statistics.median(r.tokens_per_second for r in base)
    per_k = []
    for k in sorted({r.lookahead for r in runs if r.lookahead}):
        mine = [r for r in runs if r.lookahead == k]
        ratios = [r.tokens_per_second / base_by_key[(r.prompt, r.repeat)].tokens_per_second
                  for r in mine if base_by_key[(r.prompt, r.repeat)].tokens_per_second > 0]
        drafted, accepted = _pooled(mine, "n_drafted"), _pooled(mine, "n_accepted")
        judged = accepted + _pooled(mine, "n_rejected")
        alpha = accepted / judged if judged else None
        cycles = _pooled(mine, "n_cycles")
        positions = [sum(r.stats.accepted_at[i] for r in mine if i < len(r.stats.accepted_at)) /
                     max(1, sum(r.stats.reached_at[i] for r in mine
                                if i < len(r.stats.reached_at)))
                     for i in range(k)]
        draft_per_token = _pooled(mine, "draft_seconds") / drafted if drafted else None
        verify = _pooled(mine, "target_seconds") / max(cycles, 1)
        cost_ratio = draft_per_token / target_one if draft_per_token is not None else None
        verify_ratio = verify / target_one
        # Cycles cut short by the token budget draft fewer than K guesses: use the mean drafted.
        k_eff = drafted / cycles if cycles else k
        predicted_tpc = expected_tokens(alpha, k) if alpha is not None else None
        predicted = (predicted_tpc / (k_eff * cost_ratio + verify_ratio)
                     if predicted_tpc is not None and cost_ratio is not None else None)
        row = KReport(
            lookahead=k,
            tokens_per_second=statistics.median(r.tokens_per_second for r in mine),
            speedup=statistics.median(ratios) if ratios else 0.0,
            accept_rate=alpha, position_accept_rates=positions,
            tokens_per_cycle=_pooled(mine, "n_generated") / max(cycles, 1),
            draft_ms_per_token=None if draft_per_token is None else draft_per_token * 1000,
            verify_ms=verify * 1000, cost_ratio=cost_ratio, verify_ratio=verify_ratio,
            predicted_tokens_per_cycle=predicted_tpc, predicted_speedup=predicted,
        )
        row.explanation = _explain(row, mine, base)
        per_k.append(row)
    best = max(per_k, key=lambda r: r.speedup, default=None)
    warning = ""
    if best is None or best.speedup <= 1.0:
        warning = ("no K beat the target alone on this machine: this pair is not worth "
                   "speculating on here (run with -k 0, or try a smaller draft)")
    return Report(target_ms_per_token=target_one * 1000, baseline_tokens_per_second=baseline_tps,
                  per_k=per_k, recommended=best.lookahead if best and not warning else None,
                  warning=warning, runs=len(runs))


def _explain(row: KReport, mine: Sequence[Run], base: Sequence[Run]) -> str:
    """Where prediction and measurement part by more than 15%, the cost that explains it."""
    gap = row.disagreement
    if gap is None or abs(gap) <= DISAGREEMENT:
        return ""
    # Three places the model can be off: tokens per cycle, time outside the two models, and
    # the target's speed outside the verify pass (the baseline's own overhead).
    tpc_gap = (row.predicted_tokens_per_cycle or 0) / row.tokens_per_cycle - 1
    overhead = 1 - (_pooled(mine, "draft_seconds") + _pooled(mine, "target_seconds")) / \
        max(_pooled(mine, "gen_seconds"), 1e-9)
    base_overhead = 1 - _pooled(base, "target_seconds") / max(_pooled(base, "gen_seconds"), 1e-9)
    causes = {
        "tokens per cycle": (abs(tpc_gap),
                             f"the formula expects {row.predicted_tokens_per_cycle:.2f} tokens "
                             f"per cycle but {row.tokens_per_cycle:.2f} came, because guesses "
                             f"do not survive independently with one alpha (by position: "
                             f"{_rates(row.position_accept_rates)}): "
                             + ("easy stretches are accepted whole, hard ones fail early"
                                if tpc_gap < 0 else "later guesses survive less often")),
        "overhead": (abs(overhead - base_overhead),
                     f"{overhead:.0%} of speculative time is spent outside the two models "
                     f"(sampling, text, rollback) against {base_overhead:.0%} for the target "
                     f"alone"),
    }
    _, (_, text) = max(causes.items(), key=lambda item: item[1][0])
    direction = "over" if gap > 0 else "under"
    return f"model {direction}estimates by {abs(gap):.0%}: {text}"


def _rates(rates: Sequence[float]) -> str:
    return ", ".join(f"{r:.0%}" for r in rates)


# -- output -----------------------------------------------------------------------------------

CSV_FIELDS = ["lookahead", "tokens_per_second", "speedup", "predicted_speedup", "disagreement",
              "accept_rate", "tokens_per_cycle", "predicted_tokens_per_cycle",
              "draft_ms_per_token", "verify_ms", "cost_ratio", "verify_ratio",
              "position_accept_rates", "explanation"]


def write_csv(report: Report, path: Path) -> None:
    import csv

    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["# " + json.dumps(report.meta, sort_keys=True)])
        writer.writerow(["# target_ms_per_token", f"{report.target_ms_per_token:.4f}",
                         "baseline_tokens_per_second", f"{report.baseline_tokens_per_second:.4f}",
                         "recommended_lookahead", report.recommended])
        writer.writerow(CSV_FIELDS)
        for row in report.as_dict()["per_k"]:  # type: ignore[union-attr]
            values = []
            for key in CSV_FIELDS:
                value = row[key]
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
    ks = [0] + [r.lookahead for r in report.per_k]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    ax.plot(ks, [1.0] + [r.speedup for r in report.per_k], "o-", label="measured")
    ax.plot(ks, [1.0] + [r.predicted_speedup or float("nan") for r in report.per_k], "s--",
            label="predicted (seed's formula)")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("lookahead K (0 = target alone)")
    ax.set_ylabel("speedup over the target alone")
    ax.set_xticks(ks)
    ax.set_title(str(report.meta.get("title", "specgen bench")), fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
