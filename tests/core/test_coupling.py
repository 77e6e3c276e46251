"""The Gumbel-max coupling (``core.coupling``): its noise, its exactness by chi-square with
guesses from a draft model and from point masses, its independence from K, and mutants that
must fail the same tests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest
from scipy import stats

from specgen.core.coupling import (
    Picking,
    agreement,
    gumbel,
    gumbel_pick,
    pick_together,
    race_block,
    uniforms,
    verify_gumbel,
)
from specgen.core.sampling import Dist, SamplingParams, TopK, sample, warp
from specgen.core.speculative import Verdict, accept_probability, residual

V = 6
SEEDS = 6000


def _dist(values: list[float]) -> Dist:
    return Dist.from_dense(np.array(values))


# A two-position toy: the target's p_1, then p_2 given x_1; the draft's q's differ from them.
P1 = _dist([0.30, 0.25, 0.20, 0.15, 0.10, 0.0])
Q1 = _dist([0.10, 0.40, 0.10, 0.10, 0.10, 0.20])


def p2(x1: int) -> Dist:
    rolled = np.roll(np.array([0.4, 0.3, 0.15, 0.1, 0.05, 0.0]), x1)
    return Dist.from_dense(rolled)


def q2(x1: int) -> Dist:
    return Dist.from_dense(np.roll(np.array([0.2, 0.2, 0.2, 0.2, 0.1, 0.1]), x1))


def joint_pvalue(pairs: Counter[tuple[int, int]], n: int) -> float:
    expected, observed = [], []
    for x1 in range(V):
        for x2 in range(V):
            e = n * P1.prob(x1) * p2(x1).prob(x2)
            if e > 0:
                expected.append(e)
                observed.append(pairs[(x1, x2)])
            else:
                assert pairs[(x1, x2)] == 0, "a token outside p's support came out"
    return float(stats.chisquare(observed, expected).pvalue)


Rule = Callable[[list[int], list[Dist], Callable[[int], Dist], int], Verdict]


def gumbel_rule(guesses: list[int], q: list[Dist], p: Callable[[int], Dist], seed: int) -> Verdict:
    return verify_gumbel(guesses, p, seed, 0)


def two_tokens(seed: int, k: int, drafter: str, rule: Rule = gumbel_rule) -> tuple[int, int]:
    """The first two tokens with ``k`` guesses (at most 2) drafted by ``drafter``: "model" (the
    draft's own Gumbel picks), "ngram" (point masses that ignore the noise) or "none"."""
    guesses: list[int] = []
    qs: list[Dist] = []
    if drafter == "model":
        for i in range(k):
            q = Q1 if i == 0 else q2(guesses[0])
            guesses.append(gumbel_pick(q, seed, i))
            qs.append(q)
    elif drafter == "ngram":
        guesses = [1, 0][:k]
        qs = [Dist.one_hot(t) for t in guesses]

    def p(i: int) -> Dist:
        return P1 if i == 0 else p2(guesses[0])

    verdict = rule(guesses, qs, p, seed)
    out = [*guesses[: verdict.n_accepted], verdict.next_token]
    if len(out) < 2:  # the next cycle, with nothing drafted: the target's pick at position 1
        out.append(gumbel_pick(p2(out[0]), seed, 1))
    return out[0], out[1]


def test_the_noise_is_keyed_on_seed_position_and_token_alone() -> None:
    ids = np.arange(1000)
    u = uniforms(7, 3, ids)
    assert np.all((u > 0) & (u < 1))
    # a token's noise is the same whichever support it is read in
    assert np.array_equal(uniforms(7, 3, ids[[5, 900]]), u[[5, 900]])
    assert not np.array_equal(uniforms(8, 3, ids), u)
    assert not np.array_equal(uniforms(7, 4, ids), u)
    # uniform, and the Gumbel's mean is Euler's constant
    assert stats.kstest(uniforms(1, 0, np.arange(20000)), "uniform").pvalue > 1e-3
    assert abs(gumbel(2, 5, np.arange(20000)).mean() - np.euler_gamma) < 0.03


def test_a_gumbel_pick_is_a_draw_from_the_distribution() -> None:
    counts = Counter(gumbel_pick(P1, seed, 0) for seed in range(SEEDS))
    observed = [counts[int(t)] for t in P1.ids]
    assert stats.chisquare(observed, SEEDS * P1.probs).pvalue > 1e-3


@pytest.mark.parametrize("drafter", ["model", "ngram"])
@pytest.mark.parametrize("k", [1, 2])
def test_the_first_two_tokens_follow_p_with_guesses(drafter: str, k: int) -> None:
    pairs = Counter(two_tokens(seed, k, drafter) for seed in range(SEEDS))
    assert joint_pvalue(pairs, SEEDS) > 1e-3


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_the_same_seed_gives_the_same_tokens_at_any_k_and_drafter(drafter: str) -> None:
    for seed in range(300):
        alone = two_tokens(seed, 0, "none")
        assert two_tokens(seed, 1, drafter) == alone
        assert two_tokens(seed, 2, drafter) == alone


def mutant_residual_with_the_drafts_noise(
    guesses: list[int], q: list[Dist], p: Callable[[int], Dist], seed: int
) -> Verdict:
    """Today's coin, but a rejected guess replaced by the target's Gumbel pick under the noise
    the draft drew its guess with: the replacement leans to the rejected guess."""
    rng = np.random.default_rng(seed + 10**6)
    for i, token in enumerate(guesses):
        p_i = p(i)
        if rng.random() >= accept_probability(p_i, q[i], token):
            return Verdict(i, gumbel_pick(p_i, seed, i))
    return Verdict(len(guesses), sample(p(len(guesses)), rng))


def mutant_unkeyed_by_position(
    guesses: list[int], q: list[Dist], p: Callable[[int], Dist], seed: int
) -> Verdict:
    """The Gumbel rule with one noise for every position."""
    for i, token in enumerate(guesses):
        best = gumbel_pick(p(i), seed, 0)
        if token != best:
            return Verdict(i, best)
    return Verdict(len(guesses), gumbel_pick(p(len(guesses)), seed, 0))


def test_a_mutant_that_reuses_the_drafts_noise_fails() -> None:
    pairs = Counter(
        two_tokens(seed, 1, "model", mutant_residual_with_the_drafts_noise) for seed in range(SEEDS)
    )
    assert joint_pvalue(pairs, SEEDS) < 1e-6
    # and the sound residual rule with fresh noise passes the same test
    fresh = Counter()
    for seed in range(SEEDS):
        rng = np.random.default_rng(seed)
        guess = sample(Q1, rng)
        if rng.random() < accept_probability(P1, Q1, guess):
            x1 = guess
        else:
            x1 = sample(residual(P1, Q1), rng)
        fresh[(x1, sample(p2(x1), rng))] += 1
    assert joint_pvalue(fresh, SEEDS) > 1e-3


def test_a_mutant_with_one_noise_for_every_position_fails() -> None:
    pairs = Counter(
        two_tokens(seed, 2, "model", mutant_unkeyed_by_position) for seed in range(SEEDS)
    )
    assert joint_pvalue(pairs, SEEDS) < 1e-6


def test_agreement_is_the_exact_share_and_within_its_bounds() -> None:
    tv = 0.5 * float(np.abs(P1.dense(V) - Q1.dense(V)).sum())
    exact = agreement(P1, Q1)
    assert (1 - tv) / (1 + tv) - 1e-12 <= exact <= 1 - tv + 1e-12
    seen = np.mean([gumbel_pick(P1, s, 0) == gumbel_pick(Q1, s, 0) for s in range(SEEDS)])
    assert abs(seen - exact) < 4 * np.sqrt(exact * (1 - exact) / SEEDS)
    assert agreement(P1, P1) == pytest.approx(1.0)
    assert agreement(Dist.one_hot(2), P1) == pytest.approx(P1.prob(2))  # a point mass: p(guess)


def _uniforms_in_arrays(seed: int, position: int, ids: np.ndarray) -> np.ndarray:
    """The keyed uniforms as first written, every step in uint64 arrays (the reference the
    scalar key's Python integers must match to the bit)."""
    from specgen.core.coupling import _GOLDEN, _POSITION, _mix

    key = _mix(np.array([seed * 2 + 1], dtype=np.uint64) * _GOLDEN)
    key = _mix(key ^ (np.array([position], dtype=np.uint64) * _POSITION))
    z = _mix(key + (np.asarray(ids, dtype=np.uint64) + np.uint64(1)) * _GOLDEN)
    return ((z >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53


def test_the_keys_python_integers_are_the_arrays_bits() -> None:
    from specgen.core.coupling import _key, _keys

    ids = np.array([0, 1, 5, 49151, 262143])
    for seed in (0, 1, 7, 2**32 - 1, 2**40 + 5):
        for position in (0, 1, 5, 1000, 2**33):
            got, want = uniforms(seed, position, ids), _uniforms_in_arrays(seed, position, ids)
            np.testing.assert_array_equal(got, want)
            # A block's keys, one a row, are the scalar key's bits too.
            keys = _keys(np.array([seed], dtype=np.uint64), np.array([position], dtype=np.uint64))
            assert int(keys[0]) == _key(seed, position)


def test_a_pick_among_few_candidates_is_the_arrays_pick() -> None:
    """Up to 64 candidates the pick runs in Python numbers: the same token as argmax over
    arrays of log p + G, on every one of many random supports (and a draw from p, tested
    above on either side of the bound)."""
    rng = np.random.default_rng(5)
    for _ in range(3000):
        n = int(rng.integers(2, 65))
        ids = np.sort(rng.choice(262144, n, replace=False)).astype(np.int64)
        dist = Dist(ids, rng.dirichlet(np.full(n, 0.3)))
        seed, position = int(rng.integers(2**32)), int(rng.integers(4096))
        scores = np.log(dist.probs) + gumbel(seed, position, dist.ids)
        assert gumbel_pick(dist, seed, position) == int(dist.ids[int(np.argmax(scores))])
        # A warp's weights, unnormalized and in any order: the same race, the same pick.
        order = rng.permutation(n)
        weighted = Dist.of_weights(ids[order].tolist(), (dist.probs[order] * 3.7).tolist())
        assert gumbel_pick(weighted, seed, position) == gumbel_pick(dist, seed, position)
        np.testing.assert_allclose(weighted.probs, dist.probs, rtol=1e-12)
        np.testing.assert_array_equal(weighted.ids, dist.ids)
        # A backend-warped row's logits, in any order: the race in logarithms, the same pick.
        logits = np.log(dist.probs[order]) + 1.25
        held = Dist.of_logits(ids[order].tolist(), logits.tolist())
        assert gumbel_pick(held, seed, position) == gumbel_pick(dist, seed, position)
    # A probability that underflowed to 0 is never the pick.
    tiny = Dist(np.array([3, 9]), np.array([1.0, 0.0]))
    assert all(gumbel_pick(tiny, s, 0) == 3 for s in range(50))


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(0.8, 40, 0.95, 0.05),  # the defaults
        SamplingParams(1.5, 8, 0.5, 0.0),  # top-p alone cuts
        SamplingParams(0.3, 40, 1.0, 0.2),  # min-p alone cuts
        SamplingParams(1.0, 100, 0.9, 0.01),  # more than FEW candidates: the arrays' warp
    ],
)
def test_rows_picked_together_are_each_row_s_own_pick(params: SamplingParams) -> None:
    """A verify pass's rows of several sequences, each with its own seed and positions, picked
    in one pass over them all (``pick_together``, ``pick_block``), give each row's pick as the
    rule reads it alone, ``gumbel_pick(warp(row))``: with ties among the logits (their order
    decides which one a cut keeps) and rows whose support is one token."""
    rng = np.random.default_rng(11)
    k = params.top_k
    for _ in range(40):
        requests = []
        for _ in range(int(rng.integers(1, 5))):
            rows = []
            for _ in range(int(rng.integers(1, 10))):
                logits = (rng.standard_normal(k) * rng.choice([0.3, 2.0, 8.0])).astype(np.float32)
                if rng.random() < 0.5:  # a tie, somewhere
                    logits[rng.integers(k)] = logits[rng.integers(k)]
                ids = rng.choice(262144, k, replace=False).astype(np.int32)
                rows.append(TopK(ids.tolist(), logits.tolist(), 262144))
            picking = Picking(params, int(rng.integers(2**32)), int(rng.integers(4096)))
            requests.append((rows, picking))
        for (rows, picking), picked in zip(requests, pick_together(requests), strict=True):
            assert list(picked) == rows and picked.picking == picking
            alone = [
                gumbel_pick(warp(row, params), picking.seed, picking.position + i)
                for i, row in enumerate(rows)
            ]
            assert picked.picks == alone


def test_a_mutant_that_picks_together_from_the_unwarped_rows_fails() -> None:
    """The test above can fail: the race run on the rows' softmax without the cuts (top-p,
    min-p) picks a token outside the support, somewhere among many rows."""
    rng = np.random.default_rng(3)
    params = SamplingParams(0.8, 40, 0.95, 0.05)
    rows = [
        TopK(
            rng.choice(262144, 40, replace=False).tolist(),
            (rng.standard_normal(40) * 2.0).astype(np.float32).tolist(),
            262144,
        )
        for _ in range(200)
    ]
    ids = np.array([row.lists()[0] for row in rows], dtype=np.int64)
    values = np.array([row.lists()[1] for row in rows], dtype=np.float64)
    weights = np.exp((values - values.max(axis=1, keepdims=True)) / params.temperature)
    seeds = np.full(len(rows), 9, dtype=np.uint64)
    positions = np.arange(len(rows), dtype=np.uint64)
    mutant = race_block(ids, weights, seeds, positions).tolist()
    alone = [gumbel_pick(warp(row, params), 9, i) for i, row in enumerate(rows)]
    assert mutant != alone
