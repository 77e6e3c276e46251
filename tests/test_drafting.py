"""Drafters and the lookahead policy on fakes: the seam, n-gram lookup, hybrid, ``-k auto``."""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pytest

from specgen.core.sampling import SamplingParams, warp
from specgen.core.speculative import expected_tokens_by_position
from specgen.drafters import (
    CATCH_UP_WINDOW,
    NGRAM_SPAN,
    HybridDrafter,
    ModelDrafter,
    NgramDrafter,
    Proposal,
)
from specgen.engine import CycleDone, Finished, GenerationConfig, SpeculativeEngine
from specgen.lookahead import (
    GROWTH_FIRST,
    RECHECK_AFTER,
    TARGET_ALONE,
    TIMING_LOOKAHEAD,
    AdaptiveLookahead,
    Costs,
    FixedLookahead,
    Offer,
    Plan,
)
from tests.fakes import FakeModel
from tests.stats_helpers import pooled_chisquare_pvalue

GREEDY = SamplingParams(temperature=0)
SAMPLING = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)


def run(engine: SpeculativeEngine, config: GenerationConfig, prompt: Sequence[int]):
    tokens: list[int] = []
    for event in engine.generate(prompt, config):
        if isinstance(event, CycleDone):
            tokens.extend(event.tokens)
    assert isinstance(event, Finished)
    return tokens[: event.stats.n_generated], event.stats


# -- the seam ----------------------------------------------------------------------------------

class ScriptedDrafter:
    """Proposes a fixed script of guesses and records every call the engine makes."""

    def __init__(self, script: list[int]) -> None:
        self.script, self.calls = script, []

    def begin(self, prompt: Sequence[int], reuse_prefix: bool = False) -> None:
        self.calls.append(("begin", len(prompt)))

    def offers(self, context: Sequence[int]) -> list[Offer]:
        return [Offer("script", "script", len(self.script))]

    def propose(self, context, offer, k, sampling, rng) -> Proposal:
        self.calls.append(("propose", len(context), k))
        return Proposal(self.script[:k], [])

    def settle(self, n_accepted: int) -> None:
        self.calls.append(("settle", n_accepted))


def test_engine_drives_any_drafter_through_the_protocol() -> None:
    target = FakeModel()
    alone, _ = run(SpeculativeEngine(FakeModel()), GenerationConfig(0, GREEDY, 20), [1, 2, 3])
    drafter = ScriptedDrafter(alone[1:4])  # right for the first cycle, then wrong
    tokens, stats = run(SpeculativeEngine(target, drafter), GenerationConfig(3, GREEDY, 20),
                        [1, 2, 3])
    assert tokens == alone
    # The prompt's pass gives the first token; the drafter begins after it, with it.
    assert drafter.calls[0] == ("begin", 4)
    assert drafter.calls[1:3] == [("propose", 4, 3), ("settle", 3)]
    assert stats.by_source["script"].accepted >= 3
    proposals = [c for c in drafter.calls if c[0] == "propose"]
    settles = [c for c in drafter.calls if c[0] == "settle"]
    assert len(proposals) == len(settles) == stats.by_source["script"].cycles
    assert stats.n_cycles == len(proposals) + stats.k_counts.get(0, 0)


# -- n-gram lookup -----------------------------------------------------------------------------

def test_ngram_lookup_prefers_the_longest_then_the_latest_match() -> None:
    drafter = NgramDrafter()
    context = [5, 6, 7, 8, 1, 6, 7, 9, 2, 5, 6, 7]
    # "5 6 7" occurred at the start (followed by 8); "6 7" later too (followed by 9): the longer
    # match wins.
    (offer,) = drafter.offers(context)
    assert offer.key == "ngram3"
    assert drafter.propose(context, offer, 4, GREEDY, np.random.default_rng()).tokens == \
        [8, 1, 6, 7]
    # Only "7" matches now: its latest earlier occurrence was followed by 9.
    drafter.begin([])
    assert drafter.lookup([3, 7, 9, 4, 7, 1, 7]) == (1, 4)
    assert NgramDrafter().offers([1, 2, 3, 4]) == []


def test_ngram_index_grows_with_the_context() -> None:
    drafter = NgramDrafter()
    context = [1, 2, 3, 4]
    assert drafter.offers(context) == []
    context += [9, 1, 2]
    (offer,) = drafter.offers(context)
    # "1 2" occurred 5 tokens back: what followed it, then round again, as a text that
    # repeats itself every 5 tokens would go on.
    assert offer.key == "ngram2" and offer.limit == NGRAM_SPAN
    assert drafter.propose(context, offer, 8, GREEDY, np.random.default_rng()).tokens == \
        [3, 4, 9, 1, 2, 3, 4, 9]
    # Guesses not yet verified extend the suffix looked up, never the index.
    (offer,) = drafter.offers(context, [3, 4])
    assert offer.key == "ngram4" and offer.preview[:3] == (9, 1, 2)
    assert drafter.lookup([*context, 3]) == (3, 2)


def test_a_hybrid_model_run_ends_where_its_guesses_lead_into_a_long_match() -> None:
    """Once the model's guesses make the text end in a long match, the match's continuation
    (free) fills the cycle instead of more model steps."""
    prompt = [7, 8, 1, 2, 3, 4, 5, 6, 9, 10, 11, 12, 13]

    class Counts(FakeModel):  # a draft that guesses t + 1 after t
        def logits_after(self, prefix: list[int]) -> np.ndarray:
            out = np.zeros(16, dtype=np.float32)
            out[(prefix[-1] + 1) % 16] = 5.0
            return out

    draft = Counts()
    hybrid = HybridDrafter(ModelDrafter(draft))
    context = [*prompt, 1]
    hybrid.begin(context)
    # Only "1" matches (weak): the model is offered first.
    assert [o.key for o in hybrid.offers(context)] == ["model", "ngram1"]
    proposal = hybrid.propose(context, MODEL, 6, GREEDY, np.random.default_rng(0))
    # The model guesses 2 ("1 2": a weak match), then 3: "1 2 3" was seen, followed by 4 5 6 9.
    assert proposal.tokens == [2, 3, 4, 5, 6, 9]
    assert proposal.switch is not None and proposal.switch[0].key == "ngram3"
    assert proposal.switch[1] == 4  # two guesses from the model, four looked up
    assert draft.decode_calls[1:] == [(1, 1), (1, 1)]  # two model steps, no more


def repeating_target() -> FakeModel:
    """A fake target whose greedy text keeps repeating a phrase of the prompt."""

    class Repeating(FakeModel):
        def logits_after(self, prefix: list[int]) -> np.ndarray:
            out = super().logits_after(prefix)
            out[(prefix[-1] + 1) % 6] += 6.0  # mostly counts 0..5 round and round
            return out

    return Repeating(sharpness=1.0, call_seconds=0.002, token_seconds=0.0002)


def test_greedy_ngram_is_the_target_alone_and_needs_few_cycles() -> None:
    prompt = [0, 1, 2, 3, 4, 5, 0, 1]
    alone, base = run(SpeculativeEngine(repeating_target()), GenerationConfig(0, GREEDY, 60),
                      prompt)
    for lookahead in (4, "auto"):
        tokens, stats = run(SpeculativeEngine(repeating_target(), NgramDrafter()),
                            GenerationConfig(lookahead, GREEDY, 60), prompt)
        assert tokens == alone
        assert stats.by_source["ngram"].accepted > 20
        assert stats.n_cycles < base.n_cycles / 2


@pytest.mark.parametrize(("make", "lookahead"), [("ngram", 3), ("hybrid", 3), ("hybrid", "auto")])
def test_ngram_and_hybrid_guesses_keep_the_target_distribution(make: str, lookahead) -> None:
    """Chi-square on (x2, x3) against the target's sum over x1 of p(x1) p(x2 | x1) p(x3 | x1 x2).
    x1 comes from the prompt's own pass, the guesses from the first cycle on; the prompt holds
    "1 2 x" for every x, so whatever x1 is, the text ends in a 3-gram seen before and n-gram
    guesses (point masses) are made at both positions."""
    prompt = [t for x in range(16) for t in (1, 2, x)] + [1, 2]
    ref = FakeModel(sharpness=0.7)

    def p(context: list[int]) -> np.ndarray:
        return warp(ref.logits_after([*prompt, *context]), SAMPLING).dense(16)

    joint = sum(p([])[a] * np.array([p([a])[b] * p([a, b]) for b in range(16)])
                for a in range(16))
    target = FakeModel(sharpness=0.7)
    drafter = (NgramDrafter() if make == "ngram" else
               HybridDrafter(ModelDrafter(FakeModel(sharpness=0.7, noise=1.0, salt=9))))
    engine = SpeculativeEngine(target, drafter)
    counts = np.zeros((16, 16))
    n, drafted = 3000, {"ngram": 0, "model": 0}
    for seed in range(n):
        tokens, stats = run(engine, GenerationConfig(lookahead, SAMPLING, 4, seed=seed), prompt)
        counts[tokens[1], tokens[2]] += 1
        for source, mine in stats.by_source.items():
            drafted[source] += mine.drafted
    if lookahead == 3:  # the 3-gram comes first: n-gram guesses in every run
        assert drafted["ngram"] >= 2 * n
    else:  # auto weighs the two: both are used
        assert drafted["ngram"] > 0 and drafted["model"] > 0
    assert pooled_chisquare_pvalue(counts, joint * n) > 1e-3


def test_a_model_run_that_ends_in_a_match_keeps_the_target_distribution() -> None:
    """A hybrid's model guess that leads into a long n-gram match hands the rest of the cycle
    to the match (point masses): chi-square on (x2, x3), x2 the model's guess, x3 the match's.

    The prompt holds "9 x y" for every x, y below 15 and ends in "15 9", seen nowhere else: at
    the first cycle only weak matches exist, so the model guesses first; after its guess g the
    text ends in "9 x1 g", a 3-gram seen before, and the match continues it."""
    prompt = [t for x in range(15) for y in range(15) for t in (9, x, y)] + [15, 9]
    ref = FakeModel(sharpness=0.7, n_ctx=1024)

    def p(context: list[int]) -> np.ndarray:
        return warp(ref.logits_after([*prompt, *context]), SAMPLING).dense(16)

    joint = sum(p([])[a] * np.array([p([a])[b] * p([a, b]) for b in range(16)])
                for a in range(16))
    draft = FakeModel(sharpness=0.7, noise=1.0, salt=9, n_ctx=1024)
    engine = SpeculativeEngine(FakeModel(sharpness=0.7, n_ctx=1024),
                               HybridDrafter(ModelDrafter(draft)))
    counts, n, switched = np.zeros((16, 16)), 3000, 0
    for seed in range(n):
        config = GenerationConfig(3, SAMPLING, 4, seed=seed)
        events = list(engine.generate(prompt, config, reuse_prefix=True))
        tokens = [t for e in events if isinstance(e, CycleDone) for t in e.tokens]
        counts[tokens[1], tokens[2]] += 1
        by_source = events[-1].stats.by_source
        # Guesses from n-grams with no n-gram cycle: the model's run switched to a match.
        switched += "ngram" in by_source and by_source["ngram"].cycles == 0 and \
            by_source["ngram"].drafted > 0
    assert switched > n / 2
    assert pooled_chisquare_pvalue(counts, joint * n) > 1e-3


def test_a_biased_ngram_rule_is_caught() -> None:
    """The chi-square above can fail: keep every n-gram guess (no accept coin) and it does."""
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    ref = FakeModel(sharpness=0.7)
    p1 = warp(ref.logits_after(prompt), SAMPLING).dense(16)
    guess = NgramDrafter()
    (offer,) = guess.offers(prompt)
    first = guess.propose(prompt, offer, 1, SAMPLING, np.random.default_rng()).tokens[0]
    counts = np.zeros(16)
    counts[first] = 3000  # what "always keep the guess" would emit
    assert pooled_chisquare_pvalue(counts, p1 * 3000) < 1e-6


def test_hybrid_takes_ngram_guesses_where_the_text_repeats_and_the_model_elsewhere() -> None:
    prompt = [0, 1, 2, 3, 4, 5, 0, 1]
    alone, _ = run(SpeculativeEngine(repeating_target()), GenerationConfig(0, GREEDY, 80), prompt)
    draft = FakeModel(noise=0.8, salt=7)
    hybrid = HybridDrafter(ModelDrafter(draft))
    tokens, stats = run(SpeculativeEngine(repeating_target(), hybrid),
                        GenerationConfig(6, GREEDY, 80), prompt)
    assert tokens == alone
    assert stats.by_source["ngram"].drafted > 0
    # The draft model's cache is a prefix of the text after every switch of source.
    assert draft.cache == (prompt + alone)[: draft.n_past]


# -- the lookahead policy ----------------------------------------------------------------------

MODEL = Offer("model", "model", 10_000)


def simulate(policy, accept: Sequence[float], draft: float, verify, cycles: int = 3000,
             seed: int = 0) -> tuple[float, dict[int, int]]:
    """Drive a policy against a world with known per-position acceptance and costs; return
    tokens per second and how often each K was chosen."""
    rng = np.random.default_rng(seed)
    tokens = seconds = 0.0
    chosen: dict[int, int] = {}
    for _ in range(cycles):
        plan = policy.plan([MODEL], 10_000)
        k = plan.lookahead
        n = 0
        while n < k and rng.random() < accept[min(n, len(accept) - 1)]:
            n += 1
        draft_s, verify_s = k * draft, verify(k + 1)
        policy.observe(plan, k, n, draft_s, verify_s)
        tokens += n + 1
        seconds += draft_s + verify_s
        chosen[k] = chosen.get(k, 0) + 1
    return tokens / seconds, chosen


def exact_rate(accept: Sequence[float], k: int, draft: float, verify) -> float:
    rates = [accept[min(i, len(accept) - 1)] for i in range(k)]
    return expected_tokens_by_position(rates)[k] / (k * draft + verify(k + 1))


def cpu_verify(n: int) -> float:
    return 1.0 + 0.15 * (n - 1)


@pytest.mark.parametrize("accept, draft", [
    ([0.9, 0.85, 0.8, 0.75, 0.7, 0.6, 0.5], 0.2),   # falling along the cycle, cheap draft
    ([0.98], 0.42),                                  # one network at two precisions
    ([0.7, 0.5, 0.3], 0.3),                          # a draft that disagrees often
])
def test_auto_lookahead_finds_the_k_that_maximizes_tokens_per_second(accept, draft) -> None:
    best_k = max(range(1, 33), key=lambda k: exact_rate(accept, k, draft, cpu_verify))
    best = exact_rate(accept, best_k, draft, cpu_verify)
    rate, chosen = simulate(AdaptiveLookahead(), accept, draft, cpu_verify)
    modal = max(chosen, key=chosen.get)
    # The optimum is flat near its top: the K chosen most often must be within 5% of it.
    assert exact_rate(accept, modal, draft, cpu_verify) >= 0.95 * best, (modal, best_k, chosen)
    assert rate >= 0.95 * best


def concave_verify(n: int) -> float:
    """A CPU's verify pass where 2 tokens cost far more than 1 and each one more adds little
    (the F32 SmolLM2 target here: 18.5 ms for 1 token, 25 for 2, 31 for 5, 48 for 9)."""
    return 1.0 if n == 1 else 1.4 + 0.1 * (n - 2)


def test_a_draft_that_pays_only_in_long_cycles_is_not_ruled_out_by_the_shortest_ones() -> None:
    """The first cycles time verify passes of 1 and 2 tokens; the line through them makes long
    passes look dear, and a draft that pays at K=11 (not at K=1) looked hopeless: speculation
    stayed off for good (598 of 600 cycles, 0.84 of the best rate). What every guess surviving
    could give is bounded with a pass never dearer than the longest one measured."""
    best = max(exact_rate([0.99], k, 0.65, concave_verify) for k in range(1, 33))
    assert exact_rate([0.99], 1, 0.65, concave_verify) < 1.0 < best  # pays only at long K
    rate, chosen = simulate(AdaptiveLookahead(), [0.99], 0.65, concave_verify, cycles=600)
    assert chosen.get(0, 0) < 30
    assert rate >= 0.95 * best


def test_auto_lookahead_turns_speculation_off_when_nothing_pays() -> None:
    # A draft that costs more than the target: even if every guess survived, K=0 is faster.
    rate, chosen = simulate(AdaptiveLookahead(), [1.0], draft=1.3, verify=cpu_verify)
    assert chosen.get(0, 0) / sum(chosen.values()) > 0.99
    assert rate >= 0.99 * 1.0  # the target alone makes one token per second here
    # A cheap draft the target never agrees with: off too, apart from rare probes.
    rate, chosen = simulate(AdaptiveLookahead(), [0.0], draft=0.1, verify=cpu_verify)
    assert chosen.get(0, 0) / sum(chosen.values()) > 0.97
    assert rate >= 0.97


def test_auto_lookahead_comes_back_when_the_text_gets_easy() -> None:
    policy = AdaptiveLookahead()
    simulate(policy, [0.0], draft=0.1, verify=cpu_verify, cycles=300)
    assert policy.plan([MODEL], 10_000).lookahead == 0
    rate, chosen = simulate(policy, [0.95], draft=0.1, verify=cpu_verify, cycles=600, seed=1)
    assert max(chosen, key=chosen.get) >= 4
    assert rate >= 0.8 * exact_rate([0.95], 8, 0.1, cpu_verify)


@pytest.mark.parametrize("accept, draft", [
    ([0.98], 0.42),                                  # long cycles pay
    ([0.9, 0.85, 0.8, 0.75, 0.7, 0.6, 0.5], 0.2),   # falling along the cycle
])
def test_a_new_generation_starts_from_the_typical_acceptance(accept, draft) -> None:
    """Acceptance by position is learned afresh each generation, starting from what is typical
    of the pair (kept with the costs): short answers run near the best K from their first
    cycle instead of climbing to it; the first plan is already near the optimum."""
    best = max(exact_rate(accept, k, draft, cpu_verify) for k in range(1, 33))

    def short_answers(keep_typical: bool) -> float:
        costs, rates = Costs(), []
        for generation in range(30):
            if not keep_typical:
                costs.typical.clear()
            policy = AdaptiveLookahead(costs)
            rates.append(simulate(policy, accept, draft, cpu_verify, cycles=8,
                                  seed=generation)[0])
        return float(np.mean(rates[5:]))  # the costs are known by then either way

    with_typical, without = short_answers(True), short_answers(False)
    assert with_typical >= 0.9 * best and with_typical > without
    costs = Costs()
    simulate(AdaptiveLookahead(costs), accept, draft, cpu_verify, cycles=400)
    restored = Costs.restore(json.loads(json.dumps(costs.snapshot())))
    first = AdaptiveLookahead(restored).plan([MODEL], 10_000).lookahead
    assert exact_rate(accept, first, draft, cpu_verify) >= 0.95 * best, first


def test_one_early_rejection_does_not_undo_what_is_typical_but_a_hard_text_does() -> None:
    """A generation moves the pair's typical acceptance by one shift fitted to all its guesses:
    on a pair that keeps 97% of its guesses, one cycle that fails at its third guess is chance,
    and K stays near the best (it fell from 8 to 2 when each position leaned on its own few
    samples); a text where guesses keep failing early cuts K."""
    accept, draft = [0.97], 0.42
    best_k = max(range(1, 33), key=lambda k: exact_rate(accept, k, draft, cpu_verify))
    costs = Costs()
    simulate(AdaptiveLookahead(costs), accept, draft, cpu_verify, cycles=400)
    policy = AdaptiveLookahead(costs)
    first = policy.plan([MODEL], 10_000)
    policy.observe(first, first.lookahead, 2, draft * first.lookahead,
                   cpu_verify(first.lookahead + 1))
    after_one = policy.plan([MODEL], 10_000).lookahead
    assert exact_rate(accept, after_one, draft, cpu_verify) >= 0.97 * exact_rate(
        accept, best_k, draft, cpu_verify), after_one
    for _ in range(6):  # this text: the second guess fails every time
        plan = policy.plan([MODEL], 10_000)
        policy.observe(plan, plan.lookahead, min(1, plan.lookahead), draft * plan.lookahead,
                       cpu_verify(plan.lookahead + 1))
    assert policy.plan([MODEL], 10_000).lookahead <= 2


def test_paid_guesses_grow_to_twice_the_longest_run_this_text_kept() -> None:
    """Where every guess survives and long cycles pay most, K for a draft model still ramps up
    (8, then twice the longest run kept: 16, 32), so one long cycle that fails early cannot cost
    much more than the cycles before it saved; a rejection early on holds it; free n-gram
    guesses are not held back."""
    costs = Costs()
    simulate(AdaptiveLookahead(costs), [1.0], 0.05, cpu_verify, cycles=200)  # learns: long pays
    assert AdaptiveLookahead(costs).plan([MODEL], 10_000).lookahead == GROWTH_FIRST
    policy = AdaptiveLookahead(costs)
    ks = []
    for _ in range(4):
        plan = policy.plan([MODEL], 10_000)
        ks.append(plan.lookahead)
        policy.observe(plan, plan.lookahead, plan.lookahead, 0.05 * plan.lookahead,
                       cpu_verify(plan.lookahead + 1))
    assert ks == [8, 16, 32, 32]
    policy = AdaptiveLookahead(costs)
    plan = policy.plan([MODEL], 10_000)
    policy.observe(plan, plan.lookahead, 3, 0.05 * plan.lookahead, cpu_verify(9))
    assert policy.plan([MODEL], 10_000).lookahead <= GROWTH_FIRST
    ngram = Offer("ngram", "ngram4", 32, tuple(range(32)))
    costs.typical["ngram4"] = costs.typical["model"]
    assert AdaptiveLookahead(costs).plan([ngram], 10_000).lookahead > 2 * GROWTH_FIRST


def test_remembered_verify_costs_follow_the_speed_measured_here() -> None:
    """A verify length only remembered is scaled by how fast the target runs here against
    then (the median ratio over lengths measured both then and here), so lengths measured
    here do not look cheap beside remembered ones on a machine faster now."""
    remembered = {"verify_by_n": {"1": 1.0, "5": 2.0, "9": 3.0, "13": 4.0}}
    costs = Costs.restore(remembered)
    costs.observe(None, 4, 0.0, 2.5)  # cold: slower than remembered, dropped
    assert costs.verify(9) == pytest.approx(3.0)
    costs.observe(None, 4, 0.0, 1.0)  # the target runs twice as fast here
    assert costs.verify(5) == pytest.approx(1.0)
    assert costs.verify(9) == pytest.approx(1.5) and costs.verify(1) == pytest.approx(0.5)
    assert costs.verify(11) == pytest.approx(1.75)  # the line through them, scaled too
    costs.observe(None, 8, 0.0, 3.0)  # cold at 9
    costs.observe(None, 8, 0.0, 3.0)  # 9 measured as remembered: median ratio (0.5, 1) ->
    assert costs.verify(13) == pytest.approx(4.0 * 1.0)  # the upper of the two
    assert Costs.restore(remembered).verify(9) == pytest.approx(3.0)  # none measured: as then


def test_auto_lookahead_starts_by_timing_the_target_then_the_source() -> None:
    policy = AdaptiveLookahead()
    assert policy.plan([MODEL], 100) == TARGET_ALONE
    policy.observe(TARGET_ALONE, 0, 0, 0.0, 3.0)  # a cold first decode: its time is dropped
    assert policy.plan([MODEL], 100) == TARGET_ALONE
    policy.observe(TARGET_ALONE, 0, 0, 0.0, 1.0)
    assert policy.costs.verify(1) == pytest.approx(1.0)
    probe = policy.plan([MODEL], 100)
    assert probe.offer == MODEL and probe.probe and probe.lookahead == TIMING_LOOKAHEAD
    # Free guesses need no timing; the budget and the offer's own limit cap K.
    assert policy.plan([Offer("ngram", "ngram2", 2, (5, 6))], 100).lookahead == 2
    assert policy.plan([MODEL], 1).lookahead == 1


def test_remembered_costs_need_no_timing_cycles_and_drop_this_process_cold_sample() -> None:
    """Costs kept by an earlier process (a JSON round trip) are trusted at once: the first
    cycle drafts. Each remembered cost then follows this process, whose first (cold) sample
    of it is dropped."""
    learned = Costs()
    for _ in range(3):
        learned.observe(None, 0, 0.0, 1.0)
        learned.observe("model", 4, 4 * 0.3, cpu_verify(5))
    snapshot = json.loads(json.dumps(learned.snapshot()))
    costs = Costs.restore(snapshot)
    assert costs.verify(1) == pytest.approx(1.0) and costs.guess("model") == pytest.approx(0.3)
    assert costs.verify(5) == pytest.approx(cpu_verify(5))
    first = AdaptiveLookahead(costs).plan([MODEL], 100)
    assert first.offer == MODEL and first.lookahead >= 1 and not first.probe  # no timing
    assert AdaptiveLookahead(Costs()).plan([MODEL], 100) == TARGET_ALONE  # fresh: timing
    costs.observe(None, 0, 0.0, 3.0)  # this process's first, cold, target step: dropped
    assert costs.verify(1) == pytest.approx(1.0)
    costs.observe(None, 0, 0.0, 2.0)  # then measured here: that replaces the remembered mean
    assert costs.verify(1) == pytest.approx(2.0)
    costs.observe(None, 0, 0.0, 1.0)  # and is followed
    assert costs.verify(1) == pytest.approx((0.8 * 2.0 + 1.0) / 1.8)
    assert Costs.restore({}).verify(1) is None


def generations(costs: Costs, n: int, draft: float, cycles: int = 100,
                processes: bool = True) -> list[list[int]]:
    """The K's chosen in ``n`` generations that share ``costs``, each through a JSON round
    trip of them (a process each) unless not ``processes`` (one process, as a server); every
    guess is rejected and costs ``draft``."""
    chosen = []
    for _ in range(n):
        if processes:
            costs = Costs.restore(json.loads(json.dumps(costs.snapshot())))
        policy = AdaptiveLookahead(costs)
        ks = []
        for _ in range(cycles):
            plan = policy.plan([MODEL], 100)
            ks.append(plan.lookahead)
            policy.observe(plan, plan.lookahead, 0, draft * plan.lookahead, cpu_verify(1))
        chosen.append(ks)
    return chosen


def test_a_remembered_cost_that_rules_a_draft_out_holds_and_is_timed_now_and_then() -> None:
    """A draft remembered as too slow to ever pay stays off with no probe while the target runs
    as fast as when the costs were kept, for RECHECK_AFTER processes in a row; the next one
    times it with one guess (it still measures too slow: off again, counting afresh). On a
    machine running otherwise now, the draft is timed here before it is given up."""
    remembered = {"per_guess": {"model": 5.0}, "verify_by_n": {"1": 1.0, "4": 1.45}}
    chosen = generations(Costs.restore(remembered), 2 * RECHECK_AFTER + 2, draft=5.0)
    timed = [i for i, ks in enumerate(chosen) if any(ks)]
    assert timed == [RECHECK_AFTER, 2 * RECHECK_AFTER + 1]
    assert chosen[RECHECK_AFTER].count(TIMING_LOOKAHEAD) == 1 and max(chosen[RECHECK_AFTER]) == 1
    # One process (a server), many generations: timed once at most.
    in_one = generations(Costs.restore(remembered), 3 * RECHECK_AFTER, 5.0, processes=False)
    assert sum(map(sum, in_one)) == TIMING_LOOKAHEAD
    faster_now = AdaptiveLookahead(Costs.restore(remembered))
    for _ in range(2):  # the target runs twice as fast as remembered: the costs are stale
        assert faster_now.plan([MODEL], 100) == TARGET_ALONE
        faster_now.observe(TARGET_ALONE, 0, 0, 0.0, 0.5)
    timing = faster_now.plan([MODEL], 100)
    assert timing.probe and timing.lookahead == TIMING_LOOKAHEAD
    faster_now.observe(timing, 1, 1, 0.05, 0.6)
    half = lambda n: cpu_verify(n) / 2  # noqa: E731
    rate, chosen_k = simulate(faster_now, [0.9], 0.05, half, cycles=300)
    assert chosen_k.get(0, 0) < 30 and rate > 1.5 * 2


def test_one_slow_target_step_does_not_throw_the_remembered_costs_away() -> None:
    """The target's speed is compared with the remembered one by its fastest step here: a
    step slowed by something else running keeps the costs; a machine that runs otherwise
    (every step slower, or faster) drops them."""
    remembered = {"per_guess": {"model": 0.3}, "verify_by_n": {"1": 1.0, "5": cpu_verify(5)}}
    for steps, same in [((1.0, 1.6), True), ((1.7, 1.02), True), ((1.5, 1.4), False),
                        ((0.6, 0.62), False)]:
        costs = Costs.restore(remembered)
        assert costs.as_remembered() is None
        for seconds in steps:
            costs.observe(None, 0, 0.0, seconds)
        assert costs.as_remembered() is same, steps


def test_a_draft_remembered_too_slow_by_a_busy_moment_speculates_again() -> None:
    """A draft cost remembered from a busy moment (six times its true cost, enough to rule
    the draft out) does not turn speculation off for good: within RECHECK_AFTER + 1
    generations one times the draft, finds it fast, and speculates; the costs kept from then
    on hold the corrected figure."""
    remembered = {"per_guess": {"model": 1.8}, "verify_by_n": {"1": 1.0, "5": cpu_verify(5)}}
    costs = Costs.restore(remembered)
    for _ in range(RECHECK_AFTER):
        policy = AdaptiveLookahead(costs)
        rate, chosen_k = simulate(policy, [0.9], 0.3, cpu_verify, cycles=50)
        assert chosen_k == {0: 50}
        costs = Costs.restore(json.loads(json.dumps(costs.snapshot())))
    policy = AdaptiveLookahead(costs)
    rate, chosen_k = simulate(policy, [0.9], 0.3, cpu_verify, cycles=200)
    assert chosen_k.get(0, 0) < 20, chosen_k
    assert policy.costs.guess("model") == pytest.approx(0.3)
    kept = Costs.restore(json.loads(json.dumps(policy.costs.snapshot())))
    assert kept.guess("model") == pytest.approx(0.3) and kept.unchecked == {}


def test_the_draft_reads_text_it_missed_apart_from_its_guesses() -> None:
    """After the target ran alone, the draft model catches up in one batch, timed apart: that
    time is not a cost of the guesses that follow."""
    draft = FakeModel(call_seconds=0.0, token_seconds=0.002)
    drafter = ModelDrafter(draft)
    prompt = [1, 2, 3]
    drafter.begin([*prompt, 4])
    context = [*prompt, *range(4, 30)]  # 25 tokens the draft has not seen
    proposal = drafter.propose(context, MODEL, 3, GREEDY, np.random.default_rng(0))
    assert draft.decode_calls[1] == (25, 0) and proposal.catch_up_seconds >= 0.002 * 25
    assert draft.cache[: len(context)] == context and len(proposal.tokens) == 3
    drafter.settle(1)
    usual = drafter.propose(context + [proposal.tokens[0], 9], MODEL, 2, GREEDY,
                            np.random.default_rng(0))
    assert usual.catch_up_seconds == 0.0  # one kept guess and a drawn token: the usual feed


def test_the_draft_reads_only_the_latest_of_a_long_stretch_it_missed() -> None:
    """Of a stretch longer than CATCH_UP_WINDOW the draft reads the latest part (its cache then
    skips the rest), and from there it follows the context as usual, rollbacks included."""
    draft = FakeModel(call_seconds=0.0, token_seconds=0.002)
    drafter = ModelDrafter(draft)
    drafter.begin([1, 2, 3, 4])
    missed = list(range(4, 4 + CATCH_UP_WINDOW + 20))
    context = [1, 2, 3, *missed]
    proposal = drafter.propose(context, MODEL, 3, GREEDY, np.random.default_rng(0))
    assert draft.decode_calls[1] == (CATCH_UP_WINDOW, 0)
    assert draft.cache == [1, 2, 3, *missed[-CATCH_UP_WINDOW - 1 :], *proposal.tokens[:2]]
    drafter.settle(1)  # the first guess survived, then the target drew 9
    assert draft.cache[-2:] == [missed[-1], proposal.tokens[0]]
    context += [proposal.tokens[0], 9]
    usual = drafter.propose(context, MODEL, 2, GREEDY, np.random.default_rng(0))
    assert usual.catch_up_seconds == 0.0 and draft.decode_calls[-2][0] == 1  # only the 9
    drafter.settle(0)
    assert draft.cache[-3:] == [missed[-1], proposal.tokens[0], 9]
    # A new generation that shares the prompt cannot reuse a cache with a gap: it reads anew.
    drafter.begin([1, 2, 3, 4, 5], reuse_prefix=True)
    draft.decode_calls.clear()
    drafter.propose([1, 2, 3, 4, 5], MODEL, 1, GREEDY, np.random.default_rng(0))
    assert draft.decode_calls[0] == (4, 0) and draft.cache == [1, 2, 3, 4, 5]


def test_a_model_run_that_switched_to_a_match_is_learned_under_both_keys() -> None:
    """The model's guesses teach the model's key and its cost per guess; the match's free
    guesses teach the match's key and cost nothing."""
    policy = AdaptiveLookahead(Costs())
    match = Offer("ngram", "ngram3", 8, (5, 6, 7))
    # 2 model guesses (0.2 s) then 3 from the match; the first 4 of the 5 survived.
    policy.observe(Plan(MODEL, 5), 5, 4, 0.2, 1.0, switch=(match, 3))
    assert policy.costs.guess("model") == pytest.approx(0.1)
    assert policy.costs.guess("ngram") is None and 6 in policy.costs.verify_by_n
    assert policy.acceptance["model"].pooled() == (2.0, 2.0)
    assert policy.acceptance["ngram3"].pooled() == (2.0, 3.0)
    # A rejection among the model's guesses: the match's guesses were never judged.
    policy.observe(Plan(MODEL, 5), 5, 1, 0.2, 1.0, switch=(match, 3))
    assert policy.acceptance["ngram3"].pooled() == (2.0, 3.0)  # nothing learned about it
    assert policy.acceptance["model"].kept[:2] == pytest.approx([1.9, 0.9])


def test_auto_lookahead_picks_the_better_source_per_cycle() -> None:
    policy = AdaptiveLookahead(Costs())
    ngram = Offer("ngram", "ngram4", 16)
    policy.observe(TARGET_ALONE, 0, 0, 0.0, 1.0)
    policy.observe(TARGET_ALONE, 0, 0, 0.0, 1.0)
    for _ in range(30):
        policy.observe(Plan(MODEL, 4), 4, 2, 4 * 0.4, cpu_verify(5))
        policy.observe(Plan(ngram, 8), 8, 8, 1e-5, cpu_verify(9))
    assert policy.plan([ngram, MODEL], 100).offer == ngram
    weak = Offer("ngram", "ngram1", 16)
    for _ in range(30):
        policy.observe(Plan(weak, 2), 2, 0, 1e-5, cpu_verify(3))
    assert policy.plan([weak, MODEL], 100).offer == MODEL


def test_fixed_lookahead_takes_the_first_offer() -> None:
    policy = FixedLookahead(6)
    assert policy.plan([Offer("ngram", "ngram3", 2), MODEL], 100) == \
        Plan(Offer("ngram", "ngram3", 2), 2)
    assert policy.plan([], 100) == TARGET_ALONE
    assert FixedLookahead(0).plan([MODEL], 100) == TARGET_ALONE


def test_verify_cost_is_measured_where_seen_and_fitted_elsewhere() -> None:
    costs = Costs()
    assert costs.verify(3) is None
    costs.observe(None, 0, 0.0, 1.0)
    assert costs.verify(5) == 1.0  # one point: flat
    costs.observe("model", 4, 1.6, 1.6)
    assert costs.verify(1) == pytest.approx(1.0) and costs.verify(5) == pytest.approx(1.6)
    assert costs.verify(9) == pytest.approx(2.2)
    assert costs.guess("model") == pytest.approx(0.4)


def test_verify_costs_never_fall_as_the_pass_grows() -> None:
    """A length measured slow in a busy moment is held to the cheapest longer pass: otherwise
    auto would avoid that length, and the ones below a cheaper-looking longer pass, and never
    measure it again."""
    costs = Costs()
    for seconds, n, times in ((1.0, 1, 2), (3.0, 7, 2), (2.0, 9, 5)):
        for _ in range(times):  # each n's first sample runs cold and is dropped
            costs.observe(None, n - 1, 0.0, seconds)
    # The line: the median of the slopes (1/3, 1/8, -1/2) is 1/8; 9 lies on it, 7 far above.
    assert costs.verify(9) == pytest.approx(2.0)
    assert costs.verify(7) == pytest.approx(2.0) and costs.verify(8) == pytest.approx(2.0)
    assert costs.verify(1) == pytest.approx(1.0)
    assert costs.verify(4) == pytest.approx(0.875 + 0.125 * 4)  # the line, within neighbours
    assert costs.verify(30) == pytest.approx(0.875 + 0.125 * 30)  # past the longest
    steps = [costs.verify(n) for n in range(1, 33)]
    assert all(a <= b for a, b in zip(steps, steps[1:]))


def test_a_far_off_remembered_or_cold_verify_figure_gives_way_to_the_line() -> None:
    """Each length leans on the line through all lengths (the median of the slopes) as much
    as on one sample of it: one figure far off, remembered or a cold first decode here, moves
    the line little, and a length decoded once is neither trusted nor remembered."""
    remembered = {"verify_by_n": {"1": 1.0, "5": 2.0, "6": 9.0, "9": 3.0, "13": 4.0}}
    costs = Costs.restore(remembered)  # the line: 0.75 + 0.25 n, through all but 6
    assert costs.verify(6) == pytest.approx(3.0)  # halfway to the line, held to 9's
    assert costs.verify(9) == pytest.approx(3.0) and costs.verify(17) == pytest.approx(5.0)
    costs.observe(None, 19, 0.0, 12.0)  # n = 20 decoded once: its cold first decode
    assert costs.verify(20) == pytest.approx(5.75)
    assert "20" not in costs.snapshot()["verify_by_n"]
    costs.observe(None, 19, 0.0, 6.0)  # decoded again, warm: one sample against the line's
    assert costs.verify(20) == pytest.approx((6.0 + 5.75) / 2)
    for _ in range(20):  # many samples: the measurement outweighs the line
        costs.observe(None, 19, 0.0, 6.0)
    assert 5.9 < costs.verify(20) < 6.0
    snapshot = json.loads(json.dumps(costs.snapshot()))
    assert snapshot["verify_by_n"]["20"] == pytest.approx(6.0)
    assert Costs.restore(snapshot).verify(20) == pytest.approx(costs.verify(20))  # its weight


def test_auto_on_the_engine_is_exact_in_greedy_and_reports_its_choices() -> None:
    target, draft = FakeModel(), FakeModel(noise=0.3, salt=7)
    alone, _ = run(SpeculativeEngine(FakeModel()), GenerationConfig(0, GREEDY, 120), [1, 2, 3])
    tokens, stats = run(SpeculativeEngine(target, ModelDrafter(draft)),
                        GenerationConfig("auto", GREEDY, 120), [1, 2, 3])
    assert tokens == alone
    summary = stats.lookahead_summary()
    assert summary["target_alone_cycles"] >= 1 and summary["probes"] >= 1
    assert sum(stats.k_counts.values()) == stats.n_cycles
    assert stats.as_dict()["drafters"]["model"]["drafted"] == stats.n_drafted
