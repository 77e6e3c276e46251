"""What a sweep measured, against the expected-tokens model of the speedup, and the verdict.

The model (Leviathan et al. 2023; Chen et al. 2023):

    E[tokens per cycle] = (1 - alpha^(K+1)) / (1 - alpha)
    cost of a cycle     = K * c + v(K)       (in units of one target step)
    predicted speedup   = E[tokens per cycle] / cost of a cycle

where c = draft time per token / target time per token, and v(K) = time of the target's verify
pass over K+1 tokens / target time per token, all measured in the same run. Pure: it reads the
``Stats`` of the runs, so tests feed it fakes.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field

from specgen.bench.sweep import Run, variant_order
from specgen.core.speculative import expected_tokens, predicted_speedup
from specgen.host.machine import BUSY_FROM
from specgen.session.memo import Finding, Variant, variant_name

# Where the model's prediction and the measured speedup part by more than this share, the
# report names the cost that explains it.
DISAGREEMENT = 0.15
# The rows that adapt to the text as it goes, the most general first: one of them is the
# recommendation unless another row beats it beyond the noise of the runs (a fixed K, or prompt
# lookup alone, that won on these prompts may lose on the user's own text).
ADAPTS = ("hybrid", "auto")
# An adaptive row whose draft model made fewer guesses than this (auto's explorations where the
# draft cannot pay) says so: its draft and c rest on them, and a first decode runs cold.
FEW_GUESSES = 20
# Beyond the noise: over at least MIN_PAIRED runs, the mean of the log speed ratios run by run
# (same prompt, same repeat) is more than NOISE_SE standard errors above 0. Sampled runs draw
# other texts, and a busy machine slows a run by 10% and more, so a median over a few prompts
# can name a row that is not faster.
NOISE_SE, MIN_PAIRED = 2.0, 3


@dataclass
class KReport:
    """Everything measured and predicted for one row: a K, or one adaptive variant."""

    variant: Variant
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
    mean_lookahead: float | None = None
    target_alone_share: float = 0.0
    ngram_share: float | None = None
    cache_share: float | None = None  # guesses from the suffix cache (earlier requests)
    forced_share: float | None = None  # guesses a grammar forced (free; never rejected)
    # The loop's own host time outside the models' decodes, of generation time (None: unknown)
    host_share: float | None = None
    model_guesses: int = 0  # guesses of a draft model (not n-gram ones): what draft and c rest on
    # Runs of this row (or their target-alone partner) that other processes' load disturbed:
    # a row with any is shown marked and never recommended.
    disturbed: int = 0

    @property
    def disagreement(self) -> float | None:
        if self.predicted_speedup is None or not self.speedup:
            return None
        return self.predicted_speedup / self.speedup - 1.0

    def as_dict(self) -> dict[str, object]:
        """The row as JSON names it (``lookahead`` for the variant, ``paid_guesses``)."""
        names = {"variant": "lookahead", "model_guesses": "paid_guesses"}
        record = {names.get(k, k): v for k, v in asdict(self).items()}
        record["disagreement"] = self.disagreement
        return record


@dataclass(frozen=True)
class BenchSetting:
    """What a bench ran on and with: the models, its parameters, the machine (JSON ``meta``)."""

    name: str
    pair: str | None
    target: dict[str, object]
    draft: dict[str, object] | None
    params: dict[str, object]
    machine: dict[str, object]
    workers: tuple[str, ...] = ()
    local_head: bool = True


@dataclass
class Report:
    target_ms_per_token: float
    baseline_tokens_per_second: float
    per_k: list[KReport]
    recommended: Variant | None
    warning: str = ""
    # Why the recommendation is not the fastest row (it did not win beyond the noise).
    note: str = ""
    runs: int = 0
    # kind of prompt -> K or variant -> median speedup over that kind's prompts
    per_kind: dict[str, dict[Variant, float]] = field(default_factory=dict)
    # prompt index -> K or variant -> median speedup over the repeats
    per_prompt: list[dict[Variant, float]] = field(default_factory=list)
    # The sampling measured: its temperature (None: not said) and, when sampled, the rest.
    temperature: float | None = None
    sampling: dict[str, object] = field(default_factory=dict)
    title: str = ""
    partial: bool = False  # cut short by Ctrl-C
    setting: BenchSetting | None = None
    disturbed_runs: int = 0  # runs during which other processes kept CPUs busy

    def best(self) -> KReport | None:
        return next((r for r in self.per_k if r.variant == self.recommended), None)

    def finding(self) -> Finding:
        """What this report found best, as the bench memo keeps it."""
        best, temperature = self.best(), self.temperature or 0.0
        if best is None:
            return Finding(temperature)
        return Finding(temperature, best.variant, best.speedup, best.cost_ratio)

    def meta(self) -> dict[str, object]:
        """What the report was measured on and with, as the JSON's ``meta``."""
        if self.setting is None:
            return {}
        s = self.setting
        return {
            "name": s.name,
            "pair": s.pair,
            "target": s.target,
            "draft": s.draft,
            "params": {**s.params, **self.sampling},
            "machine": s.machine,
            "title": self.title,
            "partial": self.partial,
        }

    def as_dict(self) -> dict[str, object]:
        return {
            "meta": self.meta(),
            "target_ms_per_token": self.target_ms_per_token,
            "baseline_tokens_per_second": self.baseline_tokens_per_second,
            "recommended_lookahead": self.recommended,
            "warning": self.warning,
            "note": self.note,
            "runs": self.runs,
            "per_k": [row.as_dict() for row in self.per_k],
            "per_kind": {
                kind: {str(v): x for v, x in speedups.items()}
                for kind, speedups in self.per_kind.items()
            },
            "per_prompt": [
                {str(v): x for v, x in speedups.items()} for speedups in self.per_prompt
            ],
        }


def _pooled(runs: Iterable[Run], attr: str) -> float:
    return float(sum(getattr(r.stats, attr) for r in runs))


def summarize(runs: Sequence[Run], kinds: Sequence[str] | None = None) -> Report:
    """Medians, pooled rates, the fitted costs, the prediction, and the verdict.

    ``kinds`` names each prompt's kind (by prompt index) for the per-kind speedups.
    """
    base = [r for r in runs if r.variant == 0]
    if not base:
        raise ValueError("a sweep needs target-alone runs (K=0)")
    ratio = _ratio_to_alone(base)
    target_one = _pooled(base, "target_seconds") / max(_pooled(base, "n_cycles"), 1)
    loaded = [r for r in runs if (r.stats.outside_load or 0.0) >= BUSY_FROM]
    loaded_alone = {(r.prompt, r.repeat) for r in loaded if r.variant == 0}
    # 1. One row per K or variant, against the target alone.
    per_k = []
    for variant in sorted({r.variant for r in runs if r.variant != 0}, key=variant_order):
        mine = [r for r in runs if r.variant == variant]
        row = _row(variant, mine, ratio, target_one)
        row.explanation = _explain(row, mine, base)
        row.disturbed = sum(
            (r.stats.outside_load or 0.0) >= BUSY_FROM or (r.prompt, r.repeat) in loaded_alone
            for r in mine
        )
        per_k.append(row)
    # 2. The same speedups by kind of prompt and by prompt.
    per_kind = {
        kind: _speedups(
            per_k, runs, ratio, {i for i, name in enumerate(kinds or ()) if name == kind}
        )
        for kind in dict.fromkeys(kinds or ())
    }
    per_prompt = [_speedups(per_k, runs, ratio, {p}) for p in sorted({r.prompt for r in runs})]
    # 3. The verdict, from the rows no outside load disturbed.
    clean = [r for r in per_k if not r.disturbed]
    fastest = max(clean, key=lambda r: r.speedup, default=None)
    warning = ""
    if per_k and not clean:
        warning = (
            "other processes kept the CPUs busy during every row: nothing to recommend; "
            "bench again when the machine is quiet (or with fewer --threads)"
        )
    elif fastest is None or fastest.speedup <= 1.0:
        warning = (
            "nothing beat the target alone on this machine: this pair is not worth "
            "speculating on here (run with -k 0, or try a smaller draft)"
        )
    best, note = _recommend(clean, fastest, runs) if not warning else (None, "")
    return Report(
        target_ms_per_token=target_one * 1000,
        baseline_tokens_per_second=statistics.median(r.tokens_per_second for r in base),
        per_k=per_k,
        recommended=best.variant if best else None,
        warning=warning,
        note=note,
        runs=len(runs),
        per_kind=per_kind,
        per_prompt=per_prompt,
        disturbed_runs=len(loaded),
    )


def _ratio_to_alone(base: Sequence[Run]) -> Callable[[Run], float | None]:
    """A run's speed over the target alone's on the same prompt and repeat."""
    alone = {(r.prompt, r.repeat): r.tokens_per_second for r in base}

    def ratio(run: Run) -> float | None:
        speed = alone[(run.prompt, run.repeat)]
        return run.tokens_per_second / speed if speed > 0 else None

    return ratio


def _row(
    variant: Variant, mine: Sequence[Run], ratio: Callable[[Run], float | None], target_one: float
) -> KReport:
    """What one row's runs measured, and what the model predicts for a fixed K."""
    ratios = [x for x in map(ratio, mine) if x is not None]
    drafted, accepted = _pooled(mine, "n_drafted"), _pooled(mine, "n_accepted")
    judged = accepted + _pooled(mine, "n_rejected")
    alpha = accepted / judged if judged else None
    cycles = _pooled(mine, "n_cycles")
    depth = variant if isinstance(variant, int) else max(len(r.stats.reached_at) for r in mine)
    positions = [
        sum(r.stats.accepted_at[i] for r in mine if i < len(r.stats.accepted_at))
        / max(1, sum(r.stats.reached_at[i] for r in mine if i < len(r.stats.reached_at)))
        for i in range(depth)
    ]
    # Per guess: a draft model's catch-up after speculation was off is not a guess's cost
    # (auto's rare explorations on a pair that cannot pay read 32 missed tokens for one guess).
    drafting = _pooled(mine, "draft_seconds") - _pooled(mine, "catch_up_seconds")
    draft_per_token = drafting / drafted if drafted else None
    verify = _pooled(mine, "target_seconds") / max(cycles, 1)
    cost_ratio = draft_per_token / target_one if draft_per_token is not None else None
    verify_ratio = verify / target_one
    # Cycles cut short by the token budget draft fewer than K guesses: use the mean drafted.
    k_eff = drafted / cycles if cycles else 0
    predicted_tpc = (
        expected_tokens(alpha, variant) if alpha is not None and isinstance(variant, int) else None
    )
    predicted = (
        predicted_speedup(predicted_tpc, k_eff, cost_ratio, verify_ratio)
        if predicted_tpc is not None and cost_ratio is not None
        else None
    )
    k_counts: dict[int, int] = {}
    for r in mine:
        for n, c in r.stats.k_counts.items():
            k_counts[n] = k_counts.get(n, 0) + c
    n_k = sum(k_counts.values())
    hosted = [r for r in mine if r.stats.host_seconds is not None]
    hosted_seconds = sum(r.stats.elapsed() for r in hosted)
    host_share = (
        sum(r.stats.host_seconds or 0.0 for r in hosted) / hosted_seconds
        if hosted_seconds > 0
        else None
    )
    by_ngram, by_cache, forced = (
        sum(r.stats.by_source[name].drafted for r in mine if name in r.stats.by_source)
        for name in ("ngram", "cache", "grammar")
    )
    return KReport(
        variant=variant,
        tokens_per_second=statistics.median(r.tokens_per_second for r in mine),
        speedup=statistics.median(ratios) if ratios else 0.0,
        accept_rate=alpha,
        position_accept_rates=positions,
        tokens_per_cycle=_pooled(mine, "n_cycle_tokens") / max(cycles, 1),
        draft_ms_per_token=None if draft_per_token is None else draft_per_token * 1000,
        verify_ms=verify * 1000,
        cost_ratio=cost_ratio,
        verify_ratio=verify_ratio,
        predicted_tokens_per_cycle=predicted_tpc,
        predicted_speedup=predicted,
        mean_lookahead=sum(n * c for n, c in k_counts.items()) / n_k if n_k else None,
        target_alone_share=k_counts.get(0, 0) / n_k if n_k else 0.0,
        ngram_share=by_ngram / drafted if drafted else None,
        cache_share=by_cache / drafted if drafted else None,
        forced_share=forced / drafted if drafted else None,
        host_share=host_share,
        model_guesses=int(drafted - by_ngram - by_cache - forced),
    )


def _speedups(
    per_k: Sequence[KReport],
    runs: Sequence[Run],
    ratio: Callable[[Run], float | None],
    prompts: set[int],
) -> dict[Variant, float]:
    """Each row's median speedup over the runs of these prompts."""
    out = {}
    for row in per_k:
        ratios = [
            x
            for r in runs
            if r.variant == row.variant and r.prompt in prompts
            for x in [ratio(r)]
            if x is not None
        ]
        if ratios:
            out[row.variant] = statistics.median(ratios)
    return out


def _recommend(
    per_k: Sequence[KReport], fastest: KReport | None, runs: Sequence[Run]
) -> tuple[KReport | None, str]:
    """The fastest row, unless a row that adapts (ADAPTS) is within the noise of it: then that
    one, and a note that says why."""
    steady = next((r for name in ADAPTS for r in per_k if r.variant == name), None)
    if fastest is None or steady is None or steady is fastest:
        return fastest, ""
    ratios = _paired_ratios(runs, fastest.variant, steady.variant)
    if _beyond_noise(ratios):
        return fastest, ""
    spread = f"; run by run {min(ratios):.2f}-{max(ratios):.2f}x" if ratios else ""
    return steady, (
        f"{variant_name(fastest.variant)} ran fastest ({fastest.speedup:.2f}x) "
        f"but not beyond the noise of {len(ratios)} runs against "
        f"{steady.variant} ({steady.speedup:.2f}x{spread}), which adapts to the "
        f"text as it goes; more prompts or --repeats can tell them apart"
    )


def _paired_ratios(runs: Sequence[Run], a: Variant, b: Variant) -> list[float]:
    """Speed of ``a`` over ``b``, run by run (the same prompt and repeat)."""
    speed_b = {(r.prompt, r.repeat): r.tokens_per_second for r in runs if r.variant == b}
    return [
        r.tokens_per_second / speed_b[(r.prompt, r.repeat)]
        for r in runs
        if r.variant == a and speed_b.get((r.prompt, r.repeat), 0) > 0 and r.tokens_per_second > 0
    ]


def _beyond_noise(ratios: Sequence[float]) -> bool:
    """Whether ratios (paired runs) show a gain beyond their own noise (NOISE_SE)."""
    if len(ratios) < MIN_PAIRED:
        return False
    logs = [math.log(x) for x in ratios]
    return statistics.mean(logs) > NOISE_SE * statistics.stdev(logs) / math.sqrt(len(logs))


def _explain(row: KReport, mine: Sequence[Run], base: Sequence[Run]) -> str:
    """Where prediction and measurement part by more than DISAGREEMENT, the cost that
    explains it."""
    gap = row.disagreement
    if gap is None or abs(gap) <= DISAGREEMENT:
        return ""
    # Three places the model can be off: tokens per cycle, time outside the two models, and
    # the target's speed outside the verify pass (the baseline's own overhead).
    tpc_gap = (row.predicted_tokens_per_cycle or 0) / row.tokens_per_cycle - 1
    overhead = 1 - (_pooled(mine, "draft_seconds") + _pooled(mine, "target_seconds")) / max(
        _pooled(mine, "gen_seconds"), 1e-9
    )
    base_overhead = 1 - _pooled(base, "target_seconds") / max(_pooled(base, "gen_seconds"), 1e-9)
    causes = {
        "tokens per cycle": (
            abs(tpc_gap),
            f"the formula expects {row.predicted_tokens_per_cycle:.2f} tokens "
            f"per cycle but {row.tokens_per_cycle:.2f} came, because guesses "
            f"do not survive independently with one alpha (by position: "
            f"{_rates(row.position_accept_rates)}): "
            + (
                "easy stretches are accepted whole, hard ones fail early"
                if tpc_gap < 0
                else "later guesses survive less often"
            ),
        ),
        "overhead": (
            abs(overhead - base_overhead),
            f"{overhead:.0%} of speculative time is spent outside the two models "
            f"(sampling, text, rollback) against {base_overhead:.0%} for the target "
            f"alone",
        ),
    }
    cause, (_, text) = max(causes.items(), key=lambda item: item[1][0])
    drafted_per_cycle = _pooled(mine, "n_drafted") / max(_pooled(mine, "n_cycles"), 1)
    if (
        cause == "tokens per cycle"
        and isinstance(row.variant, int)
        and drafted_per_cycle < 0.95 * row.variant
    ):
        text = (
            f"runs are short, so the --max-tokens budget cut cycles short "
            f"({drafted_per_cycle:.1f} of {row.variant} guesses drafted per cycle on "
            f"average); raise --max-tokens for a fairer measure"
        )
    direction = "over" if gap > 0 else "under"
    return f"model {direction}estimates by {abs(gap):.0%}: {text}"


def _rates(rates: Sequence[float]) -> str:
    return ", ".join(f"{r:.0%}" for r in rates)
