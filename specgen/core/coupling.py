"""The Gumbel-max coupling: every position's token a function of (seed, position) alone.

The token at position t is x_t = argmax_x(log p_t(x) + G_t(x)), where G_t(x) is a standard Gumbel
variable keyed on (seed, t, x): an exact draw from p_t, since the noise at t is independent of
the noise before it, on which the text before t depends. A drafter proposes with the same
noise, argmax_x(log q_t(x) + G_t(x)), and a guess is kept iff it equals the target's pick at
its position; a point-mass guess (n-gram, suffix cache, grammar) is kept iff it equals it, with
probability p_t(guess), as under the min(1, p/q) rule. The output is then the target's own
Gumbel-max sample whatever was guessed: the same at any K, with any drafter, alone or in a batch
(up to a float at a near tie), and p-distributed.

The price is acceptance: the two picks agree with probability between (1-TV)/(1+TV) and 1-TV,
where the min(1, p/q) rule keeps 1-TV of the draft's guesses.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from specgen.core.sampling import FEW, Coins, Dist, SamplingParams, TopK, sample, warp_block
from specgen.core.speculative import Verdict, verify_greedy

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_POSITION = np.uint64(0xD6E8FEB86659FD93)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, on uint64 arrays (wrapping multiplication)."""
    z = z ^ (z >> np.uint64(30))
    z = z * _MIX1
    z = z ^ (z >> np.uint64(27))
    z = z * _MIX2
    return z ^ (z >> np.uint64(31))


_MASK = (1 << 64) - 1
_MIX1_INT, _MIX2_INT = int(_MIX1), int(_MIX2)
_GOLDEN_INT, _POSITION_INT = int(_GOLDEN), int(_POSITION)


def _mix_int(z: int) -> int:
    """``_mix`` of one value, in Python integers (no array for a scalar: cheaper per call)."""
    z ^= z >> 30
    z = (z * _MIX1_INT) & _MASK
    z ^= z >> 27
    z = (z * _MIX2_INT) & _MASK
    return z ^ (z >> 31)


def _key(seed: int, position: int) -> int:
    """The noise's key at (seed, position), which each token id is mixed into."""
    key = _mix_int(((seed * 2 + 1) & _MASK) * _GOLDEN_INT & _MASK)
    return _mix_int(key ^ ((position & _MASK) * _POSITION_INT & _MASK))


def _keys(seeds: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """``_key`` of many (seed, position) at once, on uint64 arrays (a row's each)."""
    keys = _mix((seeds * np.uint64(2) + np.uint64(1)) * _GOLDEN)
    return _mix(keys ^ (positions * _POSITION))


def uniforms(seed: int, position: int, ids: np.ndarray) -> np.ndarray:
    """U_t(x) in (0, 1) for each token id of ``ids``, a function of (seed, position, id) only:
    the same for a token whichever support it is read in."""
    return _keyed_uniforms(np.uint64(_key(seed, position)), ids)


def _keyed_uniforms(keys: np.ndarray | np.uint64, ids: np.ndarray) -> np.ndarray:
    """``uniforms`` of ``ids`` under the noise's key (``_key``), or each row's (``_keys``, a
    column)."""
    tokens = np.asarray(ids, dtype=np.uint64) + np.uint64(1)
    z = _mix(keys + tokens * _GOLDEN)
    return ((z >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53


def gumbel(seed: int, position: int, ids: np.ndarray) -> np.ndarray:
    """G_t(x) = -log(-log U_t(x)): standard Gumbel noise keyed on (seed, position, id)."""
    return -np.log(-np.log(uniforms(seed, position, ids)))


# E's least value: U rounds to 1.0 at its largest (1 in 2^53), where -log U would be 0.
_LEAST = 2.0**-54


def gumbel_pick(dist: Dist, seed: int, position: int) -> int:
    """argmax_x(log dist(x) + G_t(x)) over the support: an exact draw from ``dist``.

    Computed as the race it is, argmax_x dist(x) / E_t(x) with E_t(x) = -log U_t(x) (exp of
    the score above, one logarithm a token instead of three)."""
    if len(dist) == 1:
        return int(dist.weighted()[0][0])
    if len(dist) > FEW:
        scores = dist.probs / np.maximum(-np.log(uniforms(seed, position, dist.ids)), _LEAST)
        return int(dist.ids[int(np.argmax(scores))])
    # A few candidates (a warped row's support): the same noise, in Python numbers, inlined
    # (``_race_noise``'s): a pick after each draft step costs its candidates' arithmetic alone.
    key = _key(seed, position)
    mask, golden, mix1, mix2 = _MASK, _GOLDEN_INT, _MIX1_INT, _MIX2_INT
    least, log = _LEAST, math.log
    held = dist.logits()
    if held is not None:  # softmax(v): the race in logarithms, v - log E (no exp a token)
        best, best_log = -1, -math.inf
        for token, v in zip(*held, strict=True):
            z = (key + (token + 1) * golden) & mask
            z ^= z >> 30
            z = (z * mix1) & mask
            z ^= z >> 27
            z = (z * mix2) & mask
            noise = -log((((z ^ (z >> 31)) >> 11) + 0.5) * 2.0**-53)
            score = v - log(noise if noise > least else least)
            if score > best_log:
                best, best_log = token, score
        return best
    best, best_score = -1, 0.0
    for token, p in zip(*dist.weighted(), strict=True):  # p/E: unnormalized is the same race
        score = p / _race_noise(key, token)
        if score > best_score:  # a probability that underflowed to 0 is never the pick
            best, best_score = token, score
    return best


def _race_noise(key: int, token: int) -> float:
    """E_t(token) = -log U_t(token) for the noise's ``key`` at a position (``_key``), in
    Python numbers: ``uniforms``' U, held above 0."""
    z = _mix_int((key + (token + 1) * _GOLDEN_INT) & _MASK)
    return max(-math.log(((z >> 11) + 0.5) * 2.0**-53), _LEAST)


class Keyed:
    """A drafter's draws under the Gumbel-max rule: each ``pick`` is the Gumbel-max pick of its
    distribution at the next position, from ``position`` on (what a drafter is handed in place
    of a random generator when the target picks this way)."""

    def __init__(self, seed: int, position: int) -> None:
        self.seed, self.position = seed, position

    def pick(self, dist: Dist) -> int:
        token = gumbel_pick(dist, self.seed, self.position)
        self.position += 1
        return token


# What a generation draws its tokens with: a random generator, or the keyed noise.
Draws = Coins | Keyed


def draw(dist: Dist, draws: Draws) -> int:
    """One token from ``dist``: the keyed pick at the next position, or a generator's draw."""
    return draws.pick(dist) if isinstance(draws, Keyed) else sample(dist, draws)


def verify_gumbel(
    guesses: Sequence[int], p: Callable[[int], Dist], seed: int, position: int
) -> Verdict:
    """Keep while a guess equals the target's Gumbel-max pick at its position (``position`` is
    the first guess's); the token that follows is the target's pick where the guesses end.
    ``p(i)`` is called lazily, in order, as ``verify``'s."""
    return verify_greedy(guesses, lambda i: gumbel_pick(p(i), seed, position + i))


# The fewest rows a decode's verifies under one warp are picked together (``pick_block``):
# below, each sequence's rule picks as it reads its rows, one at a time, for less (measured on
# the demo pair: one sequence's 9 rows took as long or longer together).
PICK_TOGETHER_ROWS = 16


@dataclass(frozen=True)
class Picking:
    """How a verify pass's rows are picked under the Gumbel-max rule: warped with ``params``,
    raced with the noise of ``seed`` from ``position`` on (its first row's token's). A decode
    handed one may come back with its rows' picks (``PickedRows``), computed together with the
    other sequences' of its pass."""

    params: SamplingParams
    seed: int
    position: int


class PickedRows(list[TopK]):
    """A decode's top-k rows and the Gumbel-max pick of each under ``picking``, computed with
    the other sequences' rows of its pass (``pick_block``)."""

    def __init__(self, rows: list[TopK], picking: Picking, picks: list[int]) -> None:
        super().__init__(rows)
        self.picking, self.picks = picking, picks


def pick_block(
    ids: np.ndarray,
    logits: np.ndarray,
    params: SamplingParams,
    asked: Sequence[tuple[Picking, int]],
) -> list[list[int]]:
    """The picks of several requests' rows at once: ``ids`` and ``logits`` hold their rows
    one after another (top-k rows, as many candidates each), ``asked`` each request's
    ``Picking`` and its count of rows. Each row's pick is ``gumbel_pick(warp(row, params),
    seed, position)``'s, up to a float at a near tie: one pass of array operations over all
    the rows (``warp_block``, then the race), where a row at a time in Python costs every row
    again."""
    # The noise's integers are taken modulo 2^64, as ``_key``'s: any seed a caller passes.
    seeds = np.array([p.seed & _MASK for p, n in asked for _ in range(n)], dtype=np.uint64)
    positions = np.array(
        [(p.position + i) & _MASK for p, n in asked for i in range(n)], dtype=np.uint64
    )
    ranked, weights = warp_block(ids, logits, params)
    picks = race_block(ranked, weights, seeds, positions).tolist()
    out, at = [], 0
    for _, n in asked:
        out.append(picks[at : at + n])
        at += n
    return out


def pick_together(requests: Sequence[tuple[list[TopK], Picking]]) -> list[PickedRows]:
    """``pick_block`` of requests' ``TopK`` rows (as many candidates each, one warp)."""
    rows = [row for got, _ in requests for row in got]
    ids = np.array([row.lists()[0] for row in rows], dtype=np.int64)
    logits = np.array([row.lists()[1] for row in rows], dtype=np.float64)
    asked = [(picking, len(got)) for got, picking in requests]
    picks = pick_block(ids, logits, requests[0][1].params, asked)
    return [
        PickedRows(got, picking, got_picks)
        for (got, picking), got_picks in zip(requests, picks, strict=True)
    ]


def race_block(
    ids: np.ndarray, weights: np.ndarray, seeds: np.ndarray, positions: np.ndarray
) -> np.ndarray:
    """Each row's argmax_x weight(x) / E_t(x) (``gumbel_pick``'s race, weights proportional
    to p, 0 outside the support) with its own noise key (``seeds``, ``positions``: uint64)."""
    noise = np.maximum(-np.log(_keyed_uniforms(_keys(seeds, positions)[:, None], ids)), _LEAST)
    best = np.argmax(weights / noise, axis=1)
    return ids[np.arange(ids.shape[0]), best]


def agreement(p: Dist, q: Dist) -> float:
    """P(the Gumbel picks of p and q agree) under shared noise, exactly:
    sum_x 1 / sum_y max(p(y)/p(x), q(y)/q(x)) over the tokens both hold (as exponential races:
    x wins both iff every y's time exceeds x's times the larger of its two ratios)."""
    ids = np.intersect1d(p.ids, q.ids)
    if len(ids) == 0:
        return 0.0
    union = np.union1d(p.ids, q.ids)
    p_u = np.zeros(len(union))
    q_u = np.zeros(len(union))
    p_u[np.searchsorted(union, p.ids)] = p.probs
    q_u[np.searchsorted(union, q.ids)] = q.probs
    total = 0.0
    for x in np.searchsorted(union, ids):
        total += 1.0 / float(np.maximum(p_u / p_u[x], q_u / q_u[x]).sum())
    return total
