"""The lookahead policy on fakes: fixed K, and ``-k auto`` against worlds of known costs and
acceptance, over generations and processes."""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pytest

from specgen.core.sampling import SamplingParams
from specgen.core.speculative import expected_tokens_by_position
from specgen.drafters import TARGET_ALONE, Candidate, ModelDrafter, NgramTail, Plan
from specgen.engine import CycleDone, GenerationConfig, SpeculativeEngine
from specgen.lookahead import AdaptiveLookahead, FixedLookahead, PairProfile
from specgen.lookahead.adaptive import GROWTH_FIRST
from specgen.lookahead.explore import RECHECK_AFTER, TIMING_LOOKAHEAD
from tests.fakes import FakeClock, FakeModel, cpu_verify, run_to_end

GREEDY = SamplingParams(temperature=0)


# -- the lookahead policy ----------------------------------------------------------------------

MODEL = Candidate("model", "model", 10_000)


def simulate(
    policy, accept: Sequence[float], draft: float, verify, cycles: int = 3000, seed: int = 0
) -> tuple[float, dict[int, int]]:
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


@pytest.mark.parametrize(
    "accept, draft",
    [
        ([0.9, 0.85, 0.8, 0.75, 0.7, 0.6, 0.5], 0.2),  # falling along the cycle, cheap draft
        ([0.98], 0.42),  # one network at two precisions
        ([0.7, 0.5, 0.3], 0.3),  # a draft that disagrees often
    ],
)
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
    """The first cycles time verify passes of 1 and 2 tokens, the steepest part of a CPU's
    curve; a draft that pays only at long K (11, not 1) must still be found to pay: what every
    guess surviving could give is bounded with a pass never dearer than the longest measured,
    not with the line through those first two."""
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


@pytest.mark.parametrize(
    "accept, draft",
    [
        ([0.98], 0.42),  # long cycles pay
        ([0.9, 0.85, 0.8, 0.75, 0.7, 0.6, 0.5], 0.2),  # falling along the cycle
    ],
)
def test_a_new_generation_starts_from_the_typical_acceptance(accept, draft) -> None:
    """Acceptance by position is learned afresh each generation, starting from what is typical
    of the pair (kept with the costs): short answers run near the best K from their first
    cycle instead of climbing to it; the first plan is already near the optimum."""
    best = max(exact_rate(accept, k, draft, cpu_verify) for k in range(1, 33))

    def short_answers(keep_typical: bool) -> float:
        costs, rates = PairProfile(), []
        for generation in range(30):
            if not keep_typical:
                costs.typical.clear()
            policy = AdaptiveLookahead(costs)
            rates.append(simulate(policy, accept, draft, cpu_verify, cycles=8, seed=generation)[0])
        return float(np.mean(rates[5:]))  # the costs are known by then either way

    with_typical, without = short_answers(True), short_answers(False)
    assert with_typical >= 0.9 * best and with_typical > without
    costs = PairProfile()
    simulate(AdaptiveLookahead(costs), accept, draft, cpu_verify, cycles=400)
    restored = PairProfile.restore(json.loads(json.dumps(costs.snapshot())))
    first = AdaptiveLookahead(restored).plan([MODEL], 10_000).lookahead
    assert exact_rate(accept, first, draft, cpu_verify) >= 0.95 * best, first


def test_one_early_rejection_does_not_undo_what_is_typical_but_a_hard_text_does() -> None:
    """A generation moves the pair's typical acceptance by one shift fitted to all its guesses:
    on a pair that keeps 97% of its guesses, one cycle that fails at its third guess is chance,
    and K stays near the best; a text where guesses keep failing early cuts K."""
    accept, draft = [0.97], 0.42
    best_k = max(range(1, 33), key=lambda k: exact_rate(accept, k, draft, cpu_verify))
    costs = PairProfile()
    simulate(AdaptiveLookahead(costs), accept, draft, cpu_verify, cycles=400)
    policy = AdaptiveLookahead(costs)
    first = policy.plan([MODEL], 10_000)
    policy.observe(
        first, first.lookahead, 2, draft * first.lookahead, cpu_verify(first.lookahead + 1)
    )
    after_one = policy.plan([MODEL], 10_000).lookahead
    assert exact_rate(accept, after_one, draft, cpu_verify) >= 0.97 * exact_rate(
        accept, best_k, draft, cpu_verify
    ), after_one
    for _ in range(6):  # this text: the second guess fails every time
        plan = policy.plan([MODEL], 10_000)
        policy.observe(
            plan,
            plan.lookahead,
            min(1, plan.lookahead),
            draft * plan.lookahead,
            cpu_verify(plan.lookahead + 1),
        )
    assert policy.plan([MODEL], 10_000).lookahead <= 2


def test_a_models_guesses_grow_to_twice_the_longest_run_this_text_kept() -> None:
    """Where every guess survives and long cycles pay most, K for a draft model still ramps up
    (8, then twice the longest run kept: 16, 32), so one long cycle that fails early cannot cost
    much more than the cycles before it saved; a rejection early on holds it; free n-gram
    guesses are not held back."""
    costs = PairProfile()
    simulate(AdaptiveLookahead(costs), [1.0], 0.05, cpu_verify, cycles=200)  # learns: long pays
    assert AdaptiveLookahead(costs).plan([MODEL], 10_000).lookahead == GROWTH_FIRST
    policy = AdaptiveLookahead(costs)
    ks = []
    for _ in range(4):
        plan = policy.plan([MODEL], 10_000)
        ks.append(plan.lookahead)
        policy.observe(
            plan,
            plan.lookahead,
            plan.lookahead,
            0.05 * plan.lookahead,
            cpu_verify(plan.lookahead + 1),
        )
    assert ks == [8, 16, 32, 32]
    policy = AdaptiveLookahead(costs)
    plan = policy.plan([MODEL], 10_000)
    policy.observe(plan, plan.lookahead, 3, 0.05 * plan.lookahead, cpu_verify(9))
    assert policy.plan([MODEL], 10_000).lookahead <= GROWTH_FIRST
    ngram = Candidate("ngram", "ngram4", 32, tuple(range(32)))
    costs.typical["ngram4"] = costs.typical["model"]
    assert AdaptiveLookahead(costs).plan([ngram], 10_000).lookahead > 2 * GROWTH_FIRST


def test_auto_lookahead_starts_by_timing_the_target_then_the_source() -> None:
    policy = AdaptiveLookahead()
    assert policy.plan([MODEL], 100) == TARGET_ALONE
    policy.observe(TARGET_ALONE, 0, 0, 0.0, 3.0)  # a cold first decode: its time is dropped
    assert policy.plan([MODEL], 100) == TARGET_ALONE
    policy.observe(TARGET_ALONE, 0, 0, 0.0, 1.0)
    assert policy.profile.verify(1) == pytest.approx(1.0)
    probe = policy.plan([MODEL], 100)
    assert probe.candidate == MODEL and probe.explore and probe.lookahead == TIMING_LOOKAHEAD
    # Free guesses need no timing; the budget and the offer's own limit cap K.
    assert policy.plan([Candidate("ngram", "ngram2", 2, (5, 6))], 100).lookahead == 2
    assert policy.plan([MODEL], 1).lookahead == 1


def generations(
    costs: PairProfile, n: int, draft: float, cycles: int = 100, processes: bool = True
) -> list[list[int]]:
    """The K's chosen in ``n`` generations that share ``costs``, each through a JSON round
    trip of them (a process each) unless not ``processes`` (one process, as a server); every
    guess is rejected and costs ``draft``."""
    chosen = []
    for _ in range(n):
        if processes:
            costs = PairProfile.restore(json.loads(json.dumps(costs.snapshot())))
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
    chosen = generations(PairProfile.restore(remembered), 2 * RECHECK_AFTER + 2, draft=5.0)
    timed = [i for i, ks in enumerate(chosen) if any(ks)]
    assert timed == [RECHECK_AFTER, 2 * RECHECK_AFTER + 1]
    assert chosen[RECHECK_AFTER].count(TIMING_LOOKAHEAD) == 1 and max(chosen[RECHECK_AFTER]) == 1
    # One process (a server), many generations: timed once at most.
    in_one = generations(PairProfile.restore(remembered), 3 * RECHECK_AFTER, 5.0, processes=False)
    assert sum(map(sum, in_one)) == TIMING_LOOKAHEAD
    faster_now = AdaptiveLookahead(PairProfile.restore(remembered))
    for _ in range(2):  # the target runs twice as fast as remembered: the costs are stale
        assert faster_now.plan([MODEL], 100) == TARGET_ALONE
        faster_now.observe(TARGET_ALONE, 0, 0, 0.0, 0.5)
    timing = faster_now.plan([MODEL], 100)
    assert timing.explore and timing.lookahead == TIMING_LOOKAHEAD
    faster_now.observe(timing, 1, 1, 0.05, 0.6)
    half = lambda n: cpu_verify(n) / 2  # noqa: E731
    rate, chosen_k = simulate(faster_now, [0.9], 0.05, half, cycles=300)
    assert chosen_k.get(0, 0) < 30 and rate > 1.5 * 2


def test_a_draft_remembered_too_slow_by_a_busy_moment_speculates_again() -> None:
    """A draft cost remembered from a busy moment (six times its true cost, enough to rule
    the draft out) does not turn speculation off for good: within RECHECK_AFTER + 1
    generations one times the draft, finds it fast, and speculates; the costs kept from then
    on hold the corrected figure."""
    remembered = {"per_guess": {"model": 1.8}, "verify_by_n": {"1": 1.0, "5": cpu_verify(5)}}
    costs = PairProfile.restore(remembered)
    for _ in range(RECHECK_AFTER):
        policy = AdaptiveLookahead(costs)
        rate, chosen_k = simulate(policy, [0.9], 0.3, cpu_verify, cycles=50)
        assert chosen_k == {0: 50}
        costs = PairProfile.restore(json.loads(json.dumps(costs.snapshot())))
    policy = AdaptiveLookahead(costs)
    rate, chosen_k = simulate(policy, [0.9], 0.3, cpu_verify, cycles=200)
    assert chosen_k.get(0, 0) < 20, chosen_k
    assert policy.profile.guess("model") == pytest.approx(0.3)
    kept = PairProfile.restore(json.loads(json.dumps(policy.profile.snapshot())))
    assert kept.guess("model") == pytest.approx(0.3) and kept.left_off_untimed == {}


def test_a_model_run_that_switched_to_a_match_is_learned_under_both_keys() -> None:
    """The model's guesses teach the model's key and its cost per guess; the match's free
    guesses teach the match's key and cost nothing."""
    policy = AdaptiveLookahead(PairProfile())
    match = Candidate("ngram", "ngram3", 8, (5, 6, 7))
    # 2 model guesses (0.2 s) then 3 from the match; the first 4 of the 5 survived.
    policy.observe(Plan(MODEL, 5), 5, 4, 0.2, 1.0, ngram_tail=NgramTail(match, 3))
    assert policy.profile.guess("model") == pytest.approx(0.1)
    assert policy.profile.guess("ngram") is None and 6 in policy.profile.verify_by_n
    assert policy.acceptance["model"].pooled() == (2.0, 2.0)
    assert policy.acceptance["ngram3"].pooled() == (2.0, 3.0)
    # A rejection among the model's guesses: the match's guesses were never judged.
    policy.observe(Plan(MODEL, 5), 5, 1, 0.2, 1.0, ngram_tail=NgramTail(match, 3))
    assert policy.acceptance["ngram3"].pooled() == (2.0, 3.0)  # nothing learned about it
    assert policy.acceptance["model"].kept[:2] == pytest.approx([1.9, 0.9])


def test_auto_lookahead_picks_the_better_source_per_cycle() -> None:
    policy = AdaptiveLookahead(PairProfile())
    ngram = Candidate("ngram", "ngram4", 16)
    policy.observe(TARGET_ALONE, 0, 0, 0.0, 1.0)
    policy.observe(TARGET_ALONE, 0, 0, 0.0, 1.0)
    for _ in range(30):
        policy.observe(Plan(MODEL, 4), 4, 2, 4 * 0.4, cpu_verify(5))
        policy.observe(Plan(ngram, 8), 8, 8, 1e-5, cpu_verify(9))
    assert policy.plan([ngram, MODEL], 100).candidate == ngram
    weak = Candidate("ngram", "ngram1", 16)
    for _ in range(30):
        policy.observe(Plan(weak, 2), 2, 0, 1e-5, cpu_verify(3))
    assert policy.plan([weak, MODEL], 100).candidate == MODEL


def test_fixed_lookahead_takes_the_first_offer() -> None:
    policy = FixedLookahead(6)
    assert policy.plan([Candidate("ngram", "ngram3", 2), MODEL], 100) == Plan(
        Candidate("ngram", "ngram3", 2), 2
    )
    assert policy.plan([], 100) == TARGET_ALONE
    assert FixedLookahead(0).plan([MODEL], 100) == TARGET_ALONE


def test_auto_on_the_engine_is_exact_in_greedy_and_reports_its_choices() -> None:
    """On a fake clock (a target pass 10 ms plus 1 ms a token, a draft step 2 ms) auto is
    deterministic: it times the target alone twice (the first pass runs cold), then a draft
    guess twice, then drafts; greedy, the text is the target's own."""
    clock = FakeClock()
    target = FakeModel(call_seconds=0.010, token_seconds=0.001, clock=clock)
    draft = FakeModel(noise=0.3, salt=7, call_seconds=0.002, clock=clock)
    alone, _ = run_to_end(
        SpeculativeEngine(FakeModel()), GenerationConfig(0, GREEDY, 120), [1, 2, 3]
    )
    engine = SpeculativeEngine(target, ModelDrafter(draft, clock=clock), clock=clock)
    events = list(engine.generate([1, 2, 3], GenerationConfig("auto", GREEDY, 120)))
    cycles = [e for e in events if isinstance(e, CycleDone)][1:]  # after the prompt's own pass
    assert [c.drafted for c in cycles[:4]] == [0, 0, 1, 1] and all(c.drafted for c in cycles[4:])
    stats = events[-1].stats
    assert [t for e in events if isinstance(e, CycleDone) for t in e.tokens][:120] == alone
    summary = stats.lookahead_summary()
    assert summary["target_alone_cycles"] == 2 and summary["probes"] == 2
    assert sum(stats.k_counts.values()) == stats.n_cycles
    assert stats.as_dict()["drafters"]["model"]["drafted"] == stats.n_drafted
