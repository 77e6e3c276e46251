"""Turning logits into the final sampling distributions p and q, and drawing from them.

This module owns the warping chain (top-k, top-p, min-p, then temperature, in llama.cpp's
order) and the sparse distribution type the accept rule works on. It knows nothing of models:
it takes logits as numpy arrays and a ``numpy.random.Generator`` passed in by the caller.

A row of logits comes one of two ways: the whole vocabulary (a numpy array), or its top-k
already taken on the backend (``TopK``: llama.cpp's backend sampling returns the k likeliest
tokens and their logits, so the host warps k values, not 262k). Both give the same p and q;
``row_top_k`` is the one rule for which a generation's rows take.

The guarantee of speculative decoding is about the *final* distribution: the engine must warp
the draft's logits and the target's logits with the same parameters, which is why both p and
q are built here and nowhere else.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from itertools import accumulate
from typing import Protocol

import numpy as np

# The nucleus (top-p) is a prefix of the tokens sorted by probability. Sorting a 262k-entry
# vocabulary costs ~20 ms; partitioning out the top few hundred costs well under 1 ms, and the
# nucleus almost always fits. Grow the partition by this factor until it does.
_NUCLEUS_FIRST_GUESS = 256
_NUCLEUS_GROWTH = 8
# Up to this many candidates a row is warped by sorting them all (``_warp_one``).
_BLOCK_MOST = 1024
# Up to this many candidates a row is warped, and a token drawn, in Python numbers.
FEW = 64


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


class Dist:
    """A probability distribution over token ids, stored sparsely.

    ``ids`` is sorted ascending and unique; ``probs`` are positive and sum to 1.
    Tokens not in ``ids`` have probability 0.

    A few-token distribution a draft step builds (``of_lists``) keeps Python lists and makes
    the arrays only when something asks for them: after each of llama.cpp's decodes the host's
    caches are cold, and a numpy call there costs ten times what it costs warm, where the same
    arithmetic in Python numbers over a handful of candidates stays cheap
    (``benchmarks/loop_cost.py``). ``prob``, ``sample`` and the keyed pick read the lists. A
    warp's result (``of_weights``) keeps its weights as they came, and is sorted and normalized
    only when read so: the keyed pick reads the weights themselves (``weighted``). A row the
    backend warped (``of_logits``) keeps its final logits, exponentiated only when read: the
    keyed pick races them as they are (``logits``), and a draft's q is read only by the rule
    that needs it.
    """

    __slots__ = ("_ids", "_probs", "_lists", "_weights", "_logits", "listed")

    def __init__(self, ids: np.ndarray, probs: np.ndarray) -> None:
        self._ids: np.ndarray | None = ids
        self._probs: np.ndarray | None = probs
        self._lists: tuple[list[int], list[float]] | None = None
        self._weights: tuple[list[int], list[float]] | None = None
        self._logits: tuple[list[int], list[float]] | None = None
        # Built of Python lists (a few tokens): read them, not arrays.
        self.listed = False

    @classmethod
    def _listed(
        cls,
        lists: tuple[list[int], list[float]] | None = None,
        weights: tuple[list[int], list[float]] | None = None,
        logits: tuple[list[int], list[float]] | None = None,
    ) -> Dist:
        """A distribution held as Python lists, in one of the three forms."""
        dist = cls.__new__(cls)
        dist._ids = dist._probs = None
        dist._lists, dist._weights, dist._logits, dist.listed = lists, weights, logits, True
        return dist

    @classmethod
    def of_lists(cls, ids: list[int], probs: list[float]) -> Dist:
        """The distribution of ``ids`` (sorted ascending, unique) and their ``probs``."""
        return cls._listed(lists=(ids, probs))

    @classmethod
    def of_weights(cls, ids: list[int], weights: list[float]) -> Dist:
        """The distribution proportional to ``weights`` (positive) over ``ids`` (unique, in
        any order)."""
        return cls._listed(weights=(ids, weights))

    @classmethod
    def of_logits(cls, ids: list[int], logits: list[float]) -> Dist:
        """softmax(``logits``) over ``ids`` (unique, in any order; every logit finite)."""
        return cls._listed(logits=(ids, logits))

    def logits(self) -> tuple[list[int], list[float]] | None:
        """Ids and the logits the distribution is the softmax of, in any order, where it was
        built of them (``of_logits``); else None."""
        return self._logits

    def weighted(self) -> tuple[list[int], list[float]]:
        """Ids and weights proportional to their probabilities, in any order (as built)."""
        if self._weights is None and self._logits is not None:
            ids, logits = self._logits
            top = max(logits)
            self._weights = (ids, [math.exp(v - top) for v in logits])
        return self._weights if self._weights is not None else self.lists()

    @property
    def ids(self) -> np.ndarray:
        if self._ids is None:
            self._ids = np.array(self.lists()[0], dtype=np.int64)
        return self._ids

    @property
    def probs(self) -> np.ndarray:
        if self._probs is None:
            self._probs = np.array(self.lists()[1], dtype=np.float64)
        return self._probs

    def lists(self) -> tuple[list[int], list[float]]:
        """``ids`` and ``probs`` as Python lists (made once)."""
        if self._lists is None:
            if self._weights is not None or self._logits is not None:
                ids, weights = self.weighted()
                total = sum(weights)
                pairs = sorted(zip(ids, [w / total for w in weights], strict=True))
                self._lists = ([t for t, _ in pairs], [q for _, q in pairs])
            else:
                self._lists = (self.ids.tolist(), self.probs.tolist())
        return self._lists

    def __len__(self) -> int:
        """The size of the support."""
        if self._weights is not None:
            return len(self._weights[0])
        if self._logits is not None:
            return len(self._logits[0])
        return len(self._lists[0]) if self._lists is not None else len(self.ids)

    def __repr__(self) -> str:
        ids, probs = self.lists()
        return f"Dist(ids={ids}, probs={probs})"

    @classmethod
    def from_dense(cls, probs: np.ndarray) -> Dist:
        probs = np.asarray(probs, dtype=np.float64)
        ids = np.flatnonzero(probs > 0)
        kept = probs[ids]
        return cls(ids, kept / kept.sum())

    @classmethod
    def one_hot(cls, token: int) -> Dist:
        return cls.of_lists([token], [1.0])

    def prob(self, token: int) -> float:
        """p(token); 0 where the token is outside the support."""
        if self._lists is None and (self._weights is not None or self._logits is not None):
            ids, weights = self.weighted()  # as lists() would normalize it
            try:
                return weights[ids.index(token)] / sum(weights)
            except ValueError:  # outside the support
                return 0.0
        if self.listed:
            ids, probs = self.lists()
            i = bisect_left(ids, token)
            return probs[i] if i < len(ids) and ids[i] == token else 0.0
        i = int(np.searchsorted(self.ids, token))
        if i < len(self.ids) and self.ids[i] == token:
            return float(self.probs[i])
        return 0.0

    def most(self) -> float:
        """The largest probability."""
        return max(self.lists()[1]) if self.listed else float(self.probs.max())

    def dense(self, n_vocab: int) -> np.ndarray:
        out = np.zeros(n_vocab)
        out[self.ids] = self.probs
        return out


def top_ids(values: np.ndarray, k: int) -> np.ndarray:
    """The ids of the ``k`` largest of ``values``, in no order (0 < k < len(values)).

    numpy's ``argpartition`` takes 2.3 ms over a row of 262k logits. Cut into 8k blocks (k the
    top-k), the row's block maxima bound it instead: the k-th largest maximum t has k blocks at
    or above it, so at least k values are >= t, and every one of the k largest is >= t, in a
    block whose maximum is >= t. One pass over the row finds the maxima; only those blocks (k
    to a few times k) are searched again: 0.1-0.2 ms a row, less than llama.cpp's own top-k."""
    n = values.shape[0]
    block = n // (8 * k)
    if block < 8:
        return np.argpartition(values, -k)[-k:]
    blocks = n // block
    grid = values[: blocks * block].reshape(blocks, block)
    peaks = grid.max(axis=1)
    floor = np.partition(peaks, -k)[-k]
    hot = np.flatnonzero(peaks >= floor)
    inner = np.flatnonzero(grid[hot] >= floor)
    ids = hot[inner // block] * block + inner % block
    if blocks * block < n:  # the few values past the last whole block
        tail = np.flatnonzero(values[blocks * block :] >= floor)
        ids = np.concatenate([ids, blocks * block + tail])
    if len(ids) < k:  # only where values hold NaN, which compares false
        return np.argpartition(values, -k)[-k:]
    return ids[np.argpartition(values[ids], -k)[-k:]]


class TopK:
    """A row's likeliest tokens and their logits, in any order (as the backend gives them): the
    row's top-k, with every token outside ``ids`` below every one inside.

    ``warped``: the backend ran the rest of the warp too, with these parameters (top-p, min-p
    and temperature in llama.cpp's sampler chain, ``final``): ``ids`` are then the support,
    ``logits`` its final logits and ``dist`` the distribution. A draft's rows may come so (its
    q is whatever its guesses are drawn from), and a target's under the min(1, p/q) rule (p
    up to float rounding); under the Gumbel-max rule a target's p is the host's warp on every
    build, so that a seed writes the same tokens whichever way rows are read.

    A row read from the backend holds Python lists (``of_lists``, ``final``) and makes the
    arrays only when they are read: the host warps a few candidates in Python numbers
    (``_warp_few``), and after each of llama.cpp's decodes even one array operation costs more
    than that arithmetic (``Dist``)."""

    __slots__ = ("_ids", "_logits", "n_vocab", "warped", "dist")

    def __init__(
        self,
        ids: np.ndarray | list[int],
        logits: np.ndarray | list[float],
        n_vocab: int,  # of the whole row: a top-k with k >= n_vocab holds all of it
        warped: SamplingParams | None = None,
        dist: Dist | None = None,
    ) -> None:
        self._ids, self._logits = ids, logits
        self.n_vocab, self.warped, self.dist = n_vocab, warped, dist

    @property
    def ids(self) -> np.ndarray:
        if isinstance(self._ids, list):
            self._ids = np.array(self._ids, dtype=np.int64)
        return self._ids

    @property
    def logits(self) -> np.ndarray:
        if isinstance(self._logits, list):
            self._logits = np.array(self._logits, dtype=np.float32)
        return self._logits

    def lists(self) -> tuple[list[int], list[float]]:
        """``ids`` and ``logits`` as Python lists (copies where they are arrays)."""
        ids = self._ids if isinstance(self._ids, list) else self._ids.tolist()
        logits = self._logits if isinstance(self._logits, list) else self._logits.tolist()
        return ids, logits

    def __len__(self) -> int:
        """How many candidates."""
        return len(self._ids)

    def __repr__(self) -> str:
        ids, logits = self.lists()
        return f"TopK(ids={ids}, logits={logits}, n_vocab={self.n_vocab})"

    @classmethod
    def of(cls, logits: np.ndarray, k: int) -> TopK:
        """The host's top-k of a whole row (what the backend computes; for fakes and tests)."""
        n = logits.shape[0]
        ids = top_ids(logits, k) if k < n else np.arange(n)
        return cls(ids.astype(np.int32), np.asarray(logits)[ids], n)

    @classmethod
    def final(
        cls,
        ids: list[int],
        logits: list[float],
        n_vocab: int,
        params: SamplingParams,
        finite: bool = False,
    ) -> TopK:
        """A row the backend warped with ``params``: its candidates and their final logits
        (-inf where out of the support; ``finite``: none is, the support alone was read)."""
        if not finite:
            ids = [t for t, v in zip(ids, logits, strict=True) if v > _NEG]
            logits = [v for v in logits if v > _NEG]
        assert ids, "a warp keeps the likeliest token"
        return cls(ids, logits, n_vocab, params, Dist.of_logits(ids, logits))


_NEG = -math.inf


# A row of logits: the whole vocabulary's, or its top-k from the backend; a decode's rows.
Row = np.ndarray | TopK
Rows = np.ndarray | list[TopK]


def row_top_k(params: SamplingParams, whole_rows: bool = False, on_device: bool = True) -> int:
    """How many candidates a generation's rows need from the backend (0: the whole row).

    Where rows are computed ``on_device`` (a GPU, a worker), their top-k is taken there and the
    whole row never crosses to the host: ``top_k`` when sampling with one, 1 for greedy (the
    argmax). Where they are computed on this CPU they are already in host memory, and the
    host's top-k over the row in place (``top_ids``, 0.1-0.2 ms a row of 262k logits) and
    argmax (0.02 ms) cost less than llama.cpp's in its graph (about 1.3 ms a row here,
    measured by ``benchmarks/loop_cost.py``): 0. ``whole_rows``: something reads the whole
    vocabulary (a grammar's mask, a logit bias, log-probabilities, a draft's ``p_min`` under
    greedy, which needs the softmax's normalizer): 0 as well.

    This is the one place that decides; the backend falls back to whole rows where its build
    cannot sample (``LlamaModel.sample_top_k``), and both ways give the same p and q."""
    if whole_rows or not on_device:
        return 0
    return 1 if params.greedy else params.top_k


def best(row: Row) -> int:
    """The row's argmax (greedy's token)."""
    if isinstance(row, TopK):
        ids, logits = row.lists()
        return ids[logits.index(max(logits))] if len(ids) > 1 else ids[0]
    return int(np.argmax(row))


def warp(logits: Row, params: SamplingParams, masked: bool = False) -> Dist:
    """The final sampling distribution for one row of logits (not for greedy params).

    ``masked``: a grammar set the logits of tokens it does not allow to -inf
    (``core.constraint.masked``); they are dropped before top-k, top-p and min-p count. A
    ``TopK`` row holds at least ``params.top_k`` candidates (``row_top_k``)."""
    if params.greedy:
        return Dist.one_hot(best(logits))
    if isinstance(logits, TopK):
        # The top-k of a masked row is not the mask of a row's top-k: a grammar reads whole rows.
        assert not masked, "a grammar's mask is applied to whole rows (row_top_k)"
        if logits.dist is not None:
            assert logits.warped == params, "a row the backend warped, warped as it was"
            return logits.dist
        return _warp_candidates(logits, params)
    logits = np.asarray(logits)
    # 1. Candidates: top-k, else the whole vocabulary (kept implicit until needed).
    if 0 < params.top_k < logits.shape[0]:
        ids = top_ids(logits, params.top_k)
        values = logits[ids].astype(np.float64)
    else:
        ids = None
        values = logits.astype(np.float64)
    # A grammar's mask leaves -inf where a token is not allowed: those are not candidates.
    if masked:
        finite = np.isfinite(values)
        ids = np.flatnonzero(finite) if ids is None else ids[finite]
        values = values[finite]
    # A top-k's few candidates are sorted whole; so are a mask's, where they are few enough.
    if ids is not None and len(ids) <= FEW:
        return _warp_few(ids.tolist(), values.tolist(), params)
    if ids is not None and (not masked or len(ids) <= _BLOCK_MOST):
        return _warp_one(ids, values, params)
    return _warp_rest(ids, values, params)


def _warp_candidates(row: TopK, params: SamplingParams) -> Dist:
    count = len(row)
    assert 0 < min(params.top_k, row.n_vocab) <= count, "at least top_k candidates"
    if count <= FEW:
        return _warp_few(*row.lists(), params)
    return _warp_one(row.ids, row.logits.astype(np.float64), params)


def _warp_few(ids: list[int], values: list[float], params: SamplingParams) -> Dist:
    """Steps 1-4 of the warp on a few candidates (a top-k's), in Python numbers: after each of
    llama.cpp's decodes the host's caches are cold, and there a handful of array operations
    cost more than this arithmetic over 40 numbers (``Dist``). Every way a row is read (whole,
    or its top-k from the backend) comes here with the same numbers: the same p to the bit."""
    # Sorted by logit, ties in the candidates' order (a stable sort, as ``_warp_one``'s).
    order = sorted(range(len(values)), key=values.__getitem__, reverse=True)
    count = len(order)
    kept = min(count, params.top_k) if params.top_k > 0 else count
    top = values[order[0]]
    # 2. top-p on the untempered distribution (llama.cpp's order): the smallest prefix of the
    # top-k whose mass reaches top_p.
    if params.top_p < 1.0:
        cumulative = list(accumulate(math.exp(values[i] - top) for i in order[:kept]))
        total = cumulative[-1]
        reach = 0
        while reach < kept and cumulative[reach] / total < params.top_p:
            reach += 1
        kept = min(kept, reach + 1)
    # 3. min-p: tokens with p >= min_p * p_max, i.e. logit >= max + ln(min_p), a prefix too.
    if params.min_p > 0.0:
        floor = top + math.log(params.min_p)
        above = 0
        while above < count and values[order[above]] >= floor:
            above += 1
        kept = min(kept, above)
    # 4. Temperature and softmax (normalized, and ids sorted, when first read so).
    chosen = order[:kept]
    weights = [math.exp((values[i] - top) / params.temperature) for i in chosen]
    return Dist.of_weights([ids[i] for i in chosen], weights)


def warp_block(
    ids: np.ndarray, values: np.ndarray, params: SamplingParams
) -> tuple[np.ndarray, np.ndarray]:
    """Steps 1-4 of the warp on many rows of candidates at once (``ids`` and their logits
    ``values``, one row each, e.g. a batch's top-k rows), as ``_warp_few`` warps each: the
    rows' candidates sorted by logit (ties in their order) and their weights (proportional to
    p, 0 past each row's support). One pass of array operations for all the rows, where a row
    at a time in Python costs every row again (``core.coupling.pick_block``: the rows of all
    the sequences of a verify pass)."""
    order = np.argsort(-values, axis=1, kind="stable")
    values = np.take_along_axis(values.astype(np.float64), order, axis=1)
    ids = np.take_along_axis(ids, order, axis=1)
    count = values.shape[1]
    kept = np.full(values.shape[0], min(count, params.top_k) if params.top_k > 0 else count)
    top = values[:, :1]
    # 2. top-p on the untempered distribution: the smallest prefix whose mass reaches top_p.
    if params.top_p < 1.0:
        cumulative = np.cumsum(np.exp(values[:, : kept[0]] - top), axis=1)
        reach = np.count_nonzero(cumulative / cumulative[:, -1:] < params.top_p, axis=1)
        kept = np.minimum(kept, reach + 1)
    # 3. min-p: logit >= max + ln(min_p), a prefix too.
    if params.min_p > 0.0:
        kept = np.minimum(kept, np.count_nonzero(values >= top + math.log(params.min_p), axis=1))
    # 4. Temperature: the weights, unnormalized as ``_warp_few``'s.
    weights = np.exp((values - top) / params.temperature)
    weights[np.arange(count) >= kept[:, None]] = 0.0
    return ids, weights


def _warp_one(ids: np.ndarray, values: np.ndarray, params: SamplingParams) -> Dist:
    """Steps 1-4 of the warp on more candidates than ``FEW`` (a large top-k, a grammar's
    allowed tokens), in array operations: ``_warp_few``'s steps."""
    order = np.argsort(-values, kind="stable")
    values, ids = values[order], ids[order]
    count = len(values)
    kept = min(count, params.top_k) if params.top_k > 0 else count
    top = values[0]
    if params.top_p < 1.0:
        shifted = np.exp(values - top)
        shifted[kept:] = 0.0
        cumulative = np.cumsum(shifted)
        cumulative /= cumulative[-1]
        kept = min(kept, int(np.count_nonzero(cumulative < params.top_p)) + 1)
    if params.min_p > 0.0:
        kept = min(kept, int(np.count_nonzero(values >= top + math.log(params.min_p))))
    probs = np.exp((values - top) / params.temperature)
    probs[kept:] = 0.0
    probs /= probs.sum()
    ids, probs = ids[:kept], probs[:kept]
    by_id = np.argsort(ids)
    return Dist(ids[by_id].astype(np.int64), probs[by_id])


def _warp_rest(ids: np.ndarray | None, values: np.ndarray, params: SamplingParams) -> Dist:
    """Steps 2-4 of the warp on many candidates (``ids`` None: the whole vocabulary, in
    order), where sorting them all would cost more than partitioning out the nucleus."""
    # 2. top-p on the untempered distribution (llama.cpp's order).
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


class Coins(Protocol):
    """Where uniform draws in [0, 1) come from: a ``numpy.random.Generator``, or ``Uniforms``."""

    def random(self) -> float: ...


class Uniforms:
    """A random generator's uniforms, drawn ahead a block at a time: the very numbers, in the
    same order, that ``rng.random()`` gives called once each, taken from a list where a numpy
    call after each of llama.cpp's decodes costs tens of microseconds (``Dist``)."""

    BLOCK = 64

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng
        self._ahead: list[float] = []

    def random(self) -> float:
        if not self._ahead:
            self._ahead = self._rng.random(self.BLOCK).tolist()[::-1]
        return self._ahead.pop()


def sample(dist: Dist, rng: Coins) -> int:
    """Draw one token id from ``dist``."""
    if dist.listed:  # a few candidates: the same sums in Python
        ids, probs = dist.lists()
        if len(ids) == 1:
            return ids[0]
        cumulative = list(accumulate(probs))
        i = bisect_right(cumulative, rng.random() * cumulative[-1])
        return ids[min(i, len(ids) - 1)]
    if len(dist.ids) == 1:
        return int(dist.ids[0])
    sums = np.cumsum(dist.probs)
    i = int(np.searchsorted(sums, rng.random() * sums[-1], side="right"))
    return int(dist.ids[min(i, len(dist.ids) - 1)])
