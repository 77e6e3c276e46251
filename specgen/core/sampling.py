"""Turning logits into the final sampling distributions p and q, and drawing from them.

This module owns the warping chain (top-k, top-p, min-p, then temperature, in llama.cpp's
order) and the sparse distribution type the accept rule works on. It knows nothing of models:
it takes logits as numpy arrays and a ``numpy.random.Generator`` passed in by the caller.

The guarantee of speculative decoding is about the *final* distribution: the engine must warp
the draft's logits and the target's logits with the same parameters, which is why both p and
q are built here and nowhere else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# The nucleus (top-p) is a prefix of the tokens sorted by probability. Sorting a 262k-entry
# vocabulary costs ~20 ms; partitioning out the top few hundred costs well under 1 ms, and the
# nucleus almost always fits. Grow the partition by this factor until it does.
_NUCLEUS_FIRST_GUESS = 256
_NUCLEUS_GROWTH = 8


@dataclass(frozen=True)
class SamplingParams:
    """How logits become a distribution. ``temperature <= 0`` means greedy (argmax)."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05

    def __post_init__(self) -> None:
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0 (0 disables it)")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        if not 0.0 <= self.min_p < 1.0:
            raise ValueError("min_p must be in [0, 1)")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


# What specgen samples with when not told otherwise (run, batches, bench, the API, serve).
DEFAULT_SAMPLING = SamplingParams()


@dataclass(frozen=True)
class Dist:
    """A probability distribution over token ids, stored sparsely.

    ``ids`` is sorted ascending and unique; ``probs`` are positive and sum to 1.
    Tokens not in ``ids`` have probability 0.
    """

    ids: np.ndarray
    probs: np.ndarray

    @classmethod
    def from_dense(cls, probs: np.ndarray) -> Dist:
        probs = np.asarray(probs, dtype=np.float64)
        ids = np.flatnonzero(probs > 0)
        kept = probs[ids]
        return cls(ids, kept / kept.sum())

    @classmethod
    def one_hot(cls, token: int) -> Dist:
        return cls(np.array([token], dtype=np.int64), np.array([1.0]))

    def prob(self, token: int) -> float:
        """p(token); 0 where the token is outside the support."""
        i = int(np.searchsorted(self.ids, token))
        if i < len(self.ids) and self.ids[i] == token:
            return float(self.probs[i])
        return 0.0

    def dense(self, n_vocab: int) -> np.ndarray:
        out = np.zeros(n_vocab)
        out[self.ids] = self.probs
        return out


def warp(logits: np.ndarray, params: SamplingParams, masked: bool = False) -> Dist:
    """The final sampling distribution for one row of logits (not for greedy params).

    ``masked``: a grammar set the logits of tokens it does not allow to -inf
    (``core.constraint.masked``); they are dropped before top-k, top-p and min-p count."""
    if params.greedy:
        return Dist.one_hot(int(np.argmax(logits)))
    logits = np.asarray(logits)
    # 1. Candidates: top-k, else the whole vocabulary (kept implicit until needed).
    if 0 < params.top_k < logits.shape[0]:
        ids = np.argpartition(logits, -params.top_k)[-params.top_k :]
        values = logits[ids].astype(np.float64)
    else:
        ids = None
        values = logits.astype(np.float64)
    # A grammar's mask leaves -inf where a token is not allowed: those are not candidates.
    if masked:
        finite = np.isfinite(values)
        ids = np.flatnonzero(finite) if ids is None else ids[finite]
        values = values[finite]
    # 2. top-p on the untempered distribution over the candidates (llama.cpp's order).
    if params.top_p < 1.0:
        ids, values = _nucleus(ids, values, params.top_p)
    # 3. min-p: keep tokens with p >= min_p * p_max, i.e. logit >= max + ln(min_p).
    if params.min_p > 0.0:
        keep = values >= values.max() + math.log(params.min_p)
        values = values[keep]
        ids = np.flatnonzero(keep) if ids is None else ids[keep]
    if ids is None:
        ids = np.arange(values.shape[0])
    # 4. Temperature, softmax, and sorted ids so that Dist.prob can binary-search.
    order = np.argsort(ids, kind="stable")
    ids, values = ids[order].astype(np.int64), values[order] / params.temperature
    probs = np.exp(values - values.max())
    return Dist(ids, probs / probs.sum())


def _nucleus(
    ids: np.ndarray | None, values: np.ndarray, top_p: float
) -> tuple[np.ndarray, np.ndarray]:
    """Smallest set of most probable candidates whose mass reaches ``top_p``."""
    shifted = np.exp(values - values.max())
    total = shifted.sum()
    n = values.shape[0]
    guess = min(n, _NUCLEUS_FIRST_GUESS)
    while True:
        if guess < n:
            top = np.argpartition(values, -guess)[-guess:]
        else:
            top = np.arange(n)
        top = top[np.argsort(-values[top], kind="stable")]
        cumulative = np.cumsum(shifted[top]) / total
        reached = int(np.searchsorted(cumulative, top_p))
        if reached < len(top) or guess >= n:
            chosen = top[: min(reached + 1, len(top))]
            break
        guess = min(n, guess * _NUCLEUS_GROWTH)
    return (chosen if ids is None else ids[chosen]), values[chosen]


def sample(dist: Dist, rng: np.random.Generator) -> int:
    """Draw one token id from ``dist``."""
    if len(dist.ids) == 1:
        return int(dist.ids[0])
    cumulative = np.cumsum(dist.probs)
    i = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return int(dist.ids[min(i, len(dist.ids) - 1)])
