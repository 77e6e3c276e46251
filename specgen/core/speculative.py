"""The accept/resample rule of speculative sampling, and its expected yield.

Given the draft's guesses x_1..x_K, the draft distributions q_1..q_K they were drawn from, and
the target distributions p_1..p_{K+1} at the same positions:

- guess x_i is kept with probability min(1, p_i(x_i) / q_i(x_i)) (the accept coin);
- at the first rejection, the replacement is drawn from the residual normalize(max(0, p_i - q_i));
- if all K are kept, a bonus token is drawn from p_{K+1}.

Each emitted token then follows p exactly. With greedy decoding p and q are one-hot on their
argmax, and the rule reduces to "keep while the guess equals the target's argmax".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from operator import mul

import numpy as np

from specgen.core.sampling import FEW, Coins, Dist, sample


@dataclass(frozen=True)
class Verdict:
    """Outcome of verifying one cycle: how many guesses were kept, and the token that follows."""

    n_accepted: int
    next_token: int


def accept_probability(p: Dist, q: Dist, token: int) -> float:
    """min(1, p(x)/q(x)) for a guess x that was drawn from q (so q(x) > 0)."""
    q_x = q.prob(token)
    assert q_x > 0.0, "a draft guess must have positive probability under the draft's q"
    return min(1.0, p.prob(token) / q_x)


def residual(p: Dist, q: Dist) -> Dist:
    """normalize(max(0, p - q)): where the target wants more mass than the draft gave.

    Where p == q the residual is empty, but then no guess is ever rejected; p is returned so the
    function stays total.
    """
    if len(p) <= FEW and len(q) <= FEW:  # a top-k's few candidates: in Python numbers
        p_at = dict(zip(*p.lists(), strict=True))
        q_at = dict(zip(*q.lists(), strict=True))
        diffs = [(t, p_at.get(t, 0.0) - q_at.get(t, 0.0)) for t in sorted(p_at.keys() | q_at)]
        left = [(t, d) for t, d in diffs if d > 0]
        if not left:
            return p
        total = sum(d for _, d in left)
        return Dist.of_lists([t for t, _ in left], [d / total for _, d in left])
    ids = np.union1d(p.ids, q.ids)
    diff = _on(ids, p) - _on(ids, q)
    keep = diff > 0
    if not keep.any():
        return p
    mass = diff[keep]
    return Dist(ids[keep], mass / mass.sum())


def _on(ids: np.ndarray, dist: Dist) -> np.ndarray:
    """dist's probabilities at ``ids`` (a sorted superset of dist.ids)."""
    out = np.zeros(len(ids))
    out[np.searchsorted(ids, dist.ids)] = dist.probs
    return out


def verify(
    guesses: Sequence[int],
    q: Sequence[Dist],
    p: Callable[[int], Dist],
    rng: Coins,
) -> Verdict:
    """Run the accept coin over the guesses; ``p(i)`` gives the target distribution at position i.

    ``p`` is a callable so the caller can warp target rows lazily: after a rejection at i, rows
    beyond i are never needed. It is called with 0..len(guesses) inclusive at most.
    """
    assert len(guesses) == len(q), "one draft distribution per guess"
    for i, token in enumerate(guesses):
        p_i = p(i)
        if rng.random() >= accept_probability(p_i, q[i], token):
            return Verdict(i, sample(residual(p_i, q[i]), rng))
    return Verdict(len(guesses), sample(p(len(guesses)), rng))


def verify_greedy(guesses: Sequence[int], target_argmax: Callable[[int], int]) -> Verdict:
    """Greedy verification: keep while a guess equals the target's argmax at its position."""
    for i, token in enumerate(guesses):
        best = target_argmax(i)
        if token != best:
            return Verdict(i, best)
    return Verdict(len(guesses), target_argmax(len(guesses)))


def judged_guesses(drafted: int, accepted: int) -> int:
    """How many of a cycle's guesses the target judged: the kept ones and the first rejected
    one; guesses after a rejection are drafted but never judged."""
    return min(drafted, accepted + 1)


def expected_tokens(alpha: float, lookahead: int) -> float:
    """E[tokens per cycle] = (1 - alpha^(K+1)) / (1 - alpha): kept guesses plus the one drawn."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError("alpha must be in [0, 1]")
    if alpha == 1.0:
        return float(lookahead + 1)
    return (1.0 - alpha ** (lookahead + 1)) / (1.0 - alpha)


def expected_tokens_by_position(rates: Sequence[float]) -> list[float]:
    """E[tokens per cycle] at K = 0, 1, ..., len(rates), when guess i survives with probability
    ``rates[i]`` once reached.

    The closed form above assumes one alpha at every position; measured acceptance falls along
    the cycle, so the adaptive lookahead uses this sum instead: E(K) = 1 + sum_{j<=K} prod_{i<=j}
    a_i (the kept guesses, plus the one token every cycle draws).
    """
    return list(accumulate(accumulate(rates, mul), initial=1.0))


def predicted_speedup(
    tokens_per_cycle: float, drafted: float, cost_ratio: float, verify_ratio: float
) -> float:
    """Speedup over the target alone: tokens per cycle / cycle cost in target steps.

    A cycle costs ``drafted * c`` (c = draft time per guess / target time per token) plus the
    verify pass (``verify_ratio`` = its time / target time per token).
    """
    return tokens_per_cycle / (drafted * cost_ratio + verify_ratio)
