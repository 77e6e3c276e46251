"""``specgen bench``: sweep the lookahead K, measure the target alone beside it, explain, choose.

The sweep interleaves runs (K=0, K1, K2, ... for a prompt, then the next prompt, then again) so a
machine whose speed drifts does not bias the ratios, and every run starts from empty caches. The
report compares what was measured with the expected-tokens model of the speedup (Leviathan
et al. 2023; Chen et al. 2023):

    E[tokens per cycle] = (1 - alpha^(K+1)) / (1 - alpha)
    cost of a cycle     = K * c + v(K)       (in units of one target step)
    predicted speedup   = E[tokens per cycle] / cost of a cycle

where c = draft time per token / target time per token, and v(K) = time of the target's verify
pass over K+1 tokens / target time per token, all measured in the same run. This module is pure:
it drives a ``run_one`` callable and reads the ``Stats`` it returns, so tests feed it fakes.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specgen.core.speculative import expected_tokens, predicted_speedup
from specgen.errors import UserError
from specgen.lookahead import MAX_LOOKAHEAD
from specgen.stats import Stats

DISAGREEMENT = 0.15
# The rows that adapt to the text as it goes, the most general first: one of them is the
# recommendation unless another row beats it beyond the noise of the runs (a fixed K, or prompt
# lookup alone, that won on these prompts may lose on the user's own text).
ADAPTS = ("hybrid", "auto")
# An adaptive row whose draft model made fewer guesses than this (auto's probes where the draft
# cannot pay) says so: its draft and c rest on them, and a first decode runs cold (slower).
FEW_GUESSES = 20
# Beyond the noise: over at least MIN_PAIRED runs, the mean of the log speed ratios run by run
# (same prompt, same repeat) is more than NOISE_SE standard errors above 0. Sampled runs draw
# other texts, and a busy machine slows a run by 10% and more, so a median over a few prompts
# can name a row that is not faster.
NOISE_SE, MIN_PAIRED = 2.0, 3

# The built-in prompts, each with its kind: the kinds answer "which drafter for which task".
# "rewrite" and "extract" prompts carry a passage the answer copies from (prompt lookup's home
# ground); the others ask for new text. Phrased to work for base and chat models alike.
PASSAGE = ("The printing press, developed by Johannes Gutenberg around 1440, made books cheaper "
           "and faster to produce. Ideas spread across Europe within years instead of decades, "
           "literacy rose, and the Reformation and the scientific revolution both owed much to "
           "pamphlets and journals that could be printed in thousands of copies.")
BUILTIN = [
    ("explain", "Explain in a few sentences why the sky is blue."),
    ("explain", "What are the main differences between a list and a tuple in Python?"),
    ("code", "Write a Python function that returns the n-th Fibonacci number, with a docstring."),
    ("code", "Write a SQL query that finds the ten customers with the highest total order "
             "value."),
    ("summarize", f"Summarize this passage in two sentences: {PASSAGE}"),
    ("rewrite", "Rewrite this sentence in a formal tone: hey, the meeting got moved to friday, "
                "can u make it?"),
    ("rewrite", "Correct the spelling mistakes in this paragraph and write it out in full.\n\n"
                "Paragraph: The printing pres, developped by Johannes Gutenberg around 1440, "
                "made books cheeper and faster to produce. Ideas spread accross Europe within "
                "years insted of decades, literacy rose, and the Reformation and the scientific "
                "revolution both owed much to pamflets and journals that could be printed in "
                "thousands of copys.\n\nCorrected paragraph:"),
    ("rewrite", "Rename the variable `total` to `order_sum` in this code and show the whole "
                "code.\n\n```python\ndef order_value(orders):\n    total = 0\n    for order "
                "in orders:\n        if order.paid:\n            total += order.price * "
                "order.quantity\n    return total\n\n\ndef report(orders):\n    total = "
                "order_value(orders)\n    print(f\"Paid orders: {total:.2f}\")\n    return "
                "total\n```\n\nThe code with `order_sum`:\n\n```python\n"),
    ("extract", f"Copy out, word for word, every sentence of this passage that mentions "
                f"Europe or Gutenberg.\n\nPassage: {PASSAGE}\n\nSentences:"),
    ("list", "List ten countries in Europe and their capital cities."),
    ("howto", "Give a step-by-step recipe for a simple tomato soup."),
    ("story", "Write the opening paragraph of a story about a lighthouse keeper who finds a "
              "message in a bottle."),
    ("translate", "Translate to French: The train leaves at eight o'clock tomorrow morning."),
]
BUILTIN_PROMPTS = [prompt for _, prompt in BUILTIN]
BUILTIN_KINDS = [kind for kind, _ in BUILTIN]


def load_prompts(path: Path) -> list[str]:
    """One prompt per line (``\\n`` for a newline inside one), or JSON lines with a "prompt"
    field, as ``specgen run`` reads them; blank lines are skipped."""
    from specgen.prompts import BadLine, parse_record, unescape

    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"cannot read prompts from {path}: {err}") from err
    prompts = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if not line.lstrip().startswith("{"):
            prompts.append(unescape(line))
            continue
        item = parse_record(line, number)
        if isinstance(item, BadLine):
            raise UserError(f"{path}, {item.error}")
        if item.prompt is None:
            raise UserError(f"{path}, line {number}: bench takes \"prompt\" lines, not "
                            f"\"messages\"")
        prompts.append(item.prompt)
    if not prompts:
        raise UserError(f"{path} holds no prompts")
    return prompts


# What bench measures beside fixed K's: the draft model with -k auto, prompt lookup alone, and
# both together (each with -k auto), in this order after the K's.
ADAPTIVE_VARIANTS = ("auto", "ngram", "hybrid")
DEFAULT_VARIANTS = "1,2,3,4,6,8,auto,ngram,hybrid"
Variant = int | str


def parse_lookaheads(text: str) -> list[Variant]:
    """Fixed K's (sorted) then the adaptive variants asked for, each once; K=0 always runs."""
    ks: set[int] = set()
    named: set[str] = set()
    for item in (v.strip().lower() for v in text.split(",")):
        if not item:
            continue
        if item in ADAPTIVE_VARIANTS:
            named.add(item)
            continue
        try:
            ks.add(int(item))
        except ValueError as err:
            raise UserError(f"-k takes K's and {', '.join(ADAPTIVE_VARIANTS)} separated by "
                            f"commas, like 1,2,4,8,auto (got {text!r})") from err
    ks.discard(0)
    if (ks and (min(ks) < 0 or max(ks) > MAX_LOOKAHEAD)) or not (ks or named):
        raise UserError(f"-k needs at least one K from 1 to {MAX_LOOKAHEAD} or one of "
                        f"{', '.join(ADAPTIVE_VARIANTS)} (the target alone always runs)")
    return [*sorted(ks), *(v for v in ADAPTIVE_VARIANTS if v in named)]


def variant_order(variant: Variant) -> tuple[int, int]:
    if isinstance(variant, int):
        return (0, variant)
    return (1, ADAPTIVE_VARIANTS.index(variant))


@dataclass(frozen=True)
class Run:
    """One measured generation."""

    lookahead: Variant
    prompt: int
    repeat: int
    stats: Stats

    @property
    def tokens_per_second(self) -> float:
        return self.stats.n_generated / self.stats.gen_seconds if self.stats.gen_seconds else 0.0


RunOne = Callable[[int, Variant, int], Stats]  # (prompt index, K or variant, seed) -> Stats


def sweep(run_one: RunOne, n_prompts: int, lookaheads: Sequence[Variant], repeats: int,
          seed: int, on_run: Callable[[int, int, Variant], None] | None = None,
          warmup: bool = True, runs: list[Run] | None = None) -> list[Run]:
    """Every prompt at K=0 and each K or variant, interleaved, ``repeats`` times; a warm-up
    run first (the largest K, else the first variant). Runs are appended to ``runs`` as they
    finish, so a sweep cut short by Ctrl-C leaves what it measured there."""
    ks: list[Variant] = [0, *lookaheads]
    if warmup:
        fixed = [k for k in lookaheads if isinstance(k, int)]
        run_one(0, max(fixed) if fixed else lookaheads[0], seed)
    runs = [] if runs is None else runs
    for repeat in range(repeats):
        for prompt in range(n_prompts):
            for k in ks:
                if on_run:
                    on_run(repeat, prompt, k)
                runs.append(Run(k, prompt, repeat, run_one(prompt, k, seed + repeat)))
    return runs


@dataclass
class KReport:
    """Everything measured and predicted for one K (or one adaptive variant)."""

    lookahead: Variant
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
    paid_guesses: int = 0  # guesses of a draft model (not n-gram ones): what draft and c rest on

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
    recommended: Variant | None
    warning: str = ""
    # Why the recommendation is not the fastest row (it did not win beyond the noise).
    note: str = ""
    runs: int = 0
    meta: dict[str, object] = field(default_factory=dict)
    # kind of prompt -> K or variant -> median speedup over that kind's prompts
    per_kind: dict[str, dict[Variant, float]] = field(default_factory=dict)
    # prompt index -> K or variant -> median speedup over the repeats
    per_prompt: list[dict[Variant, float]] = field(default_factory=list)

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
                "note": self.note,
                "runs": self.runs, "per_k": rows,
                "per_kind": {kind: {str(v): x for v, x in speedups.items()}
                             for kind, speedups in self.per_kind.items()},
                "per_prompt": [{str(v): x for v, x in speedups.items()}
                               for speedups in self.per_prompt]}


def _pooled(runs: Iterable[Run], attr: str) -> float:
    return float(sum(getattr(r.stats, attr) for r in runs))


def summarize(runs: Sequence[Run], kinds: Sequence[str] | None = None) -> Report:
    """Medians, pooled rates, the fitted costs, the prediction, and the verdict.

    ``kinds`` names each prompt's kind (by prompt index) for the per-kind speedups.
    """
    base = [r for r in runs if r.lookahead == 0]
    if not base:
        raise ValueError("a sweep needs target-alone runs (K=0)")
    base_by_key = {(r.prompt, r.repeat): r for r in base}

    def ratio(run: Run) -> float | None:
        alone = base_by_key[(run.prompt, run.repeat)].tokens_per_second
        return run.tokens_per_second / alone if alone > 0 else None

    target_one = _pooled(base, "target_seconds") / max(_pooled(base, "n_cycles"), 1)
    baseline_tps = statistics.median(r.tokens_per_second for r in base)
    per_k = []
    for k in sorted({r.lookahead for r in runs if r.lookahead != 0}, key=variant_order):
        mine = [r for r in runs if r.lookahead == k]
        ratios = [x for x in map(ratio, mine) if x is not None]
        drafted, accepted = _pooled(mine, "n_drafted"), _pooled(mine, "n_accepted")
        judged = accepted + _pooled(mine, "n_rejected")
        alpha = accepted / judged if judged else None
        cycles = _pooled(mine, "n_cycles")
        depth = k if isinstance(k, int) else max(len(r.stats.reached_at) for r in mine)
        positions = [sum(r.stats.accepted_at[i] for r in mine if i < len(r.stats.accepted_at)) /
                     max(1, sum(r.stats.reached_at[i] for r in mine
                                if i < len(r.stats.reached_at)))
                     for i in range(depth)]
        # Per guess: a draft model's catch-up after speculation was off is not a guess's cost
        # (auto's rare probes on a pair that cannot pay read 32 missed tokens for one guess).
        drafting = _pooled(mine, "draft_seconds") - _pooled(mine, "catch_up_seconds")
        draft_per_token = drafting / drafted if drafted else None
        verify = _pooled(mine, "target_seconds") / max(cycles, 1)
        cost_ratio = draft_per_token / target_one if draft_per_token is not None else None
        verify_ratio = verify / target_one
        # Cycles cut short by the token budget draft fewer than K guesses: use the mean drafted.
        k_eff = drafted / cycles if cycles else 0
        predicted_tpc = (expected_tokens(alpha, k)
                         if alpha is not None and isinstance(k, int) else None)
        predicted = (predicted_speedup(predicted_tpc, k_eff, cost_ratio, verify_ratio)
                     if predicted_tpc is not None and cost_ratio is not None else None)
        k_counts: dict[int, int] = {}
        for r in mine:
            for n, c in r.stats.k_counts.items():
                k_counts[n] = k_counts.get(n, 0) + c
        n_k = sum(k_counts.values())
        by_ngram = sum(r.stats.by_source["ngram"].drafted for r in mine
                       if "ngram" in r.stats.by_source)
        row = KReport(
            lookahead=k,
            tokens_per_second=statistics.median(r.tokens_per_second for r in mine),
            speedup=statistics.median(ratios) if ratios else 0.0,
            accept_rate=alpha, position_accept_rates=positions,
            tokens_per_cycle=_pooled(mine, "n_cycle_tokens") / max(cycles, 1),
            draft_ms_per_token=None if draft_per_token is None else draft_per_token * 1000,
            verify_ms=verify * 1000, cost_ratio=cost_ratio, verify_ratio=verify_ratio,
            predicted_tokens_per_cycle=predicted_tpc, predicted_speedup=predicted,
            mean_lookahead=sum(n * c for n, c in k_counts.items()) / n_k if n_k else None,
            target_alone_share=k_counts.get(0, 0) / n_k if n_k else 0.0,
            ngram_share=by_ngram / drafted if drafted else None,
            paid_guesses=int(drafted - by_ngram),
        )
        row.explanation = _explain(row, mine, base)
        per_k.append(row)
    def speedups(prompts: set[int]) -> dict[Variant, float]:
        out = {}
        for row in per_k:
            ratios = [x for r in runs if r.lookahead == row.lookahead and r.prompt in prompts
                      for x in [ratio(r)] if x is not None]
            if ratios:
                out[row.lookahead] = statistics.median(ratios)
        return out

    per_kind = {kind: speedups({i for i, name in enumerate(kinds or ()) if name == kind})
                for kind in dict.fromkeys(kinds or ())}
    per_prompt = [speedups({p}) for p in sorted({r.prompt for r in runs})]
    fastest = max(per_k, key=lambda r: r.speedup, default=None)
    warning = ""
    if fastest is None or fastest.speedup <= 1.0:
        warning = ("nothing beat the target alone on this machine: this pair is not worth "
                   "speculating on here (run with -k 0, or try a smaller draft)")
    best, note = _recommend(per_k, fastest, runs) if not warning else (None, "")
    return Report(target_ms_per_token=target_one * 1000, baseline_tokens_per_second=baseline_tps,
                  per_k=per_k, recommended=best.lookahead if best else None, warning=warning,
                  note=note, runs=len(runs), per_kind=per_kind, per_prompt=per_prompt)


def _recommend(per_k: Sequence[KReport], fastest: KReport | None, runs: Sequence[Run]
               ) -> tuple[KReport | None, str]:
    """The fastest row, unless a row that adapts (ADAPTS) is within the noise of it: then that
    one, and a note that says why."""
    steady = next((r for name in ADAPTS for r in per_k if r.lookahead == name), None)
    if fastest is None or steady is None or steady is fastest:
        return fastest, ""
    ratios = _paired_ratios(runs, fastest.lookahead, steady.lookahead)
    if _beyond_noise(ratios):
        return fastest, ""
    spread = f"; run by run {min(ratios):.2f}-{max(ratios):.2f}x" if ratios else ""
    return steady, (f"{variant_name(fastest.lookahead)} ran fastest ({fastest.speedup:.2f}x) "
                    f"but not beyond the noise of {len(ratios)} runs against "
                    f"{steady.lookahead} ({steady.speedup:.2f}x{spread}), which adapts to the "
                    f"text as it goes; more prompts or --repeats can tell them apart")


def _paired_ratios(runs: Sequence[Run], a: Variant, b: Variant) -> list[float]:
    """Speed of ``a`` over ``b``, run by run (the same prompt and repeat)."""
    speed_b = {(r.prompt, r.repeat): r.tokens_per_second for r in runs if r.lookahead == b}
    return [r.tokens_per_second / speed_b[(r.prompt, r.repeat)] for r in runs
            if r.lookahead == a and speed_b.get((r.prompt, r.repeat), 0) > 0
            and r.tokens_per_second > 0]


def _beyond_noise(ratios: Sequence[float]) -> bool:
    """Whether ratios (paired runs) show a gain beyond their own noise (NOISE_SE)."""
    if len(ratios) < MIN_PAIRED:
        return False
    logs = [math.log(x) for x in ratios]
    return statistics.mean(logs) > NOISE_SE * statistics.stdev(logs) / math.sqrt(len(logs))


def variant_name(variant: Variant) -> str:
    return f"K={variant}" if isinstance(variant, int) else str(variant)


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
    cause, (_, text) = max(causes.items(), key=lambda item: item[1][0])
    drafted_per_cycle = _pooled(mine, "n_drafted") / max(_pooled(mine, "n_cycles"), 1)
    if cause == "tokens per cycle" and isinstance(row.lookahead, int) and \
            drafted_per_cycle < 0.95 * row.lookahead:
        text = (f"runs are short, so the --max-tokens budget cut cycles short "
                f"({drafted_per_cycle:.1f} of {row.lookahead} guesses drafted per cycle on "
                f"average); raise --max-tokens for a fairer measure")
    direction = "over" if gap > 0 else "under"
    return f"model {direction}estimates by {abs(gap):.0%}: {text}"


def _rates(rates: Sequence[float]) -> str:
    return ", ".join(f"{r:.0%}" for r in rates)


# -- output -----------------------------------------------------------------------------------

CSV_FIELDS = ["temperature", "lookahead", "tokens_per_second", "speedup", "predicted_speedup",
              "disagreement", "accept_rate", "tokens_per_cycle", "predicted_tokens_per_cycle",
              "draft_ms_per_token", "verify_ms", "cost_ratio", "verify_ratio",
              "position_accept_rates", "explanation"]


def write_csv(reports: Sequence[Report], path: Path) -> None:
    """One row per K (or variant) and sampling setting; the header on line 1, nothing else:
    the metadata is in the JSON."""
    import csv

    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(CSV_FIELDS)
        for report in reports:
            temperature = report.meta.get("params", {}).get("temperature")  # type: ignore[union-attr]
            for row in report.as_dict()["per_k"]:  # type: ignore[union-attr]
                row = {**row, "temperature": temperature}
                values = []
                for key in CSV_FIELDS:
                    value = row[key]
                    if isinstance(value, list):
                        value = ";".join(f"{v:.4f}" for v in value)
                    elif isinstance(value, float):
                        value = f"{value:.4f}"
                    values.append("" if value is None else value)
                writer.writerow(values)


# -- what bench found, remembered for `specgen run` --------------------------------------------

def memo_path(models: Sequence[str], machine: dict[str, object]) -> Path:
    """Where the bench result for these models (a pair name, or file keys) on this machine
    (CPU, llama.cpp build, threads, GPU layers) is kept."""
    from specgen import store

    return store.path("bench", store.text_key(json.dumps([list(models), machine],
                                                         sort_keys=True, default=str)))


def mode_of(temperature: float) -> str:
    return "greedy" if temperature <= 0 else "sampled"


def remember(path: Path, reports: Sequence[Report], when: str) -> None:
    """Keep each sampling mode's best variant (0: nothing paid) for `run` to use by default."""
    from specgen import store

    memo = store.read_json(path, {})
    if not isinstance(memo, dict):
        memo = {}
    for report in reports:
        temperature = float(report.meta.get("params", {}).get("temperature", 0.0))  # type: ignore[union-attr]
        best = report.best()
        memo[mode_of(temperature)] = {
            "variant": best.lookahead if best is not None else 0,
            "speedup": best.speedup if best is not None else 1.0,
            "temperature": temperature, "date": when,
            "cost_ratio": best.cost_ratio if best is not None else None,
        }
    store.write_json(path, memo, indent=1)  # a read-only cache: nothing remembered


def recall(path: Path, temperature: float) -> dict[str, object] | None:
    """What bench found for this sampling mode, or None when it never ran here."""
    from specgen import store

    memo = store.read_json(path)
    found = memo.get(mode_of(temperature)) if isinstance(memo, dict) else None
    return found if isinstance(found, dict) and "variant" in found else None


def write_plot(report: Report, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise UserError("--plot needs matplotlib: pip install 'specgen[plot]'") from err
    fixed = [r for r in report.per_k if isinstance(r.lookahead, int)]
    ks = [0] + [int(r.lookahead) for r in fixed]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    ax.plot(ks, [1.0] + [r.speedup for r in fixed], "o-", label="measured")
    ax.plot(ks, [1.0] + [r.predicted_speedup or float("nan") for r in fixed], "s--",
            label="predicted (Leviathan et al. 2023)")
    for row, style in zip((r for r in report.per_k if not isinstance(r.lookahead, int)),
                          (":", "-.", (0, (5, 1)))):
        ax.axhline(row.speedup, ls=style, color="tab:green", lw=1,
                   label=f"{row.lookahead} (adaptive K)")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("lookahead K (0 = target alone)")
    ax.set_ylabel("speedup over the target alone")
    ax.set_xticks(ks)
    ax.set_title(str(report.meta.get("title", "specgen bench")), fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
