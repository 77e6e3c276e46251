"""``-k auto`` in a batch (``lookahead.batch``): sequences sharing one target pass and one draft
context, against worlds of known batched costs and acceptance."""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import pytest

from specgen.core.speculative import expected_tokens
from specgen.drafters import Candidate, Plan
from specgen.lookahead import AdaptiveLookahead, BatchLoad, CostBook
from specgen.lookahead.batch import (
    FIRST_STEP_TOKENS,
    RETRY_BACKOFF_MAX,
    RETRY_FOR,
    RETRY_SHARE,
    TRUST_AFTER,
    WAVE_SECONDS,
    _Measured,
)
from specgen.lookahead.explore import BATCH_TIMING_LOOKAHEAD

MODEL = Candidate("model", "model", 10_000)
Curve = Callable[[int], float]


def simulate_batch(
    n: int,
    accept: float,
    draft: Curve,
    verify: Curve,
    cycles: int = 1500,
    seed: int = 0,
    unseen: float = 0.0,
    host: float = 0.0,
) -> tuple[float, dict[int, int]]:
    """``n`` sequences on ``-k auto`` in one batch, as ``engine.streams`` runs them: each cycle
    every sequence plans, the draft context decodes a step per guess of the longest over the
    sequences still drafting (the first step also reads a sequence's last kept guess where
    every guess survived), then one target pass verifies every [last, guesses]. ``unseen``:
    seconds a cycle with guesses also costs, outside the passes, which the formula cannot price
    (the host's work for its guesses); ``host``: seconds every cycle costs outside the passes,
    guessing or not (the loop's, a server's). Returns the batch's tokens per second and how
    often each K was chosen."""
    rng = np.random.default_rng(seed)
    load = BatchLoad(CostBook())
    policies = [AdaptiveLookahead(load.costs.of(True), load=load, slot=i) for i in range(n)]
    for i in range(n):
        load.join(i, True)
    full = [False] * n  # the last cycle kept every guess
    tokens = seconds = 0.0
    chosen: dict[int, int] = {}
    for _ in range(cycles):
        plans = []
        for i, policy in enumerate(policies):  # as the engine's sequences plan, one by one
            plans.append(policy.plan([MODEL], 10_000))
            load.planned(i, plans[-1].lookahead, "model" if plans[-1].lookahead else None)
        ks = [plan.lookahead for plan in plans]
        for step in range(1, max(ks, default=0) + 1):
            widths = [(2 if full[i] and step == 1 else 1) for i, k in enumerate(ks) if k >= step]
            cost = draft(sum(widths))
            load.observe_draft(cost, sum(widths), True, "model", len(widths))
            seconds += cost
        if unseen and any(ks):
            seconds += unseen
        seconds += host
        n_tokens = sum(k + 1 for k in ks)
        cost = verify(n_tokens)
        seconds += cost
        load.observe_target(cost, n_tokens, ended=seconds)
        for i, (policy, plan, k) in enumerate(zip(policies, plans, ks, strict=True)):
            kept = 0
            while kept < k and rng.random() < accept:
                kept += 1
            full[i] = k > 0 and kept == k
            policy.observe(plan, k, kept, 0.0, 0.0)
            load.report(i, kept + 1, k + 1, k, "model" if k else None)
            tokens += kept + 1
            chosen[k] = chosen.get(k, 0) + 1
    return tokens / seconds, chosen


def fixed_rate(
    n: int, accept: float, k: int, draft: Curve, verify: Curve, host: float = 0.0
) -> float:
    """The batch's expected tokens per second with every sequence at ``k`` (the first draft
    step counted at its most, two tokens a sequence), ``host`` seconds more a cycle."""
    steps = sum(draft(n * (FIRST_STEP_TOKENS if j == 1 else 1)) for j in range(1, k + 1))
    return n * expected_tokens(accept, k) / (steps + verify(n * (k + 1)) + host)


def cpu_target(n: int) -> float:
    """A CPU's target pass: every token more costs a third of one alone."""
    return 1.0 + 0.33 * (n - 1)


def cpu_draft(n: int) -> float:
    """A small draft on a CPU: half the target's step alone, as dear per token batched."""
    return 0.5 + 0.3 * (n - 1)


def gpu_target(n: int) -> float:
    """A GPU's target pass: nearly flat in its tokens."""
    return 1.0 + 0.01 * (n - 1)


def gpu_draft(n: int) -> float:
    return 0.08 + 0.001 * (n - 1)


def test_four_sequences_on_a_cpu_batch_plainly_where_drafting_costs_more_than_it_gives() -> None:
    """Where each sequence's guesses cost the batch more than they give, ``auto`` reaches
    plain batching's rate (no sequence settles on drafting because the others do)."""
    plain = fixed_rate(4, 0.8, 0, cpu_draft, cpu_target)
    best = max(fixed_rate(4, 0.8, k, cpu_draft, cpu_target) for k in range(9))
    assert best == plain, "the world is one where plain batching wins"
    rate, chosen = simulate_batch(4, 0.8, cpu_draft, cpu_target)
    assert rate >= 0.95 * plain, chosen
    assert chosen.get(0, 0) > 0.9 * sum(chosen.values()), chosen


def test_four_sequences_on_a_gpu_speculate_and_beat_plain_batching() -> None:
    """Where the target's pass is nearly flat, every sequence drafts, and the batch gets close
    to the best K all sequences could share, well above plain batching."""
    plain = fixed_rate(4, 0.9, 0, gpu_draft, gpu_target)
    best = max(fixed_rate(4, 0.9, k, gpu_draft, gpu_target) for k in range(1, 17))
    rate, chosen = simulate_batch(4, 0.9, gpu_draft, gpu_target)
    assert rate >= 0.85 * best and rate > 2 * plain, (rate, best, plain, chosen)


@pytest.mark.parametrize("n", [1, 2])
def test_one_or_two_cpu_sequences_still_draft_where_it_pays(n: int) -> None:
    """A cheap draft that is nearly always right pays on a CPU at one or two sequences."""
    draft = lambda m: 0.15 + 0.05 * (m - 1)  # noqa: E731
    best = max(fixed_rate(n, 0.95, k, draft, cpu_target) for k in range(1, 17))
    plain = fixed_rate(n, 0.95, 0, draft, cpu_target)
    assert best > 1.2 * plain, "the world is one where drafting pays"
    rate, chosen = simulate_batch(n, 0.95, draft, cpu_target)
    assert rate >= 0.85 * best, (rate, best, chosen)


def test_two_sequences_whose_drafts_pay_only_together_draft_together() -> None:
    """A draft whose step alone is a third of the target's, and dearer per sequence batched: one
    sequence drafting while the other waits barely pays, both drafting pays well. Each prices
    the other by what it gives as it goes now (one token a plain cycle), not by its mean over
    the cycles it drafted: priced so, the one that looks at a batch whose other just stopped
    sees that one's tokens without its draft steps, stops too, and the two take turns (here
    0.84x of the best fixed K; 0.95x at least now)."""
    draft = lambda m: 0.3 + 0.15 * (m - 1)  # noqa: E731
    verify = lambda m: 1.0 + 0.1 * (m - 1)  # noqa: E731
    best = max(fixed_rate(2, 0.95, k, draft, verify) for k in range(1, 17))
    assert best > 1.2 * fixed_rate(2, 0.95, 0, draft, verify), "the world is one where it pays"
    assert fixed_rate(1, 0.95, 5, draft, verify) > fixed_rate(1, 0.95, 0, draft, verify)
    rate, chosen = simulate_batch(2, 0.95, draft, verify)
    assert rate >= 0.95 * best, (rate, best, chosen)


def test_the_others_are_priced_by_what_they_give_as_they_go_now() -> None:
    """A sequence that guessed and kept five tokens a cycle, then went plain, gives the others'
    plans one token a cycle; once it plans guesses again in this cycle (``planned``), the ones
    that plan after it see those guesses, their draft steps and the five tokens again."""
    load = BatchLoad(CostBook())
    for slot in (0, 1):
        load.join(slot, True)
    profile = load.costs.of(True)
    for _ in range(6):
        load.report(1, 5, 8, 7, "model")
    assert load.others(0, profile).tokens == pytest.approx(5.0)
    load.report(1, 1, 1, 0, None)
    assert load.others(0, profile).tokens == 1.0
    load.planned(1, 6, "model")
    others = load.others(0, profile)
    assert others.tokens == pytest.approx(5.0)
    assert others.drafts == (6,) and others.verify_tokens == 7
    load.planned(1, 3, "ngram")  # free guesses: no draft step to ride on
    others = load.others(0, profile)
    assert others.drafts == () and others.verify_tokens == 4


def test_a_host_cost_every_cycle_pays_is_priced_so_fewer_longer_cycles_win() -> None:
    """Every cycle also costs the host a fixed time (the loop's work, a server's hand-offs),
    guessing or not: measured on the plain cycles, it is priced into every cycle, so two
    sequences draft where only the fewer cycles that guesses make pay for them (without it the
    formula saw plain batching win, and the batch stayed there)."""
    draft = lambda m: 0.35 + 0.2 * (m - 1)  # noqa: E731

    def rate_at(k: int, host: float) -> float:
        return fixed_rate(2, 0.95, k, draft, cpu_target, host)

    assert max(rate_at(k, 0.0) for k in range(1, 17)) < rate_at(0, 0.0), "no host: plain wins"
    plain, best = rate_at(0, 1.0), max(rate_at(k, 1.0) for k in range(1, 17))
    assert best > 1.3 * plain, "the world is one where the host's time makes drafting pay"
    rate, chosen = simulate_batch(2, 0.95, draft, cpu_target, host=1.0)
    assert rate >= 0.85 * best, (rate, best, plain, chosen)


def test_the_draft_steps_of_a_batch_are_priced_by_the_sequences_still_drafting() -> None:
    """A cycle's draft seconds: a step per guess of the longest drafter, each over the
    sequences still drafting, the first step reading two tokens of each."""
    load = BatchLoad(CostBook())
    assert load.draft_seconds_by_k(3, ()) is None  # nothing timed yet
    for n in (1, 2, 3, 4, 6, 8):
        for _ in range(3):
            load.observe_draft(0.01 * n, n, False, "model", 1)
    # This sequence 3 guesses, the others 1 and 4: steps over (2+2+2), (2), (2), (1) sequences.
    seconds = load.draft_seconds_by_k(3, (1, 4))
    assert seconds is not None
    assert seconds[3] == pytest.approx(0.06 + 0.02 + 0.02 + 0.01)
    assert load.draft_seconds_by_k(0, ()) == [0.0]


def test_every_k_s_draft_steps_priced_at_once_are_each_k_s_steps() -> None:
    """A plan prices every K in one go (``draft_seconds_by_k``): each the sum, step by step,
    of the passes over the sequences still drafting, whatever the others drafted."""
    import random

    load = BatchLoad(CostBook())
    for n, seconds in ((1, 0.010), (2, 0.013), (3, 0.017), (5, 0.022), (8, 0.040)):
        for _ in range(3):
            load.observe_draft(seconds, n, False, "model", 1)
    fit = load._fitted_draft()
    assert fit is not None

    def by_steps(k: int, others: tuple[int, ...]) -> float:
        total = 0.0
        for step in range(1, max(k, *others, 0) + 1):
            drafting = sum(1 for n in others if n >= step) + (1 if k >= step else 0)
            total += fit.at(drafting * (2 if step == 1 else 1))
        return total

    rng = random.Random(5)
    for _ in range(200):
        others = tuple(rng.randrange(0, 12) for _ in range(rng.randrange(0, 4)))
        others = tuple(n for n in others if n)
        limit = rng.randrange(0, 20)
        got = load.draft_seconds_by_k(limit, others)
        assert got is not None and len(got) == limit + 1
        assert got == pytest.approx([by_steps(k, others) for k in range(limit + 1)], rel=1e-12)


def test_a_step_for_several_sequences_is_not_one_guess_s_cost() -> None:
    """The profile's cost of a guess is one sequence's step: a single stream, and the next
    process, price the draft model by it. A batched step over eight costs several of one, and
    counted as one guess it would make the draft look dear to the next ``specgen run``. The
    batch's own steps still let the draft model be planned (priced by ``draft_seconds``)."""
    draft = lambda m: 0.004 + 0.002 * (m - 1)  # noqa: E731
    verify = lambda m: 0.05 + 0.0005 * (m - 1)  # noqa: E731 (flat: a GPU-like target)
    load = BatchLoad(CostBook())
    for slot in range(8):
        load.join(slot, True)
    profile = load.costs.of(True)
    for m in (8, 16, 24, 40):
        load.observe_target(verify(m), m, verifies=False)
    for width in (2, 4, 8, 16, 2, 4, 8):
        load.observe_draft(draft(width), width, True, "model", width)
    assert not profile.guess_timed("model")
    assert load.draft_timed()
    policy = AdaptiveLookahead(profile, load=load, slot=0)
    for _ in range(30):
        policy.observe(Plan(MODEL, 8), 8, 8, 0.0, 0.0)
    plan = policy.plan([MODEL], 10_000)
    assert plan.candidate == MODEL and plan.lookahead > 0 and not plan.explore
    for _ in range(2):  # one sequence's steps: these are its guess's cost
        load.observe_draft(draft(1), 1, True, "model", 1)
    assert profile.guess_timed("model")
    assert profile.guess("model") == pytest.approx(draft(1))


def test_a_fresh_batch_times_an_untimed_draft_with_one_sequence() -> None:
    """A guess's cost is the pair's: one sequence's two steps in one cycle time it for the
    batch. Four timing at once would have the draft read four prompts in one pass before the
    first guess, and another sequence timing the second step would have it read one more."""
    load = BatchLoad(CostBook())
    for slot in range(4):
        load.join(slot, True)
    for m in (4, 4, 8):
        load.observe_target(0.03 + 0.002 * m, m, verifies=False)
    profile = load.costs.of(True)
    policies = [AdaptiveLookahead(profile, load=load, slot=slot) for slot in range(4)]
    probe = Candidate("model", "model", 10_000, setup=11)

    def cycle() -> list[Plan]:
        plans = [policy.plan([probe], 100) for policy in policies]
        load.observe_target(0.04, 4 + sum(plan.lookahead for plan in plans))
        return plans

    plans = cycle()
    timing = [plan for plan in plans if plan.explore]
    assert len(timing) == 1 and timing[0].lookahead == BATCH_TIMING_LOOKAHEAD
    assert sum(plan.lookahead for plan in plans) == BATCH_TIMING_LOOKAHEAD
    for _ in range(2):  # the two steps, timed by the batch
        load.observe_draft(0.02, 2, True, "model", 1)
    assert load.draft_timed()
    assert not any(plan.explore for plan in cycle()), "timed: none times it again"


def test_a_sequence_does_not_draft_only_because_the_others_do() -> None:
    """Three sequences drafting 8 each pay for the draft's steps; a fourth's 8 guesses then add
    only their tokens to each step, and raise the batch's rate over it drafting none. But the
    batch with none drafting is faster still: the fourth drafts nothing (and so, in turn, do
    the others)."""
    draft = lambda m: 1.0 + 0.01 * (m - 1)  # noqa: E731 (a dear step, flat in its tokens)
    verify = lambda m: 1.0 + 0.1 * (m - 1)  # noqa: E731
    load = BatchLoad(CostBook())
    for slot in range(4):
        load.join(slot, True)
    for m in range(1, 40):
        for _ in range(3):
            load.observe_target(verify(m), m)
            load.observe_draft(draft(m), m, True, "model", m)
    policy = AdaptiveLookahead(load.costs.of(True), load=load, slot=0)
    rng = np.random.default_rng(1)
    for _ in range(40):  # it learns that 8 in 10 guesses survive
        kept = 0
        while kept < 8 and rng.random() < 0.8:
            kept += 1
        policy.observe(Plan(MODEL, 8), 8, kept, 0.0, 0.0)
    for slot in (1, 2, 3):
        for _ in range(5):
            load.report(slot, 4, 9, 8, "model")
    assert fixed_rate(4, 0.8, 0, draft, verify) > fixed_rate(4, 0.8, 8, draft, verify)
    assert policy.plan([MODEL], 10_000).lookahead == 0


def test_a_batch_that_measures_slower_with_guesses_stops_guessing() -> None:
    """Where every cycle with guesses also pays a cost the formula cannot see, the batch's own
    measure of its cycles with guesses and without turns guessing off (but for a retry now
    and then), and the batch runs near plain batching's rate."""
    plain = fixed_rate(4, 0.9, 0, gpu_draft, gpu_target)
    rate, chosen = simulate_batch(4, 0.9, gpu_draft, gpu_target, unseen=8.0)
    assert rate >= 0.85 * plain, (rate, plain, chosen)
    assert chosen.get(0, 0) > 0.8 * sum(chosen.values()), chosen


def _cycles(load: BatchLoad, count: int, seconds: float, guessed: bool) -> None:
    """``count`` cycles of two sequences, each keeping one token, in passes of ``seconds``
    (with guesses: each verified three tokens)."""
    width = 3 if guessed else 1
    for _ in range(count):
        load.observe_target(seconds, 2 * width)
        for slot in (0, 1):
            load.report(slot, 1, width, width - 1, "model" if guessed else None)


def _guessing_lost(plain_cycles: int = TRUST_AFTER) -> BatchLoad:
    """A batch of two greedy sequences that measured guessing slower: after two plain cycles,
    TRUST_AFTER cycles with guesses at 2 tokens a second, then ``plain_cycles`` plain ones at
    10 tokens a second."""
    load = BatchLoad(CostBook())
    for slot in (0, 1):
        load.join(slot, True)
    _cycles(load, 2, 0.2, guessed=False)
    _cycles(load, TRUST_AFTER, 1.0, guessed=True)  # 2 tokens a second
    _cycles(load, plain_cycles, 0.2, guessed=False)  # 10 tokens a second
    return load


def test_guessing_that_lost_is_retried_once_plain_cycles_took_many_times_its_loss() -> None:
    """After a run of cycles with guesses measured slower, none guesses until the plain cycles
    since took 1 / RETRY_SHARE times what that run lost; then RETRY_FOR cycles guess again."""
    load = _guessing_lost()
    assert load.guessing_loses()
    lost = TRUST_AFTER * 1.0 - 2 * TRUST_AFTER / 10.0  # the run's seconds, less plain's
    plain_cycles = round(lost / RETRY_SHARE / 0.2)
    _cycles(load, plain_cycles - TRUST_AFTER - 2, 0.2, guessed=False)
    assert load.guessing_loses(), "the wait is not yet 1 / RETRY_SHARE times the loss"
    _cycles(load, 4, 0.2, guessed=False)
    assert not load.guessing_loses(), "a retry"
    _cycles(load, RETRY_FOR - 1, 1.0, guessed=True)
    assert not load.guessing_loses(), "the retry runs its cycles"
    _cycles(load, 2, 1.0, guessed=True)
    assert load.guessing_loses(), "it lost again: the wait starts afresh"


def _plain_until_retry(load: BatchLoad, most: int = 10_000) -> int:
    """Plain cycles (0.2 s, as ``_guessing_lost``'s) until guessing is retried: how many."""
    for waited in range(most):
        if not load.guessing_loses():
            return waited
        _cycles(load, 1, 0.2, guessed=False)
    raise AssertionError("no retry")


def _retry(load: BatchLoad, seconds: float) -> None:
    """A retry's RETRY_FOR cycles with guesses, each of ``seconds``, then a pass that ends the
    last (its sequences report nothing)."""
    _cycles(load, RETRY_FOR, seconds, guessed=True)
    load.observe_target(0.2, 2)


def test_a_retry_that_loses_again_waits_twice_as_long_for_the_next() -> None:
    """Each retry that loses again doubles the weight of its loss, so the plain cycles before
    the next retry double (up to RETRY_BACKOFF_MAX times the first wait); the weight outlives
    the process, and a retry that wins starts it afresh."""
    load = _guessing_lost()
    waits = []
    for _ in range(6):
        waits.append(_plain_until_retry(load))
        _retry(load, 1.0)  # it loses again
    assert waits[1] == pytest.approx(2 * waits[0], rel=0.05)
    assert waits[2] == pytest.approx(4 * waits[0], rel=0.05)
    assert waits[5] == pytest.approx(RETRY_BACKOFF_MAX * waits[0], rel=0.05)
    measured = load.measured[2, True]
    assert measured.weight == RETRY_BACKOFF_MAX
    restarted = _restarted(load)
    assert restarted.measured.get((2, True)) is None
    assert _plain_until_retry(restarted) == pytest.approx(waits[5], rel=0.05)
    _retry(restarted, 1.0)
    again = restarted.measured[2, True]
    assert restarted.guessing_loses() and again.weight == RETRY_BACKOFF_MAX, "still the most"
    load.measured[2, True].retry_left = RETRY_FOR
    _cycles(load, 60, 0.05, guessed=True)  # now 40 tokens a second
    assert not load.guessing_loses() and measured.weight == 1.0


def test_a_verdict_s_weight_is_kept_apart_and_a_file_without_weights_reads_as_once() -> None:
    """The costs file keeps each verdict's three figures where an earlier specgen reads them,
    and the weights apart; a file written before weights were kept reads as weighed once."""
    load = _guessing_lost()
    load.measured[2, True].weight = 4.0
    load.observe_target(0.2, 2)
    snapshot = json.loads(json.dumps(load.costs.snapshot()))
    rates = snapshot["greedy"]["batch_rates"]["guessing"]["2"]
    assert len(rates) == 3
    assert snapshot["greedy"]["batch_weights"]["guessing"]["2"] == 4.0
    assert CostBook.restore(snapshot).greedy.batch_rates["guessing"][2] == pytest.approx(
        [*rates, 4.0]
    )
    del snapshot["greedy"]["batch_weights"]
    kept = CostBook.restore(snapshot)
    assert kept.greedy.batch_rates["guessing"][2] == pytest.approx([*rates, 1.0])


def test_the_retry_costs_a_bounded_share_however_dear_a_cycle_with_guesses_is() -> None:
    """A cycle with guesses that also costs the host twenty times a plain cycle: over a long
    run the batch stays within a few percent of plain batching, and still retries."""
    plain = fixed_rate(4, 0.9, 0, gpu_draft, gpu_target)
    rate, chosen = simulate_batch(4, 0.9, gpu_draft, gpu_target, cycles=6000, unseen=20.0)
    assert rate >= 0.93 * plain, (rate, plain, chosen)
    guessing = sum(n for k, n in chosen.items() if k)
    assert guessing > 4 * (TRUST_AFTER + RETRY_FOR), chosen


def test_a_batch_measures_its_cycles_by_the_wall_clock_less_the_draft_s_reads() -> None:
    """A cycle is the time from one target pass's end to the next (the host's time in it too),
    less the draft's reads: a run of guesses that began with a long read (a prompt's, a
    catch-up's: what starting to guess costs, which the formula prices) measures what its
    cycles gave, and beats plain cycles that spend most of their time on the host."""
    load = BatchLoad(CostBook())
    for slot in (0, 1):
        load.join(slot, True)
    clock = 0.0

    def cycle(pass_seconds: float, host: float, kept: int, read: float = 0.0) -> None:
        nonlocal clock
        if read:
            load.observe_draft(read, 64, False, "model", 1)
        clock += read + host + pass_seconds
        width = 3 if kept > 1 else 1
        load.observe_target(pass_seconds, 2 * width, ended=clock)
        for slot in (0, 1):
            load.report(slot, kept, width, width - 1, "model" if width > 1 else None)

    clock = 0.5
    load.observe_target(0.5, 20, verifies=False, ended=clock)  # the prompts
    for _ in range(2 + TRUST_AFTER):
        cycle(0.1, 0.2, 1)  # plain: 2 tokens in 0.3 s
    cycle(0.2, 0.1, 3, read=5.0)  # the read first, then guesses: 6 tokens in 0.3 s
    for _ in range(TRUST_AFTER):
        cycle(0.2, 0.1, 3)
    measured = load.measured[2, True]
    assert measured.plain.rate == pytest.approx(2 / 0.3)
    assert measured.guessed.rate == pytest.approx(6 / 0.3)
    assert not load.guessing_loses()


def _restarted(load: BatchLoad, greedy: bool = True) -> BatchLoad:
    """A batch of two in a new process (a server restarted), from the costs ``load``'s left
    in the file."""
    costs = CostBook.restore(json.loads(json.dumps(load.costs.snapshot())))
    restarted = BatchLoad(costs)
    for slot in (0, 1):
        restarted.join(slot, greedy)
    return restarted


def test_what_a_batch_measured_of_guessing_outlives_its_process_for_its_mode() -> None:
    """A batch of two that measured guessing slower leaves that verdict in the costs file: the
    next process's batch of two in that mode guesses nothing from its first cycle, and retries
    as late as the first process would have; the other mode, another size and a batch of both
    modes start with nothing measured."""
    load = _guessing_lost()
    load.observe_target(0.2, 2)
    assert load.guessing_loses() and load.drafting_loses()
    restarted = _restarted(load)
    assert restarted.guessing_loses() and restarted.drafting_loses(), "from the first cycle"
    lost = TRUST_AFTER * 1.0 - 2 * TRUST_AFTER / 10.0  # the run's seconds, less plain's
    _cycles(restarted, round(0.9 * lost / RETRY_SHARE / 0.2), 0.2, guessed=False)
    assert restarted.guessing_loses(), "the wait is not yet 1 / RETRY_SHARE times the loss"
    _cycles(restarted, round(0.2 * lost / RETRY_SHARE / 0.2), 0.2, guessed=False)
    assert not restarted.guessing_loses(), "a retry"
    sampled = _restarted(load, greedy=False)
    assert not sampled.guessing_loses() and not sampled.drafting_loses()
    mixed = _restarted(load)
    mixed.join(2, False)
    assert not mixed.guessing_loses()
    mixed.leave(2)
    mixed.observe_target(0.2, 2)
    assert mixed.guessing_loses(), "the batch of two greedy sequences again"
    bigger = _restarted(load)
    bigger.join(2, True)
    assert not bigger.guessing_loses()


def test_a_remembered_verdict_gives_way_to_what_this_process_measures() -> None:
    """Rates remembered from an earlier process weigh a few cycles: where guessing now measures
    faster (other texts, another load on the machine), the batch guesses again soon."""
    load = _guessing_lost(20 * TRUST_AFTER)  # trusted over many cycles
    restarted = _restarted(load)
    assert restarted.guessing_loses()
    measured = restarted.measured[2, True]
    assert measured.guessed.rate == pytest.approx(2.0)
    measured.retry_left = RETRY_FOR  # a retry, as the wait above gives one
    _cycles(restarted, 2 * TRUST_AFTER, 0.1, guessed=True)  # now 20 tokens a second
    _cycles(restarted, 1, 0.2, guessed=False)
    assert measured.guessed.rate > measured.plain.rate
    assert not restarted.guessing_loses()
    kept = CostBook.restore(json.loads(json.dumps(restarted.costs.snapshot())))
    with_it, without, _, _ = kept.greedy.batch_rates["guessing"][2]
    assert with_it > without, "the new verdict is what the next process starts from"


def test_a_remembered_verdict_that_guessing_wins_weighs_the_cycles_behind_it() -> None:
    """A batch that measured guessing faster over many cycles leaves the seconds behind that
    rate in the costs file: a new process's first unlucky cycles with guesses (a long guess
    that missed) do not overturn it, as they would a verdict weighed as one cycle (a file
    written before the seconds were kept), and many such cycles still do, as they would have
    had the earlier process gone on."""
    load = BatchLoad(CostBook())
    for slot in (0, 1):
        load.join(slot, True)
    _cycles(load, TRUST_AFTER, 0.2, guessed=False)  # 10 tokens a second
    _cycles(load, 40, 0.1, guessed=True)  # 20 tokens a second
    load.observe_target(0.2, 2)
    assert not load.guessing_loses()
    snapshot = json.loads(json.dumps(load.costs.snapshot()))
    behind = snapshot["greedy"]["batch_evidence"]["guessing"]["2"]
    assert behind == pytest.approx(load.measured[2, True].guessed.seconds, abs=1e-4)
    assert behind > 1.0  # some 17 cycles of 0.1 s, as forgotten

    def unlucky(restarted: BatchLoad, count: int) -> None:
        _cycles(restarted, count, 0.5, guessed=True)  # 4 tokens a second
        restarted.observe_target(0.2, 2)

    restarted = _restarted(load)
    assert not restarted.guessing_loses()
    unlucky(restarted, 2)
    assert not restarted.guessing_loses(), "two cycles do not overturn forty"
    unlucky(restarted, 40)
    assert restarted.guessing_loses(), "forty do"

    del snapshot["greedy"]["batch_evidence"]
    earlier = BatchLoad(CostBook.restore(snapshot))
    for slot in (0, 1):
        earlier.join(slot, True)
    assert not earlier.guessing_loses()
    unlucky(earlier, 2)
    assert earlier.guessing_loses(), "a verdict weighed as one cycle gives way at once"


def test_a_draft_s_read_pays_where_what_guessing_measured_saves_more_than_it() -> None:
    """Where this batch size measured guessing a little faster than plain, a read before the
    first guess pays for a long answer and not for a short one; before the rates are trusted,
    the formula decides alone."""
    load = BatchLoad(CostBook())
    for slot in (0, 1):
        load.join(slot, True)
    for m in (1, 8, 64, 128):
        load.observe_draft(0.002 * m, m, False, "model", 1)  # a read of 100 tokens: 0.2 s
    assert load.read_pays(100, 10)  # nothing measured yet
    _cycles(load, 2 + TRUST_AFTER, 0.2, guessed=False)  # 10 tokens a second
    guessed = 2 / 0.18  # each cycle with guesses 0.18 s: about 11 tokens a second
    _cycles(load, TRUST_AFTER + 1, 0.18, guessed=True)
    assert load.measured[2, True].guessed.rate == pytest.approx(guessed)
    saved_a_token = 2 * (1 / 10 - 1 / guessed)  # the batch's seconds per token of this budget
    assert not load.read_pays(100, int(0.9 * 0.2 / saved_a_token))
    assert load.read_pays(100, int(1.1 * 0.2 / saved_a_token) + 1)
    _cycles(load, 10, 0.3, guessed=True)  # now slower than plain: no read pays
    assert not load.read_pays(100, 100_000)


def _two_sequences_learned(lengths: tuple[int, ...]) -> tuple[BatchLoad, AdaptiveLookahead]:
    """A batch of two whose passes were timed at ``lengths`` (a cheap draft, a flat-ish
    target), and sequence 0's policy, which learned that 9 guesses in 10 survive; sequence 1
    took its next token alone."""
    draft = lambda m: 0.1 + 0.05 * (m - 1)  # noqa: E731
    verify = lambda m: 1.0 + 0.05 * (m - 1)  # noqa: E731
    load = BatchLoad(CostBook())
    for slot in range(2):
        load.join(slot, True)
    for m in lengths:
        for _ in range(3):
            load.observe_target(verify(m), m, verifies=False)
            load.observe_draft(draft(m), m, m <= 4, "model", m)
    policy = AdaptiveLookahead(load.costs.of(True), load=load, slot=0)
    rng = np.random.default_rng(2)
    for _ in range(40):
        kept = 0
        while kept < 8 and rng.random() < 0.9:
            kept += 1
        policy.observe(Plan(MODEL, 8), 8, kept, 0.0, 0.0)
    load.report(1, 1, 1, 0, None)
    return load, policy


def test_a_read_the_formula_would_pay_waits_where_drafting_measured_little_gain() -> None:
    """The formula prices a short read as worth it; where this batch size measured cycles with
    a draft's guesses hardly faster than cycles without, the policy reads nothing for a short
    answer."""
    load, policy = _two_sequences_learned((1, 2, 3, 4, 8, 16, 64))
    read = Candidate("model", "model", 10_000, setup=20)
    assert policy.plan([read], 64).lookahead > 0  # nothing measured: the formula's choice
    measured = load.drafting.setdefault((2, True), _Measured())
    for _ in range(TRUST_AFTER):
        measured.add(False, 2.0, 1.0)  # 2 tokens a second without a draft's guesses
        measured.add(True, 2.02, 1.0)  # 1% more with them
    assert policy.plan([read], 64).lookahead == 0
    assert policy.plan([MODEL], 64).lookahead > 0  # nothing to read: the formula's choice


def _kind_cycles(
    load: BatchLoad, count: int, seconds: float, kept: int, source: str | None
) -> None:
    """``count`` cycles of two sequences, each keeping ``kept`` tokens, every guess of
    ``source``'s kept, in ``seconds`` each, reported as the engine reports them (its guesses
    counted as paid whatever their source, unless prompt lookup's ended a draft model's run)."""
    for _ in range(count):
        load.observe_target(seconds, 2 * kept)
        for slot in (0, 1):
            load.report(slot, kept, kept, kept - 1, source)


def test_a_batch_that_measures_a_draft_model_slower_than_going_without_drafts_no_more() -> None:
    """Cycles where a draft model guessed measured slower than plain ones: drafting loses
    while guessing does not (prompt lookup's free guesses are faster), and the policy then
    takes free guesses or none, never the draft model's, and does not explore it; a retry
    comes as guessing's does."""
    load, policy = _two_sequences_learned((1, 2, 3, 4, 8, 16, 64))
    ngram = Candidate("ngram", "ngram4", 4, (5, 6, 7, 8))
    assert policy.plan([MODEL, ngram], 10_000).candidate == MODEL  # the formula's choice
    _kind_cycles(load, TRUST_AFTER + 1, 0.15, kept=1, source=None)  # plain: 13 tokens a second
    _kind_cycles(load, TRUST_AFTER, 0.2, kept=2, source="ngram")  # prompt lookup's: 20 a second
    _kind_cycles(load, TRUST_AFTER + 1, 0.5, kept=3, source="model")  # the model's: 12 a second
    load.observe_target(0.15, 2)
    assert not load.guessing_loses() and load.drafting_loses()
    assert not load.read_pays(1, 10_000)
    for _ in range(50):
        plan = policy.plan([MODEL, ngram], 10_000)
        assert plan.candidate != MODEL, plan
    assert policy.plan([MODEL], 10_000) == Plan(None, 0)
    measured = load.drafting[2, True]
    measured.waited = measured.lost(measured.plain.rate) / RETRY_SHARE  # the retry is due
    assert not load.drafting_loses()
    assert load.read_pays(1, 10_000), "a retry reads what it must, or it never drafts"


def test_a_draft_model_is_measured_against_plain_cycles_not_prompt_lookups_runs() -> None:
    """Prompt lookup guesses where the text repeats, and its cycles there run fast; a draft
    model guesses where lookup has nothing. A draft model's cycles faster than plain ones but
    slower than lookup's do not lose: measured against both, they would, and the batch would
    go plain where lookup has no match. The lookup cycles' time counts towards a retry."""
    load, _ = _two_sequences_learned((1, 2, 3, 4, 8, 16, 64))
    _kind_cycles(load, TRUST_AFTER + 1, 0.15, kept=1, source=None)  # plain: 13 tokens a second
    _kind_cycles(load, 3 * TRUST_AFTER, 0.1, kept=3, source="ngram")  # lookup's: 60 a second
    _kind_cycles(load, TRUST_AFTER + 1, 0.4, kept=3, source="model")  # the model's: 15 a second
    load.observe_target(0.15, 2)
    assert not load.guessing_loses() and not load.drafting_loses()
    measured = load.drafting[2, True]
    assert measured.plain.rate == pytest.approx(2 / 0.15)  # lookup's cycles are not in it
    assert measured.plain.cycles == TRUST_AFTER + 1
    _kind_cycles(load, 2 * TRUST_AFTER, 1.0, kept=3, source="model")  # now 6 tokens a second
    load.observe_target(0.15, 2)
    assert load.drafting_loses()
    before = measured.waited
    _kind_cycles(load, 2, 0.1, kept=3, source="ngram")
    load.observe_target(0.15, 2)
    assert measured.waited == pytest.approx(before + 0.2)


def test_a_retry_counts_the_draft_s_reads_in_what_it_lost() -> None:
    """A run of cycles where the draft drafted, the first after a read of 0.5 s: the rates
    leave the read out, what the run lost counts it, so the next retry waits for it too."""
    load = BatchLoad(CostBook())
    for slot in (0, 1):
        load.join(slot, True)
    _kind_cycles(load, 2, 0.1, kept=1, source=None)
    load.observe_draft(0.5, 40, False, "model", 1)  # a read before the next cycle
    _kind_cycles(load, 2, 0.1, kept=2, source="model")
    load.observe_target(0.1, 2)
    measured = load.drafting[2, True]
    assert measured.guessed.rate == pytest.approx(4 / 0.1)
    assert measured.run_seconds == pytest.approx(0.2 + 0.5)


def test_a_request_that_takes_a_leaver_s_place_keeps_the_batch_s_size() -> None:
    """A slot that ends is counted until the next target pass, so the others' plans in between
    price the batch the next request joins, not a batch of one; a newcomer takes its place."""
    load = _guessing_lost()
    assert load.guessing_loses()
    load.leave(1)
    assert len(load.slots) == 2 and load.guessing_loses(), "still the batch of two"
    load.join(3, True)  # the next request, on another slot
    assert sorted(load.slots) == [0, 3] and load.guessing_loses()
    load.observe_target(0.2, 2)
    assert sorted(load.slots) == [0, 3]
    load.leave(3)
    load.observe_target(0.1, 1)  # no one came: a batch of one from this pass on
    assert sorted(load.slots) == [0]
    load.leave(0)
    load.join(0, False)  # the same slot again
    load.observe_target(0.1, 1)
    assert list(load.slots) == [0] and load.slots[0].greedy is False


def simulate_round(accepts: list[float], budget: int, closed: bool, seed: int = 0) -> float:
    """One round of sequences on ``-k auto``, each with ``budget`` tokens to make and its own
    acceptance, nothing joining after them (the batch ``closed`` or not): the seconds until
    the last one ends, as ``simulate_batch`` runs a cycle."""
    rng = np.random.default_rng(seed)
    verify = lambda m: 1.0 + 0.1 * (m - 1)  # noqa: E731 (a pass that grows with its tokens)
    draft = lambda m: 0.05 + 0.01 * (m - 1)  # noqa: E731
    load = BatchLoad(CostBook(), closed=closed)
    n = len(accepts)
    policies = [AdaptiveLookahead(load.costs.of(True), load=load, slot=i) for i in range(n)]
    for i in range(n):
        load.join(i, True)
    left = [budget] * n
    seconds = 0.0
    while any(left):
        live = [i for i in range(n) if left[i]]
        for i in live:
            load.note_left(i, left[i])
        plans = {i: policies[i].plan([MODEL], left[i] - 1) for i in live}
        ks = {i: plan.lookahead for i, plan in plans.items()}
        for step in range(1, max(ks.values()) + 1):
            width = sum(1 for k in ks.values() if k >= step)
            load.observe_draft(draft(width), width, True, "model", width)
            seconds += draft(width)
        n_tokens = sum(k + 1 for k in ks.values())
        seconds += verify(n_tokens)
        load.observe_target(verify(n_tokens), n_tokens, ended=seconds)
        for i in live:
            kept = 0
            while kept < ks[i] and rng.random() < accepts[i]:
                kept += 1
            policies[i].observe(plans[i], ks[i], kept, 0.0, 0.0)
            load.report(i, kept + 1, ks[i] + 1, ks[i], "model" if ks[i] else None)
            left[i] = max(0, left[i] - kept - 1)
            if not left[i]:
                load.leave(i)
    return seconds


def test_a_closed_batch_ends_sooner_where_the_ones_ahead_stop_guessing() -> None:
    """Nothing joins a closed batch, so it takes as long as its slowest sequence: the ones whose
    guesses survive, ahead, guess only while none has more tokens left, and the batch's passes
    stay short while the slow one goes on. The open batch lets them race ahead and end alone."""
    accepts = [0.95, 0.95, 0.95, 0.2]
    for seed in range(3):
        open_round = simulate_round(accepts, 200, closed=False, seed=seed)
        closed_round = simulate_round(accepts, 200, closed=True, seed=seed)
        assert closed_round < 0.95 * open_round, (closed_round, open_round)


def test_a_closed_batch_whose_guesses_all_survive_keeps_them_all_guessing() -> None:
    """Where every sequence keeps nearly all its guesses, holding the ones ahead back would
    have them take turns (each guessing one cycle in four, the slowest's pace falling to a
    quarter of what guessing gives): the ones ahead by less than the slowest's pace makes up
    guess on, and the closed round ends about when the open one does (it took 1.2x as long
    when only the one furthest behind guessed)."""
    accepts = [0.95] * 4
    seeds = range(10, 13)
    open_round = sum(simulate_round(accepts, 200, closed=False, seed=s) for s in seeds)
    closed_round = sum(simulate_round(accepts, 200, closed=True, seed=s) for s in seeds)
    assert closed_round < 1.08 * open_round, (closed_round, open_round)


def test_a_sequence_ahead_of_a_closed_batch_s_slowest_waits_only_if_it_ends_in_time() -> None:
    """Ahead of the slowest, a sequence guesses only where, going plainly (a token a cycle),
    it would end after the slowest at that one's pace lately."""
    load = BatchLoad(CostBook(), closed=True)
    for slot in (0, 1):
        load.join(slot, True)
    load.note_left(0, 80)
    load.note_left(1, 100)
    assert not load.on_critical_path(0), "the slowest has kept a token a cycle (none reported)"
    for _ in range(5):
        load.report(1, 5, 9, 8, "model")  # the slowest keeps 5 tokens a cycle
    assert load.on_critical_path(0), "plainly it would take 80 cycles, the slowest about 20"
    load.note_left(0, 15)
    assert not load.on_critical_path(0), "15 cycles plainly: it ends before the slowest"


def test_in_a_closed_batch_only_the_sequences_furthest_behind_are_on_its_critical_path() -> None:
    load = BatchLoad(CostBook())
    load.note_left(0, 50)
    load.note_left(1, 80)
    assert load.on_critical_path(0) and load.on_critical_path(1), "open: every one"
    load.closed = True
    assert load.on_critical_path(1) and not load.on_critical_path(0)
    load.note_left(0, 80)
    assert load.on_critical_path(0), "level again"
    load.note_left(2, None)  # bounded by its context alone: when it ends is unknown
    assert load.on_critical_path(0) and load.on_critical_path(1)
    load.leave(2)
    load.note_left(0, 10)
    assert not load.on_critical_path(0)
    load.leave(1)
    assert load.on_critical_path(0), "alone"


def test_requests_that_arrived_together_end_together_while_none_waits() -> None:
    """``waves`` (a server's batch with no request waiting): a sequence ahead of another that
    arrived with it (a burst) is off the critical path; one ahead of a request that came later
    (a client's next, another client's) guesses for itself."""
    load = BatchLoad(CostBook())
    for slot, at, left in ((0, 10.0, 50), (1, 10.2, 80), (2, 30.0, 120)):
        load.arrive(slot, at)
        load.note_left(slot, left)
    assert all(load.on_critical_path(slot) for slot in range(3)), "not told: open"
    load.waves = True
    assert not load.on_critical_path(0), "behind slot 1, which came with it"
    assert load.on_critical_path(1), "ahead only of one that came 20 s later"
    assert load.on_critical_path(2)
    load.arrive(1, 10.0 + WAVE_SECONDS + 0.1)
    assert load.on_critical_path(0), "one that came later is not its wave"
    load.closed, load.waves = True, False
    assert not load.on_critical_path(0) and not load.on_critical_path(1), "closed: all"


def test_a_draft_that_must_first_read_a_long_prompt_is_priced_by_that_read() -> None:
    """In a batch, a draft model's first read of its prompt stalls every sequence: the policy
    shares that read over the cycles the budget leaves, and a short answer to a long prompt is
    not worth it where the same draft, its prompt read, pays."""
    load, policy = _two_sequences_learned((1, 2, 3, 4, 8, 16, 64, 512))
    read = Candidate("model", "model", 10_000, setup=500)
    assert policy.plan([MODEL], 64).lookahead > 0
    assert policy.plan([read], 64).lookahead == 0
    assert policy.plan([read], 4000).lookahead > 0  # a long answer is worth the read


def test_a_read_before_any_draft_pass_was_timed_is_priced_at_a_step_a_token() -> None:
    """A fresh batch that timed no draft pass yet (the draft's step only remembered) prices a
    read at its bound, a one-token step for each token read, not as free: a long read for a
    short answer waits, where the same draft with nothing to read pays."""
    load = BatchLoad(CostBook())
    for slot in range(2):
        load.join(slot, True)
    for m in (1, 2, 3, 4, 8, 16, 64):
        for _ in range(3):
            load.observe_target(1.0 + 0.05 * (m - 1), m, verifies=False)
    profile = load.costs.of(True)
    profile.observe_step("model", 0.01)  # twice: trusted (the first runs cold)
    profile.observe_step("model", 0.01)
    policy = AdaptiveLookahead(profile, load=load, slot=0)
    rng = np.random.default_rng(2)
    for _ in range(40):
        kept = 0
        while kept < 8 and rng.random() < 0.9:
            kept += 1
        policy.observe(Plan(MODEL, 8), 8, kept, 0.0, 0.0)
    load.report(1, 1, 1, 0, None)
    assert load.draft_pass(1) is None
    assert policy.plan([MODEL], 64).lookahead > 0
    assert policy.plan([Candidate("model", "model", 10_000, setup=40)], 64).lookahead > 0
    assert policy.plan([Candidate("model", "model", 10_000, setup=10_000)], 64).lookahead == 0
    assert policy.plan([Candidate("model", "model", 10_000, setup=10_000)], 1_000_000).lookahead > 0


@pytest.mark.parametrize(("source", "each"), [("eagle3", 0.1), ("dflash", 0.3)])
def test_heads_in_a_batch_are_priced_one_after_another(source: str, each: float) -> None:
    """Each sequence's head drafts in turn (a context of its own), so the others' drafts add up,
    where a draft model's batched steps are priced by the longest; a DFlash head's K guesses
    are one pass."""
    load = BatchLoad(CostBook())
    profile = load.costs.of(True)
    profile.observe_step(source, each)  # a guess (EAGLE3) or a pass (DFlash), twice: trusted
    profile.observe_step(source, each)
    for slot in range(3):
        load.join(slot, True)
        load.report(slot, 3, 5, 4, source)  # four guesses each
    others = load.others(0, profile)
    per_sequence = 4 * each if source == "eagle3" else each
    assert others.head_seconds == pytest.approx(2 * per_sequence)
    assert others.draft_seconds == 0.0
    load.report(1, 3, 5, 4, "model")
    load.report(2, 3, 5, 4, "model")
    assert load.others(0, profile).head_seconds == 0.0  # a draft model's steps are batched
