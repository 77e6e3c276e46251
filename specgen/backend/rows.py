"""A decode's rows as their top-k, taken in llama.cpp's graph by its backend sampling.

On a GPU the whole row never leaves the device: each output row's k likeliest tokens and their
logits come back as ``core.sampling.TopK`` rows. A sequence's rows are read by its ``TopKRows``;
a batch of several sequences' draft steps in one loop (``read_steps``), and its verifies'
Gumbel-max picks in one block (``pick_verifies``).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any, cast

import llama_cpp
import numpy as np

from specgen.core.coupling import PICK_TOGETHER_ROWS, PickedRows, Picking, pick_block
from specgen.core.sampling import SamplingParams, TopK
from specgen.errors import BackendError

_NEG = float("-inf")

# llama.cpp's backend sampling ([EXPERIMENTAL] there): llama-cpp-python 0.3.36 binds it.
BACKEND_SAMPLING = hasattr(llama_cpp, "llama_set_sampler") and hasattr(
    llama_cpp, "llama_get_sampled_candidates_ith"
)


def _address_of(name: str) -> Callable[[llama_cpp.llama_context_p, int], int | None]:
    """llama.cpp's ``name`` (context, row) -> pointer, returning the address as an int: read
    with ``numpy.frombuffer``, cheaper than a typed pointer through ``numpy.ctypeslib`` (a row
    read after every draft step counts)."""
    lib = getattr(getattr(llama_cpp, "llama_cpp", None), "_lib", None)
    if lib is None or not hasattr(lib, name):
        typed = getattr(llama_cpp, name)
        return lambda ctx, i: ctypes.cast(typed(ctx, i), ctypes.c_void_p).value
    function = lib[name]  # a function object of its own: llama-cpp-python's is left as it is
    function.argtypes, function.restype = [ctypes.c_void_p, ctypes.c_int32], ctypes.c_void_p
    return function


_candidates_at = _address_of("llama_get_sampled_candidates_ith") if BACKEND_SAMPLING else None
_logits_at = _address_of("llama_get_sampled_logits_ith") if BACKEND_SAMPLING else None


def read_block(
    ctx: llama_cpp.llama_context_p, first: int, n_rows: int, k: int, n_vocab: int
) -> tuple[np.ndarray, np.ndarray]:
    """The first ``k`` candidates and logits of ``n_rows`` output rows from batch index
    ``first`` (llama.cpp keeps them ``n_vocab`` apart), as arrays of ``n_rows`` x ``k``: views
    of llama.cpp's buffer, valid until the context's next decode."""
    assert _candidates_at is not None and _logits_at is not None, "backend sampling bound"
    size = (n_rows - 1) * n_vocab + k
    ids = _view(_candidates_at(ctx, first), size, (n_rows, k), n_vocab, ctypes.c_int32)
    logits = _view(_logits_at(ctx, first), size, (n_rows, k), n_vocab, ctypes.c_float)
    return ids, logits


# ctypes array types by (length, element type): made once each.
_BUFFERS: dict[tuple[int, Any], Any] = {}


def _view(
    address: int | None, size: int, shape: tuple[int, int], n_vocab: int, c_type: Any
) -> np.ndarray:
    if not address:
        raise BackendError("llama.cpp's backend sampling gave no rows")
    buffer_type = _BUFFERS.get((size, c_type))
    if buffer_type is None:
        if len(_BUFFERS) > 256:  # the sizes of a few contexts' verifies, kept
            _BUFFERS.clear()
        buffer_type = _BUFFERS[(size, c_type)] = c_type * size
    dtype = np.int32 if c_type is ctypes.c_int32 else np.float32
    buffer = buffer_type.from_address(address)
    return np.ndarray(shape, dtype, buffer, strides=(4 * n_vocab, 4))


class TopKRows:
    """llama.cpp's backend sampling on one sequence of a context: each output row's top-k,
    taken in the graph, read back as ``TopK`` rows."""

    def __init__(
        self,
        ctx: llama_cpp.llama_context_p,
        n_vocab: int,
        enabled: bool,
        name: str,
        seq: int = 0,
    ):
        self._ctx, self.n_vocab, self.enabled, self.name = ctx, n_vocab, enabled, name
        self.seq = seq
        self.k = 0
        self.warped: SamplingParams | None = None
        # A row's k candidates and logits as ctypes arrays (read from llama.cpp's buffer).
        self._row_types: tuple[type[ctypes.Array], type[ctypes.Array]] = (
            ctypes.c_int32 * 0,
            ctypes.c_float * 0,
        )
        self._chain: llama_cpp.llama_sampler_p | None = None

    def set(self, k: int, warped: SamplingParams | None = None) -> int:
        """Rows' top-k from the next decode on (0: whole rows); the k in effect. ``warped``:
        the rest of the warp runs in the chain too, with these parameters (``TopK.warped``:
        a draft's rows, whose q is whatever the guesses are drawn from)."""
        k = min(k, self.n_vocab)
        if warped is not None and (warped.greedy or k == 0):
            warped = None
        if (k, warped) == (self.k, self.warped) or not self.enabled:
            return self.k
        old = self._chain
        if old is not None:
            llama_cpp.llama_set_sampler(self._ctx, self.seq, None)
        self._chain, self.k, self.warped = None, 0, None
        if k > 0:
            chain = llama_cpp.llama_sampler_chain_init(
                llama_cpp.llama_sampler_chain_default_params()
            )
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_k(k))
            if warped is not None:  # llama.cpp's order, as core.sampling.warp's
                if warped.top_p < 1.0:
                    top_p = llama_cpp.llama_sampler_init_top_p(warped.top_p, 1)
                    llama_cpp.llama_sampler_chain_add(chain, top_p)
                if warped.min_p > 0.0:
                    min_p = llama_cpp.llama_sampler_init_min_p(warped.min_p, 1)
                    llama_cpp.llama_sampler_chain_add(chain, min_p)
                temp = llama_cpp.llama_sampler_init_temp(warped.temperature)
                llama_cpp.llama_sampler_chain_add(chain, temp)
            # A chain is initialised for one context once: a new one each time it is set.
            if llama_cpp.llama_set_sampler(self._ctx, self.seq, chain):
                self._chain, self.k, self.warped = chain, k, warped
                self._row_types = (ctypes.c_int32 * k, ctypes.c_float * k)
            else:
                llama_cpp.llama_sampler_free(chain)
        if old is not None:
            llama_cpp.llama_sampler_free(old)
        return self.k

    def rows(self, n_logits: int, first: int | None = None) -> list[TopK]:
        """The last decode's ``n_logits`` rows from batch index ``first`` (default: the last
        ``n_logits`` rows): llama.cpp keeps them a row of ``n_vocab`` apart, in output order,
        the first ``k`` of each filled (copies: the buffer is reused)."""
        first = -n_logits if first is None else first
        at_ids, at_logits = self._addresses(first)
        if self.warped is None and (self.k, n_logits) != (1, 1):  # a greedy argmax: no check
            self._count(first)
        return self.read(at_ids, at_logits, n_logits)

    def read(self, at_ids: int, at_logits: int, n_logits: int) -> list[TopK]:
        """``n_logits`` rows of this chain's from the addresses of the first one's candidates
        and logits (``_addresses``), each row ``n_vocab`` after the one before."""
        k, n = self.k, self.n_vocab
        # Each row read as Python numbers: the host warps a top-k's few candidates in Python
        # (``core.sampling.TopK``), and a verify reads its rows only as far as it keeps guesses.
        warped = self.warped
        id_row, logit_row = self._row_types
        out = []
        for i in range(n_logits):  # llama.cpp keeps a whole row's room for each output
            logits = logit_row.from_address(at_logits + 4 * n * i)[:]
            ids = id_row.from_address(at_ids + 4 * n * i)  # read below, as far as needed
            if warped is not None:  # a draft's rows: q is the chain's
                # The chain leaves -inf past the support; where they all come last (llama.cpp
                # sorts its top-k), only the support's ids are read.
                support = k - logits.count(_NEG)
                if 0 < support < k and logits.index(_NEG) == support:
                    del logits[support:]
                    out.append(TopK.final(ids[:support], logits, n, warped, finite=True))
                else:
                    out.append(TopK.final(ids[:], logits, n, warped))
            else:
                out.append(TopK(ids[:], logits, n))
        return out

    def check(self, first: int, n_logits: int) -> int:
        """That the chain ran on the last decode's rows from batch index ``first`` (read
        elsewhere, ``read_block``); where their candidates are."""
        at_ids, _ = self._addresses(first)
        if self.warped is None and (self.k, n_logits) != (1, 1):
            self._count(first)
        return at_ids

    def _addresses(self, first: int) -> tuple[int, int]:
        """Where the rows' candidates and logits from batch index ``first`` are: none (null)
        where the chain did not run on them."""
        assert _candidates_at is not None and _logits_at is not None, "backend sampling bound"
        at_ids, at_logits = _candidates_at(self._ctx, first), _logits_at(self._ctx, first)
        if not at_ids or not at_logits:
            raise BackendError(f"llama.cpp's backend sampling gave no rows for {self.name}")
        return at_ids, at_logits

    def _count(self, first: int) -> None:
        if llama_cpp.llama_get_sampled_candidates_count_ith(self._ctx, first) != self.k:
            raise BackendError(f"llama.cpp's backend sampling gave no rows for {self.name}")

    def close(self) -> None:
        """Free the chain; the context that held it is freed first (or detaches it here)."""
        if self._chain is not None:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None


def read_steps(
    chains: Sequence[TopKRows], counts: Sequence[int], firsts: Sequence[int]
) -> list[TopK] | None:
    """The rows of several sequences' draft steps in one decode (their ``chains``, the rows
    each asked for, from which batch index): one row each from one warped chain, read in one
    loop (None: the items are not such steps). Their outputs come in batch order, ``n_vocab``
    apart (llama.cpp's output_reorder): the first's and the last's addresses are asked of
    llama.cpp, the others' are their places between. Asked of each, as a single row is, they
    cost every stream two calls into llama.cpp a step."""
    chain = chains[0]
    if chain.warped is None:
        return None
    for rows, n_logits in zip(chains, counts, strict=True):
        if n_logits != 1 or rows.k != chain.k:
            return None
        if rows.warped is not chain.warped and rows.warped != chain.warped:
            return None
    at_ids, at_logits = chain._addresses(firsts[0])
    span = 4 * chain.n_vocab * (len(chains) - 1)
    if chains[-1]._addresses(firsts[-1]) != (at_ids + span, at_logits + span):
        return None
    return chain.read(at_ids, at_logits, len(chains))


def pick_verifies(
    ctx: llama_cpp.llama_context_p,
    chains: Sequence[TopKRows],
    counts: Sequence[int],
    firsts: Sequence[int],
    pickings: Sequence[Picking | None],
) -> dict[int, PickedRows]:
    """The last decode's rows of the items that asked for their picks (``pickings``), by item:
    the rows of one warp (and one k) read from llama.cpp's buffer as one block and picked in
    one pass over them all (``core.coupling.pick_block``), where they are at least
    PICK_TOGETHER_ROWS rows; a row at a time, each sequence's rule costs every row again and
    the loop's host time would grow with the streams. ``chains``, ``counts``, ``firsts``: each
    item's rows, how many it asked for, from which batch index."""
    groups: dict[tuple[SamplingParams, int], list[int]] = {}
    starts, outputs = [], 0
    for j, (rows, n_logits, picking) in enumerate(zip(chains, counts, pickings, strict=True)):
        starts.append(outputs)  # its first output row: outputs come in batch order
        outputs += n_logits
        if picking is not None and n_logits and rows.k and rows.warped is None:
            groups.setdefault((picking.params, rows.k), []).append(j)
    picked: dict[int, PickedRows] = {}
    for (params, k), members in groups.items():
        if sum(counts[j] for j in members) < PICK_TOGETHER_ROWS:
            continue
        n_vocab = chains[members[0]].n_vocab
        # Outputs are the flagged tokens in batch order, ``n_vocab`` apart (llama.cpp's
        # output_reorder): where an item's rows lie elsewhere, each is read as before.
        where = [chains[j].check(firsts[j], counts[j]) for j in members]
        base, last = starts[members[0]], members[-1]
        if any(
            a != where[0] + 4 * n_vocab * (starts[j] - base)
            for a, j in zip(where, members, strict=True)
        ):
            continue
        span = starts[last] + counts[last] - base
        ids, logits = read_block(ctx, firsts[members[0]], span, k, n_vocab)
        wanted = [r - base for j in members for r in range(starts[j], starts[j] + counts[j])]
        if len(wanted) < span:  # other items' rows between: left out
            ids, logits = ids[wanted], logits[wanted]
        asked = [(cast(Picking, pickings[j]), counts[j]) for j in members]
        picks = pick_block(ids, logits, params, asked)
        id_lists, logit_lists = ids.tolist(), logits.tolist()
        read = [TopK(i, v, n_vocab) for i, v in zip(id_lists, logit_lists, strict=True)]
        at = 0
        for j, (picking, n), got in zip(members, asked, picks, strict=True):
            picked[j] = PickedRows(read[at : at + n], picking, got)
            at += n
    return picked
