"""The math, exactly: warping, the accept/resample rule, the expected-tokens formula."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from specgen.core.sampling import (
    Dist,
    SamplingParams,
    TopK,
    Uniforms,
    _warp_few,
    _warp_one,
    best,
    row_top_k,
    sample,
    top_ids,
    warp,
)
from specgen.core.speculative import (
    accept_probability,
    expected_tokens,
    residual,
    verify,
    verify_greedy,
)

V = 8


def _dist(values: list[float]) -> Dist:
    return Dist.from_dense(np.array(values, dtype=np.float64))


CASES = {
    "generic": (
        _dist([0.3, 0.2, 0.1, 0.15, 0.05, 0.1, 0.05, 0.05]),
        _dist([0.1, 0.4, 0.1, 0.05, 0.15, 0.05, 0.1, 0.05]),
    ),
    "q-zero-where-p-positive": (
        _dist([0.25, 0.25, 0.25, 0.25, 0, 0, 0, 0]),
        _dist([0.5, 0, 0, 0, 0.5, 0, 0, 0]),
    ),
    "p-equals-q": (
        _dist([0.1, 0.2, 0.3, 0.4, 0, 0, 0, 0]),
        _dist([0.1, 0.2, 0.3, 0.4, 0, 0, 0, 0]),
    ),
    "one-hot-p": (_dist([0, 0, 1, 0, 0, 0, 0, 0]), _dist([0.2, 0.2, 0.2, 0.2, 0.2, 0, 0, 0])),
    "one-hot-q-elsewhere": (_dist([0.5, 0.5, 0, 0, 0, 0, 0, 0]), _dist([0, 0, 0, 0, 0, 0, 0, 1])),
}


def exact_first_token(p: Dist, q: Dist) -> np.ndarray:
    """P(the cycle emits x first), from the rule alone: accept q's guess, else draw the residual."""
    out = np.zeros(V)
    reject_mass = 0.0
    for guess, q_x in zip(q.ids, q.probs):
        a = accept_probability(p, q, int(guess))
        out[guess] += q_x * a
        reject_mass += q_x * (1 - a)
    return out + reject_mass * residual(p, q).dense(V)


@pytest.mark.parametrize("name", CASES)
def test_exact_rule_reproduces_p(name: str) -> None:
    p, q = CASES[name]
    np.testing.assert_allclose(exact_first_token(p, q), p.dense(V), atol=1e-12)


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("lookahead", [1, 2, 3, 5, 8])
def test_monte_carlo_every_position_follows_p(name: str, lookahead: int) -> None:
    """Chi-square: at every position of a cycle, the emitted token is distributed as p."""
    p, q = CASES[name]
    rng = np.random.default_rng(1234 + lookahead)
    counts = np.zeros((lookahead + 1, V))
    for _ in range(4000):
        guesses = [sample(q, rng) for _ in range(lookahead)]
        verdict = verify(guesses, [q] * lookahead, lambda i: p, rng)
        emitted = guesses[: verdict.n_accepted] + [verdict.next_token]
        for pos, token in enumerate(emitted):
            counts[pos, token] += 1
    support = p.ids
    assert counts[:, np.setdiff1d(np.arange(V), support)].sum() == 0, "emitted a token p forbids"
    for pos in range(lookahead + 1):
        n = counts[pos].sum()
        if n < 200 or len(support) == 1:
            continue
        _, pvalue = stats.chisquare(counts[pos, support], n * p.probs)
        assert pvalue > 1e-3, f"position {pos}: counts {counts[pos]} do not follow p"


def test_monte_carlo_detects_a_wrong_rule() -> None:
    """The chi-square check above can fail: always accepting the guess yields q, not p."""
    p, q = CASES["generic"]
    rng = np.random.default_rng(7)
    counts = np.bincount([sample(q, rng) for _ in range(4000)], minlength=V)
    _, pvalue = stats.chisquare(counts, 4000 * p.dense(V))
    assert pvalue < 1e-6


def test_acceptance_rate_is_overlap_of_p_and_q() -> None:
    """alpha = sum_x min(p(x), q(x)): the expected acceptance of one guess."""
    p, q = CASES["generic"]
    alpha = sum(q_x * accept_probability(p, q, int(x)) for x, q_x in zip(q.ids, q.probs))
    assert alpha == pytest.approx(np.minimum(p.dense(V), q.dense(V)).sum())


def test_residual_is_positive_part_of_difference() -> None:
    p, q = CASES["generic"]
    expected = np.maximum(p.dense(V) - q.dense(V), 0)
    np.testing.assert_allclose(residual(p, q).dense(V), expected / expected.sum())


def test_a_few_tokens_residual_in_python_numbers_is_the_arrays_one() -> None:
    """Up to ``FEW`` tokens the residual is taken in Python numbers: the same support and
    probabilities as over arrays (past ``FEW``), on random pairs that overlap in part."""
    rng = np.random.default_rng(3)
    for _ in range(300):
        n, m = (int(x) for x in rng.integers(1, 20, 2))
        p_ids = np.sort(rng.choice(60, n, replace=False))
        q_ids = np.sort(rng.choice(60, m, replace=False))
        p = Dist(p_ids, rng.dirichlet(np.ones(n)))
        q = Dist(q_ids, rng.dirichlet(np.ones(m)))
        few = residual(Dist.of_lists(*p.lists()), Dist.of_lists(*q.lists()))
        dense = np.maximum(p.dense(60) - q.dense(60), 0)
        want = p.dense(60) if dense.sum() == 0 else dense / dense.sum()
        np.testing.assert_allclose(few.dense(60), want, atol=1e-15)
        assert few.lists()[0] == sorted(few.lists()[0]) and min(few.lists()[1]) > 0


def test_a_distribution_of_lists_is_the_distribution_of_arrays() -> None:
    """A draft step's ``Dist`` of Python lists answers as one of arrays: its arrays, ``prob``
    in and out of the support, and every draw from the same generator (the same sums, so the
    same token for the same uniform)."""
    rng = np.random.default_rng(4)
    for _ in range(200):
        n = int(rng.integers(1, 30))
        ids = np.sort(rng.choice(1000, n, replace=False)).astype(np.int64)
        probs = rng.dirichlet(np.full(n, 0.5))
        arrays, few = Dist(ids, probs), Dist.of_lists(ids.tolist(), probs.tolist())
        np.testing.assert_array_equal(few.ids, ids)
        np.testing.assert_array_equal(few.probs, probs)
        assert len(few) == len(arrays) == n
        for token in (*ids[:3].tolist(), 1000, -1):
            assert few.prob(token) == arrays.prob(token)
        # A warp's weights, in any order: read before and after they are normalized, the same.
        order = rng.permutation(n)
        weighted = Dist.of_weights(ids[order].tolist(), (probs[order] * 2.5).tolist())
        early = [weighted.prob(t) for t in (*ids[:3].tolist(), 1000)]
        assert early == pytest.approx([arrays.prob(t) for t in (*ids[:3].tolist(), 1000)])
        weighted.lists()
        assert early == [weighted.prob(t) for t in (*ids[:3].tolist(), 1000)]
        # Logits (a row the backend warped), exponentiated when first read: the softmax.
        held = Dist.of_logits(ids[order].tolist(), (np.log(probs[order]) - 3.0).tolist())
        assert len(held) == n
        assert [held.prob(t) for t in (*ids[:3].tolist(), 1000)] == pytest.approx(
            [arrays.prob(t) for t in (*ids[:3].tolist(), 1000)]
        )
        np.testing.assert_array_equal(held.ids, ids)
        np.testing.assert_allclose(held.probs, probs, rtol=1e-12)
        assert held.most() == pytest.approx(float(probs.max()))
        seed = int(rng.integers(2**32))
        a, b = np.random.default_rng(seed), np.random.default_rng(seed)
        assert [sample(few, a) for _ in range(20)] == [sample(arrays, b) for _ in range(20)]


def test_uniforms_drawn_ahead_are_the_generators_own_in_order() -> None:
    """``Uniforms`` takes a generator's uniforms a block at a time: the very numbers that
    calling ``random()`` once each gives, across the blocks' edges."""
    ahead, one_by_one = Uniforms(np.random.default_rng(9)), np.random.default_rng(9)
    count = 3 * Uniforms.BLOCK + 5
    assert [ahead.random() for _ in range(count)] == [one_by_one.random() for _ in range(count)]


def test_verify_calls_p_lazily() -> None:
    """After a rejection at position i, target rows past i are never warped."""
    p = Dist.one_hot(0)
    q = Dist.one_hot(1)
    asked: list[int] = []

    def p_at(i: int) -> Dist:
        asked.append(i)
        return p

    verdict = verify([1, 1, 1], [q] * 3, p_at, np.random.default_rng(0))
    assert verdict.n_accepted == 0 and verdict.next_token == 0
    assert asked == [0]


def test_verify_all_accepted_draws_bonus_from_last_row() -> None:
    rows = [Dist.one_hot(3), Dist.one_hot(4), Dist.one_hot(5)]
    verdict = verify(
        [3, 4], [Dist.one_hot(3), Dist.one_hot(4)], rows.__getitem__, np.random.default_rng(0)
    )
    assert verdict.n_accepted == 2 and verdict.next_token == 5


def test_verify_greedy() -> None:
    target = [5, 6, 7, 8]
    assert verify_greedy([5, 6, 9], target.__getitem__).n_accepted == 2
    assert verify_greedy([5, 6, 9], target.__getitem__).next_token == 7
    assert verify_greedy([5, 6, 7], target.__getitem__).next_token == 8
    assert verify_greedy([], target.__getitem__).next_token == 5


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.8, 0.99])
@pytest.mark.parametrize("lookahead", [1, 4, 8])
def test_expected_tokens_matches_series(alpha: float, lookahead: int) -> None:
    series = sum(alpha**i for i in range(lookahead + 1))
    assert expected_tokens(alpha, lookahead) == pytest.approx(series)
    assert expected_tokens(1.0, lookahead) == lookahead + 1


def test_expected_tokens_matches_simulation() -> None:
    rng = np.random.default_rng(3)
    alpha, lookahead = 0.7, 4
    per_cycle = []
    for _ in range(20000):
        n = 0
        while n < lookahead and rng.random() < alpha:
            n += 1
        per_cycle.append(n + 1)
    assert np.mean(per_cycle) == pytest.approx(expected_tokens(alpha, lookahead), rel=0.02)


# -- warping ----------------------------------------------------------------------------------


def _reference_warp(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Dense, sort-everything reference for the llama.cpp chain top-k, top-p, min-p, temp."""
    n = len(logits)
    keep = np.ones(n, dtype=bool)
    order = np.argsort(-logits, kind="stable")
    if 0 < params.top_k < n:
        keep[order[params.top_k :]] = False
    probs = np.where(keep, np.exp(logits - logits.max()), 0)
    probs /= probs.sum()
    if params.top_p < 1:
        cumulative = np.cumsum(probs[order])
        cut = int(np.searchsorted(cumulative, params.top_p)) + 1
        keep[order[cut:]] = False
    if params.min_p > 0:
        best = logits[keep].max()
        keep &= logits >= best + np.log(params.min_p)
    out = np.where(keep, np.exp((logits - logits.max()) / params.temperature), 0)
    return out / out.sum()


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(1.0, 0, 1.0, 0.0),
        SamplingParams(0.8, 40, 0.95, 0.05),
        SamplingParams(0.7, 0, 0.9, 0.0),
        SamplingParams(1.3, 0, 1.0, 0.1),
        SamplingParams(0.5, 5, 1.0, 0.0),
        SamplingParams(1.0, 0, 0.999, 0.0),
    ],
)
def test_warp_matches_dense_reference(params: SamplingParams) -> None:
    rng = np.random.default_rng(11)
    logits = (rng.standard_normal(5000) * 3).astype(np.float32)
    got = warp(logits, params)
    assert np.all(np.diff(got.ids) > 0)
    np.testing.assert_allclose(
        got.dense(5000), _reference_warp(logits.astype(np.float64), params), atol=1e-9
    )


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(0.8, 40, 0.95, 0.05),
        SamplingParams(0.5, 5, 1.0, 0.0),
        SamplingParams(1.3, 100, 0.9, 0.1),
        SamplingParams(1.0, 1, 1.0, 0.0),
    ],
)
@pytest.mark.parametrize("extra", [0, 7])
def test_a_rows_top_k_from_the_backend_warps_as_the_whole_row(
    params: SamplingParams, extra: int
) -> None:
    """The backend's top-k (in any order, perhaps more candidates than top_k) gives the very
    distribution the whole row does."""
    rng = np.random.default_rng(12)
    for _ in range(5):
        logits = (rng.standard_normal(5000) * 3).astype(np.float32)
        top = TopK.of(logits, params.top_k + extra)
        order = rng.permutation(len(top.ids))
        shuffled = TopK(top.ids[order], top.logits[order], top.n_vocab)
        whole, candidates = warp(logits, params), warp(shuffled, params)
        np.testing.assert_array_equal(candidates.ids, whole.ids)
        np.testing.assert_allclose(candidates.probs, whole.probs, rtol=1e-12)
        assert best(shuffled) == int(np.argmax(logits)) == best(logits)


def test_a_top_k_over_a_small_vocabulary_holds_all_of_it() -> None:
    logits = np.array([0.3, 2.0, -1.0, 0.5], dtype=np.float32)
    params = SamplingParams(1.0, 40, 1.0, 0.0)
    got = warp(TopK.of(logits, 40), params)
    np.testing.assert_allclose(got.dense(4), warp(logits, params).dense(4))
    with pytest.raises(AssertionError):  # fewer candidates than top_k of a larger vocabulary
        warp(TopK(np.array([1, 3]), np.array([2.0, 0.5]), 4), params)
    with pytest.raises(AssertionError):  # a grammar's mask is applied to whole rows
        warp(TopK.of(logits, 4), SamplingParams(1.0, 4, 1.0, 0.0), masked=True)


def test_which_rows_a_generation_reads() -> None:
    assert row_top_k(SamplingParams(temperature=0)) == 1  # rows on a GPU: its argmax alone
    # Rows the CPU computed are read in place: the host's top-k and argmax cost less there.
    assert row_top_k(SamplingParams(temperature=0), on_device=False) == 0
    assert row_top_k(SamplingParams(0.8, 40, 0.95, 0.05), on_device=False) == 0
    assert row_top_k(SamplingParams(0.8, 40, 0.95, 0.05)) == 40
    assert row_top_k(SamplingParams(0.8, 0, 0.95, 0.05)) == 0  # no top-k: the whole row
    assert row_top_k(SamplingParams(temperature=0), whole_rows=True) == 0
    assert row_top_k(SamplingParams(0.8, 40, 0.95, 0.05), whole_rows=True) == 0


@pytest.mark.parametrize("n, k", [(262144, 40), (49152, 40), (5000, 1), (300, 40), (4096, 500)])
def test_the_hosts_top_k_is_the_k_largest(n: int, k: int) -> None:
    rng = np.random.default_rng(n + k)
    for values in (
        (rng.standard_normal(n) * 3).astype(np.float32),
        np.sort(rng.standard_normal(n)).astype(np.float32),  # the largest in the last blocks
        np.where(rng.random(n) < 0.9, -np.inf, rng.standard_normal(n)).astype(np.float32),
    ):
        got = np.sort(top_ids(values, k))
        want = np.sort(np.argpartition(values, -k)[-k:])
        np.testing.assert_array_equal(np.sort(values[got]), np.sort(values[want]))
        assert len(set(got.tolist())) == k


def test_warp_greedy_is_argmax() -> None:
    logits = np.array([0.1, 3.0, 2.9], dtype=np.float32)
    assert warp(logits, SamplingParams(temperature=0)).ids.tolist() == [1]


def test_sample_follows_distribution() -> None:
    d = _dist([0.5, 0.25, 0.125, 0.125, 0, 0, 0, 0])
    rng = np.random.default_rng(5)
    counts = np.bincount([sample(d, rng) for _ in range(8000)], minlength=V)
    _, pvalue = stats.chisquare(counts[:4], 8000 * d.probs)
    assert pvalue > 1e-3 and counts[4:].sum() == 0


def test_sampling_params_validate() -> None:
    with pytest.raises(ValueError):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError):
        SamplingParams(min_p=1.0)


def test_expected_tokens_by_position_is_the_closed_form_at_one_alpha() -> None:
    from specgen.core.speculative import expected_tokens_by_position

    by_k = expected_tokens_by_position([0.7] * 6)
    assert by_k == pytest.approx([expected_tokens(0.7, k) for k in range(7)])
    assert expected_tokens_by_position([1.0, 0.5, 0.0, 1.0]) == [1.0, 2.0, 2.5, 2.5, 2.5]


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(0.8, 40, 0.95, 0.05),
        SamplingParams(1.3, 40, 0.9, 0.0),
        SamplingParams(0.5, 40, 1.0, 0.1),
        SamplingParams(1.0, 20, 0.5, 0.0),  # fewer than the backend's 40 candidates
    ],
)
def test_a_few_candidates_warp_in_python_numbers_as_in_arrays(params: SamplingParams) -> None:
    """A top-k's candidates are warped in Python numbers (``_warp_few``): the support the
    array warp (``_warp_one``, for many candidates) keeps, ties included (rounded logits), and
    its probabilities up to rounding; and the very same bits whichever way the row is read
    (whole, its top-k as arrays, its candidates as the backend's Python numbers). (Where
    logits tie at the top-k's edge, a whole row's own top-k may hold another of the tied.)"""
    rng = np.random.default_rng(13)
    for trial in range(60):
        logits = (rng.standard_normal(3000) * rng.uniform(0.5, 6)).astype(np.float32)
        if trial % 3 == 0:
            logits = np.round(logits)
        top = TopK.of(logits, 40)
        ids, values = top.lists()
        few = _warp_few(ids, values, params)
        arrays = _warp_one(top.ids.astype(np.int64), top.logits.astype(np.float64), params)
        np.testing.assert_array_equal(few.ids, arrays.ids)
        np.testing.assert_allclose(few.probs, arrays.probs, rtol=1e-12)
        ties = trial % 3 == 0 and params.top_k < 40
        for row in (
            (top, TopK(ids, values, 3000)) if ties else (logits, top, TopK(ids, values, 3000))
        ):
            got = warp(row, params)
            assert got.lists() == few.lists()


def test_a_row_warped_on_the_backend_is_its_final_distribution() -> None:
    """A row whose whole warp ran in llama.cpp's chain (final logits, -inf out of the
    support) is read as the softmax of its finite logits, ids sorted; warping it again with
    other parameters is refused."""
    params = SamplingParams(0.8, 6, 0.9, 0.05)
    ids = [40, 7, 19, 3, 88, 5]
    logits = [2.5, 1.0, -np.inf, 0.25, -np.inf, 1.0]
    row = TopK.final(ids, logits, 100, params)
    got = warp(row, params)
    assert got.ids.tolist() == [3, 5, 7, 40]
    weights = np.exp(np.array([0.25, 1.0, 1.0, 2.5]) - 2.5)
    np.testing.assert_allclose(got.probs, weights / weights.sum(), rtol=1e-12)
    assert best(row) == 40
    with pytest.raises(AssertionError):
        warp(row, SamplingParams(1.0, 6, 0.9, 0.05))
