"""What ``-k auto`` keeps of a pair: the verify pass's fitted cost, and costs remembered from
an earlier process followed by what this one measures."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specgen.drafters import TARGET_ALONE, Candidate
from specgen.lookahead import AdaptiveLookahead, PairProfile
from specgen.lookahead import costs as costs_module
from specgen.lookahead.costs import COST_MEMORY, REFIT_LENGTHS, Timing, fit_passes
from tests.fakes import cpu_verify

MODEL = Candidate("model", "model", 10_000)


def test_a_fitted_curve_reads_every_length_between_its_neighbours_seen() -> None:
    """A length not seen reads the line held between the nearest lengths seen below and above
    (the shortest's figure below it, no bound above the longest), each of them the most and
    the least of all the figures on its side: the curve never falls as the length grows, even
    from noisy figures that do."""
    rng = np.random.default_rng(11)
    for _ in range(50):
        lengths = sorted({int(n) for n in rng.integers(1, 200, rng.integers(1, 12))})
        points = {n: 0.01 * n * float(rng.uniform(0.3, 1.5)) + 0.02 for n in lengths}
        timings = {n: Timing(COST_MEMORY) for n in lengths}
        for n in lengths:
            for _ in range(int(rng.integers(0, 3))):
                timings[n].add(points[n])
        fit = fit_passes(points, timings)
        fitted, (intercept, slope) = fit.fitted, fit.line
        assert all(fitted[a] <= fitted[b] for a, b in zip(lengths, lengths[1:]))
        for n in range(1, 260):
            if n in fitted:
                assert fit.at(n) == fitted[n]
                continue
            below = max((t for m, t in fitted.items() if m < n), default=min(fitted.values()))
            above = min((t for m, t in fitted.items() if m > n), default=float("inf"))
            assert fit.at(n) == pytest.approx(min(max(intercept + slope * n, below), above))


def test_a_curve_over_many_lengths_is_made_again_every_few_passes_not_every_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fit takes a slope for every two lengths: past REFIT_LENGTHS lengths, a curve serves
    lengths // REFIT_LENGTHS passes before it is made again (a server that has seen hundreds
    of lengths would spend milliseconds a pass on it); with few lengths, after every pass. A
    length seen since is on the curve once it is made again."""
    fits = []

    def counted(points: dict[int, float], timings: dict[int, Timing]) -> object:
        fits.append(len(points))
        return fit_passes(points, timings)

    monkeypatch.setattr(costs_module, "fit_passes", counted)
    few, many = PairProfile(), PairProfile()
    for n in range(1, 4):
        few.observe_pass(n, 0.01 * n)
    for n in range(1, 321):
        many.observe_pass(n, 0.001 * n)
    for profile, lengths, every in ((few, 3, 1), (many, 320, 320 // REFIT_LENGTHS)):
        fits.clear()
        for _ in range(3 * every):
            profile.observe_pass(2, 0.02)
            assert profile.verify(2) is not None
        assert fits == [lengths] * 3
    assert many.verify(500) == pytest.approx(0.5, rel=0.05)  # not seen: the line reads it
    for _ in range(2 * 320 // REFIT_LENGTHS):
        many.observe_pass(500, 0.3)
    assert many.verify(500) < 0.35


def test_remembered_verify_costs_follow_the_speed_measured_here() -> None:
    """A verify length only remembered is scaled by how fast the target runs here against
    then (the median ratio over lengths measured both then and here), so lengths measured
    here do not look cheap beside remembered ones on a machine faster now."""
    remembered = {"verify_by_n": {"1": 1.0, "5": 2.0, "9": 3.0, "13": 4.0}}
    costs = PairProfile.restore(remembered)
    costs.observe(None, 4, 0.0, 2.5)  # cold: slower than remembered, dropped
    assert costs.verify(9) == pytest.approx(3.0)
    costs.observe(None, 4, 0.0, 1.0)  # the target runs twice as fast here
    assert costs.verify(5) == pytest.approx(1.0)
    assert costs.verify(9) == pytest.approx(1.5) and costs.verify(1) == pytest.approx(0.5)
    assert costs.verify(11) == pytest.approx(1.75)  # the line through them, scaled too
    costs.observe(None, 8, 0.0, 3.0)  # cold at 9
    costs.observe(None, 8, 0.0, 3.0)  # 9 measured as remembered: median ratio (0.5, 1) ->
    assert costs.verify(13) == pytest.approx(4.0 * 1.0)  # the upper of the two
    assert PairProfile.restore(remembered).verify(9) == pytest.approx(3.0)  # none measured: as then


def test_a_pass_never_costs_more_than_that_many_one_token_steps() -> None:
    """Costs remembered while something else ran (longer passes at many one-token steps) are
    held to m steps of one, so ``auto`` goes back to those lengths instead of never again."""
    busy = {"verify_by_n": {"1": 0.02, "2": 0.03, "4": 0.58, "6": 0.81, "14": 1.17}}
    costs = PairProfile.restore(busy)
    assert 0.02 <= costs.verify(2) <= 2 * 0.02  # within the bound
    assert costs.verify(4) <= 4 * 0.02 + 1e-12 and costs.verify(6) <= 6 * 0.02 + 1e-12
    assert costs.verify(14) <= 14 * 0.02 + 1e-12
    honest = PairProfile.restore({"verify_by_n": {"1": 1.0, "5": 2.0, "9": 3.0}})
    assert honest.verify(9) == pytest.approx(3.0)  # a CPU's line is far inside the bound


def test_remembered_costs_need_no_timing_cycles_and_drop_this_process_cold_sample() -> None:
    """Costs kept by an earlier process (a JSON round trip) are trusted at once: the first
    cycle drafts. Each remembered cost then follows this process, whose first (cold) sample
    of it is dropped."""
    learned = PairProfile()
    for _ in range(3):
        learned.observe(None, 0, 0.0, 1.0)
        learned.observe("model", 4, 4 * 0.3, cpu_verify(5))
    snapshot = json.loads(json.dumps(learned.snapshot()))
    costs = PairProfile.restore(snapshot)
    assert costs.verify(1) == pytest.approx(1.0) and costs.guess("model") == pytest.approx(0.3)
    assert costs.verify(5) == pytest.approx(cpu_verify(5))
    first = AdaptiveLookahead(costs).plan([MODEL], 100)
    assert first.candidate == MODEL and first.lookahead >= 1 and not first.explore  # no timing
    assert AdaptiveLookahead(PairProfile()).plan([MODEL], 100) == TARGET_ALONE  # fresh: timing
    costs.observe(None, 0, 0.0, 3.0)  # this process's first, cold, target step: dropped
    assert costs.verify(1) == pytest.approx(1.0)
    costs.observe(None, 0, 0.0, 2.0)  # then measured here: that replaces the remembered mean
    assert costs.verify(1) == pytest.approx(2.0)
    costs.observe(None, 0, 0.0, 1.0)  # and is followed
    assert costs.verify(1) == pytest.approx((0.8 * 2.0 + 1.0) / 1.8)
    assert PairProfile.restore({}).verify(1) is None


def test_one_slow_target_step_does_not_throw_the_remembered_costs_away() -> None:
    """The target's speed is compared with the remembered one by its fastest step here: a
    step slowed by something else running keeps the costs; a machine that runs otherwise
    (every step slower, or faster) drops them."""
    remembered = {"per_guess": {"model": 0.3}, "verify_by_n": {"1": 1.0, "5": cpu_verify(5)}}
    for steps, same in [
        ((1.0, 1.6), "yes"),
        ((1.7, 1.02), "yes"),
        ((1.5, 1.4), "no"),
        ((0.6, 0.62), "no"),
    ]:
        costs = PairProfile.restore(remembered)
        assert costs.speed_matches_remembered() == "unknown"
        for seconds in steps:
            costs.observe(None, 0, 0.0, seconds)
        assert costs.speed_matches_remembered() == same, steps
    assert PairProfile().speed_matches_remembered() == "yes"  # nothing remembered to doubt


def test_verify_cost_is_measured_where_seen_and_fitted_elsewhere() -> None:
    costs = PairProfile()
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
    costs = PairProfile()
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
    costs = PairProfile.restore(remembered)  # the line: 0.75 + 0.25 n, through all but 6
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
    assert PairProfile.restore(snapshot).verify(20) == pytest.approx(costs.verify(20))  # its weight


def test_a_block_drafters_cycle_is_one_pass_whatever_its_k() -> None:
    """A DFlash head drafts its K guesses in one pass: that pass is what is timed and what a
    cycle's draft is priced at, where a step drafter's (EAGLE3) is a step a guess."""
    from specgen.drafters.base import draft_cost

    for source, each in (("dflash", 0.4), ("eagle3", 0.05)):
        costs = PairProfile()
        for _ in range(3):
            costs.observe(source, 8, 0.4, 1.0)  # eight guesses in 0.4 s
        assert costs.guess(source) == pytest.approx(each)
        for k in (1, 4, 15):
            want = 0.4 if source == "dflash" else 0.05 * k
            assert draft_cost(source, k, each) == pytest.approx(want)
    assert draft_cost("dflash", 0, 0.4) == 0.0
