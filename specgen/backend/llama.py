"""A GGUF loaded through llama-cpp-python's low-level API: tokenize, decode, roll back.

It wraps the low-level API (batches with per-row logits flags, ``llama_decode``,
``llama_get_logits``, ``llama_memory_seq_rm``), never the high-level ``Llama`` class, whose
``logits_all=True`` would compute and keep logits for every prompt token. It knows nothing of
speculation: the engine decides what to decode and which logits rows to read.

Rolling back. An attention model's cache is cut at any position. A recurrent or hybrid model
(Qwen3.5/3.6's Gated DeltaNet, Mamba, Nemotron-H, LFM2) keeps one state per sequence, which
cannot be cut, so it rolls back one of two ways:

- *bounded*: llama.cpp keeps per-token snapshots of the state for the last decode
  (``n_rs_seq``, the context's ``rollback_window``); a rollback of at most that many tokens of
  the last decode just picks one. It costs memory, the state x(1 + n_rs_seq), and no time;
- *checkpoint*: where the caller says a rollback may reach further back, or span several
  decodes (``keep_rollback_point``), the state is copied first; a rollback restores the copy
  and decodes again the tokens that were kept. It costs that copy and that decode, every time.

Sequences. A context may hold several sequences (``ModelOptions.n_seq``), each with its own
cache of ``n_ctx`` tokens: the model is sequence 0, ``sequence(i)`` a view of sequence i on the
same weights and context, and ``decode_together`` decodes several sequences' tokens in one
batch (one pass over the weights for all of them). Where a scheduler gathers decodes
(``gather``), a view's ``decode`` is handed to it instead of run at once.

Rows. A decode returns the whole vocabulary's logits per row, or, once ``sample_top_k(k)`` is
set, each row's k likeliest tokens (``core.sampling.TopK``), taken in the graph by llama.cpp's
backend sampling: on a GPU the whole row never leaves the device. The engine chooses which
(``core.sampling.row_top_k``: the backend's where ``rows_on_device``, whole rows on a CPU).
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import llama_cpp
import numpy as np

from specgen.backend.ggml import supports_gpu_offload
from specgen.backend.grammar import tokenizer_for
from specgen.backend.rows import BACKEND_SAMPLING, TopKRows, pick_verifies, read_steps
from specgen.backend.runtime import decode, init_backend
from specgen.backend.vocab import Vocabulary
from specgen.core.coupling import PickedRows, Picking
from specgen.core.sampling import Rows, SamplingParams
from specgen.errors import BackendError, ContextFull
from specgen.host.machine import default_threads

if TYPE_CHECKING:
    from specgen.structured.grammar import Grammar, Matcher

_PARTIAL = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY  # the recurrent (and SWA) state alone


def _backend_sampling_default() -> bool:
    return os.environ.get("SPECGEN_BACKEND_SAMPLING") != "0"


@dataclass(frozen=True)
class ModelOptions:
    """How to load one model. ``n_ctx=0`` means min(4096, the model's training context).

    ``workers`` (``host:port``, probed already) take the layers ``n_gpu_layers`` offloads;
    ``local_head`` keeps the output layer and embeddings on this machine even then.
    """

    n_ctx: int = 0
    n_threads: int = 0
    n_gpu_layers: int = -1
    n_batch: int = 512
    workers: tuple[str, ...] = ()
    local_head: bool = True
    # A recurrent or hybrid model: how many trailing tokens of a decode a rollback may drop
    # without a checkpoint (llama.cpp's n_rs_seq; clamped to 0 where the architecture has none).
    rollback_window: int = 0
    mtp: bool = False  # load the GGUF's MTP (nextn) layers, for an MtpHead to draft with
    # Rows as their top-k from llama.cpp's backend sampling where asked (``sample_top_k``);
    # SPECGEN_BACKEND_SAMPLING=0 turns it off (llama.cpp calls it experimental).
    backend_sampling: bool = field(default_factory=_backend_sampling_default)
    # Sequences that share the context (``sequence``), each with a cache of n_ctx tokens.
    n_seq: int = 1
    flash_attn: int = -1  # llama.cpp's flash_attn_type: -1 auto, 0 off, 1 on


def backend_sampling() -> Literal["on", "off", "absent"]:
    """Whether rows come as their top-k from llama.cpp's backend: ``on``, ``off`` (turned off
    by SPECGEN_BACKEND_SAMPLING=0), or ``absent`` (not in this build)."""
    if not BACKEND_SAMPLING:
        return "absent"
    return "on" if _backend_sampling_default() else "off"


@dataclass
class RollbackCounts:
    """How a recurrent model's rollbacks went: by ``bounded`` snapshot or by ``checkpoint``
    (with the seconds its copies, restores and decodes again took); ``checkpoints`` taken."""

    bounded: int = 0
    checkpoint: int = 0
    checkpoints: int = 0
    checkpoint_seconds: float = 0.0
    replayed_tokens: int = 0

    def as_dict(self) -> dict[str, float]:
        return dict(vars(self))


@dataclass
class _Checkpoint:
    n_past: int
    state: ctypes.Array[ctypes.c_uint8]
    since: list[int] = field(default_factory=list)  # tokens decoded after it


class DecodeListener(Protocol):
    """What follows every decode of a model (an MTP head reads the target's hidden states):
    told of each decoded chunk (its tokens, their first position, and the batch row where they
    begin: a batch may hold several sequences), of each cut back, of a reset, and closed with
    the model."""

    def read(self, tokens: list[int], start: int, row: int = 0) -> None: ...
    def cut(self, n_past: int) -> None: ...
    def reset(self) -> None: ...
    def close(self) -> None: ...


# A scheduler that gathers decodes: given the model (a sequence), its tokens, how many rows of
# logits it wants and how they may be picked, it returns them once decoded with others'.
Gather = Callable[[Any, list[int], int, Picking | None], Rows]


class _BatchFill:
    """The fields of a context's ``llama_batch`` as ctypes pointers taken once: a ctypes
    structure makes a new pointer object at every field access, and a draft step fills one
    token (each sequence one seq id, set here for good)."""

    def __init__(self, batch: llama_cpp.llama_batch, n_batch: int) -> None:
        self.token: Any = batch.token
        self.pos: Any = batch.pos
        self.logits: Any = batch.logits
        self.seq: list[Any] = [batch.seq_id[i] for i in range(n_batch)]
        for i in range(n_batch):
            batch.n_seq_id[i] = 1


# The most a compaction copies (its buffer is kept): past it, the cache is left as it is.
COMPACT_BYTES = 256 << 20


@dataclass
class _Shared:
    """What every sequence of one context shares: who gathers decodes (None: none), and the
    views made so far (freed with the context)."""

    gather: Gather | None = None
    views: dict[int, LlamaModel] = field(default_factory=dict)
    # Weights loaded beside this context for its sequences' heads (``backend.heads``), by file.
    weights: dict[str, Any] = field(default_factory=dict)
    freed: int = 0  # cells its sequences' rollbacks and resets freed since the last ``compact``
    copy: bytearray = field(default_factory=bytearray)  # ``compact``'s, kept for the next one


class LlamaModel(Vocabulary):
    """A loaded model with its own context, KV cache and decode batch: sequence 0 of
    ``n_seq`` (``sequence`` gives the others)."""

    def __init__(
        self, path: str | Path, options: ModelOptions = ModelOptions(), verbose: bool = False
    ) -> None:
        super().__init__(
            path,
            verbose,
            _weights=True,
            n_gpu_layers=options.n_gpu_layers,
            workers=options.workers,
            local_head=options.local_head,
            load_mtp=options.mtp,
        )
        model = self._model
        # Recurrent state that cannot be cut at any position (pure recurrent, or hybrid).
        self.recurrent = bool(
            llama_cpp.llama_model_is_recurrent(model) or llama_cpp.llama_model_is_hybrid(model)
        )
        self.mtp_loaded = options.mtp
        self.n_nextn = int(llama_cpp.llama_model_n_layer_nextn(model))
        n_train = int(llama_cpp.llama_model_n_ctx_train(self._model))
        n_ctx = options.n_ctx or min(4096, n_train or 4096)
        n_threads = options.n_threads or default_threads()
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx * options.n_seq
        params.n_seq_max = options.n_seq
        # Several sequences share one pool of cells: llama.cpp then cuts a batch into ubatches
        # as they come (one graph pass for every sequence's [last, guesses] whatever their
        # lengths); a stream a sequence would cut it into equal lengths per sequence, a pass
        # per length, and unequal K would pay the weights once per length.
        params.kv_unified = options.n_seq > 1
        params.n_batch = min(options.n_batch, n_ctx * options.n_seq)
        params.n_ubatch = params.n_batch
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        params.n_rs_seq = options.rollback_window if self.recurrent else 0
        params.flash_attn_type = options.flash_attn
        # Backend sampling serves this many rows a decode (llama.cpp's default is one): a
        # verify pass reads K + 1.
        params.n_outputs_max_per_seq = params.n_batch
        ctx = llama_cpp.llama_init_from_model(self._model, params)
        if not ctx:
            raise BackendError(
                f"llama.cpp could not create a context of {n_ctx} tokens for "
                f"{self.path.name} (too little memory? try a smaller --ctx-size)"
            )
        self._ctx = ctx
        self._mem = llama_cpp.llama_get_memory(ctx)
        self.n_seq = options.n_seq
        # Each sequence's own share: in one pool, a sequence could take the others' cells.
        n_ctx_seq = int(llama_cpp.llama_n_ctx_seq(ctx))
        self.n_ctx = n_ctx_seq if options.n_seq == 1 else min(n_ctx, n_ctx_seq)
        self.n_batch = int(params.n_batch)
        self.n_threads = n_threads
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        self._fill = _BatchFill(self._batch, self.n_batch)
        self._shared = _Shared()
        self.description = self._describe()
        # Tokens a rollback may drop at once: any number for an attention model; for a
        # recurrent one, llama.cpp's snapshots (0 where its architecture has none).
        self.rollback_window = int(llama_cpp.llama_n_rs_seq(ctx)) if self.recurrent else n_ctx
        self.rollbacks = RollbackCounts()
        self._tokenizer: Any = None  # llguidance's, built on the first grammar
        self.backend_sampling = BACKEND_SAMPLING and options.backend_sampling
        self._sequence_state(0)
        # Where its rows are computed: llama.cpp offloads the output layer first, so on a GPU
        # with any layer offloaded, or on a worker unless the head is kept here.
        on_gpu = supports_gpu_offload() and options.n_gpu_layers != 0
        self.rows_on_device = on_gpu or (bool(options.workers) and not options.local_head)
        # Whether ``compact`` pays here: several sequences' cells in one pool, attended to on
        # this CPU (measured there; a GPU's attention and a worker's are not).
        self.compacts = (
            options.n_seq > 1 and not self.recurrent and not options.workers and not on_gpu
        )

    def _sequence_state(self, seq: int) -> None:
        """What is this sequence's own: its id, its cache's length, its rollback point, the
        head that follows it, and its rows."""
        self.seq = seq
        self.n_past = 0
        self._checkpoint: _Checkpoint | None = None
        self._last_decode = 0  # where the last decode began
        self._even = True  # the last decode's batch gave every sequence as many tokens
        self.head: DecodeListener | None = None  # e.g. an MTP head (``backend.mtp.attach``)
        self._rows = TopKRows(self._ctx, self.n_vocab, self.backend_sampling, self.path.name, seq)

    def sequence(self, seq: int) -> LlamaModel:
        """Sequence ``seq`` (0 is this model itself) of this context: the same weights, its own
        cache. Freed with the model."""
        assert 0 <= seq < self.n_seq, f"the context holds {self.n_seq} sequences"
        if seq == 0 or seq in self._shared.views:
            return self._shared.views.get(seq, self)
        view = object.__new__(LlamaModel)
        view.__dict__.update(self.__dict__)
        view._sequence_state(seq)
        self._shared.views[seq] = view
        return view

    def gather(self, gather: Gather | None) -> None:
        """From now on every sequence's ``decode`` goes to ``gather`` (None: decoded at once)."""
        self._shared.gather = gather

    @property
    def rollback_anywhere(self) -> bool:
        """Whether the cache can be cut at any earlier position (an attention model's can; a
        recurrent state, or an MTP head's hidden states, only go back within a cycle)."""
        return not self.recurrent and self.head is None

    def state_bytes(self) -> int:
        """Bytes of this sequence's recurrent state (one snapshot or checkpoint); 0 for an
        attention model. The state is allocated on the first decode: ask after it."""
        if not self.recurrent:
            return 0
        return int(llama_cpp.llama_state_seq_get_size_ext(self._ctx, self.seq, _PARTIAL))

    def _describe(self) -> str:
        buf = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(self._model, buf, 256)
        return buf.value.decode("utf-8", errors="replace")

    @property
    def top_k(self) -> int:
        """How rows come back: their top-k (k), or whole (0)."""
        return self._rows.k

    def sample_top_k(self, k: int, warped: SamplingParams | None = None) -> int:
        """From the next decode on, rows come back as their ``k`` likeliest tokens, taken on
        the backend (``k`` > 0), or whole (0); ``warped``: the rest of the warp too, in
        llama.cpp's sampler chain (``TopK.warped``, a draft's rows). Returns the k in effect:
        0 where this build of llama.cpp cannot sample on its backend. A change costs llama.cpp
        a new graph (once)."""
        return self._rows.set(k, warped)

    def decode(self, tokens: list[int], n_logits: int = 1, picking: Picking | None = None) -> Rows:
        """Append ``tokens`` to the cache; return logits of the last ``n_logits`` rows.

        Whole rows are a view into llama.cpp's buffer, shape (n_logits, n_vocab): valid until
        the next decode on this model, so read or copy what you keep before then. With
        ``sample_top_k`` set, a list of ``TopK`` rows (copies).
        """
        assert 0 <= n_logits <= len(tokens), "logits can only be asked for decoded rows"
        if self.n_past + len(tokens) > self.n_ctx:
            raise ContextFull(f"the context of {self.n_ctx} tokens is full")
        gather = self._shared.gather
        if gather is not None:
            return gather(self, tokens, n_logits, picking)  # picked there, where it pays
        if len(tokens) == 1:  # a draft's step, K of them a cycle: the least host work
            return self._step(tokens[0], n_logits)
        if 0 < len(tokens) <= self.n_batch:  # one batch: a verify, a catch-up
            return self.decode_together([(self, tokens, n_logits)], [picking])[0]
        rows: Rows = np.empty((0, self.n_vocab), dtype=np.float32)
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            wanted = max(0, n_logits - (len(tokens) - start - len(chunk)))
            rows = self.decode_together([(self, chunk, min(wanted, len(chunk)))])[0]
        return rows

    def decode_together(
        self,
        items: Sequence[tuple[Any, list[int], int]],
        pickings: Sequence[Picking | None] | None = None,
    ) -> list[Rows]:
        """One batch of several sequences of this context: each item's tokens appended to its
        sequence's cache, and its last ``n_logits`` rows (as ``decode`` gives them). The items
        hold at most ``n_batch`` tokens, one item a sequence. ``pickings``: each item's, where
        its top-k rows may come with their Gumbel-max picks (``PickedRows``), read and picked
        with the other items' in one block (``rows.pick_verifies``); several draft steps' rows
        are read in one loop (``rows.read_steps``)."""
        fill, i, firsts, rows = self._fill, 0, [], []
        assert sum(len(t) for _, t, _ in items) <= self.n_batch, "one batch at most"
        token_at, pos_at, seq_at, logits_at = fill.token, fill.pos, fill.seq, fill.logits
        for model, tokens, n_logits in items:
            assert isinstance(model, LlamaModel) and model._ctx is self._ctx, "of this context"
            if model.n_past + len(tokens) > model.n_ctx:
                raise ContextFull(f"the context of {model.n_ctx} tokens is full")
            first = len(tokens) - n_logits
            firsts.append(i + first)
            rows.append(i)
            position, seq = model.n_past, model.seq
            for j, token in enumerate(tokens):
                token_at[i] = token
                pos_at[i] = position + j
                seq_at[i][0] = seq
                logits_at[i] = j >= first
                i += 1
        self._decode_filled(i)
        out: list[Rows] = []
        # llama.cpp cuts a recurrent model's batch into ubatches of equal lengths a sequence:
        # where the lengths differ, a sequence's tokens may span ubatches, and its snapshots
        # then do not hold what a rollback needs (measured: a wrong state, not an error).
        even = len(items) == 1 or len({len(tokens) for _, tokens, _ in items}) == 1
        for (model, tokens, _), row in zip(items, rows, strict=True):
            model._decoded(tokens, row)
            model._even = even
        picked: dict[int, PickedRows] = {}
        if pickings is not None or len(items) > 1:  # rows read together (``backend.rows``)
            chains, counts = [model._rows for model, _, _ in items], [n for _, _, n in items]
            if pickings is not None:
                picked = pick_verifies(self._ctx, chains, counts, firsts, pickings)
            elif (steps := read_steps(chains, counts, firsts)) is not None:
                return [[row] for row in steps]
        for j, ((model, _, n_logits), first) in enumerate(zip(items, firsts, strict=True)):
            out.append(picked[j] if j in picked else model._rows_from(first, n_logits))
        return out

    def _step(self, token: int, n_logits: int) -> Rows:
        """``decode_together`` of this sequence's one token alone, in fewer steps: after each
        of llama.cpp's decodes the host's caches are cold, and every line between two
        decodes costs (``benchmarks/loop_cost.py``)."""
        fill = self._fill
        fill.token[0] = token
        fill.pos[0] = self.n_past
        fill.seq[0][0] = self.seq
        fill.logits[0] = n_logits
        self._decode_filled(1)
        self._decoded([token])
        self._even = True
        return self._rows_from(0, n_logits)

    def _decode_filled(self, n_tokens: int) -> None:
        """llama.cpp's decode of the batch's first ``n_tokens``, filled by the caller."""
        self._batch.n_tokens = n_tokens
        status = decode(self._ctx, self._batch)
        if status != 0:
            raise BackendError(f"llama_decode failed on {self.path.name} (status {status})")

    def _decoded(self, chunk: list[int], row: int = 0) -> None:
        if self._checkpoint is not None:
            self._checkpoint.since.extend(chunk)
        if self.head is not None:
            self.head.read(chunk, self.n_past, row)
        self._last_decode = self.n_past  # llama.cpp's snapshots cover this decode alone
        self.n_past += len(chunk)

    def _rows_from(self, first: int, n_logits: int) -> Rows:
        """The last decode's ``n_logits`` rows of this sequence, from batch index ``first``."""
        if n_logits == 0:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        if self.top_k:
            return self._rows.rows(n_logits, first)
        ptr = llama_cpp.llama_get_logits_ith(self._ctx, first)
        return np.ctypeslib.as_array(ptr, shape=(n_logits, self.n_vocab))

    def keep_rollback_point(self, undo: int, one_decode: bool = True) -> None:
        """The decodes that follow may be rolled back to here, by up to ``undo`` tokens: of
        ``one_decode`` that keeps at least its first token (a verify pass), or over several. A
        recurrent model whose snapshots cannot cover that copies its state now (a checkpoint);
        an attention model needs nothing."""
        if not self.recurrent:
            return
        self._checkpoint = None
        # With several sequences the snapshots hold only where the pass is even (``_even``),
        # known after it: a copy is kept all the same, and used only where they do not.
        if one_decode and undo <= self.rollback_window and self.n_seq == 1:
            return
        started = time.perf_counter()
        size = self.state_bytes()
        state = (ctypes.c_uint8 * size)()
        got = llama_cpp.llama_state_seq_get_data_ext(self._ctx, state, size, self.seq, _PARTIAL)
        if got != size:
            raise BackendError(f"llama.cpp could not copy the state of {self.path.name}")
        self._checkpoint = _Checkpoint(self.n_past, state)
        self.rollbacks.checkpoints += 1
        self.rollbacks.checkpoint_seconds += time.perf_counter() - started

    def _snapshots_cover(self, n_past: int) -> bool:
        """Whether llama.cpp's snapshots can take a recurrent state back to ``n_past``: at most
        ``rollback_window`` tokens, all of the last decode and not the whole of it (the state
        kept must be one that decode computed), once. Asked for more, llama.cpp's ``seq_rm``
        can return true and leave a wrong state, so specgen asks only this; with several
        sequences, only after a batch that gave each as many tokens (``decode_together``)."""
        covered = self._last_decode < n_past and self.n_past - n_past <= self.rollback_window
        return covered and (self.n_seq == 1 or self._even)

    def rollback(self, n_past: int) -> None:
        """Drop every cached position from ``n_past`` on (the rejected guesses)."""
        if n_past >= self.n_past:
            return
        cut = not self.recurrent or self._snapshots_cover(n_past)
        if cut and llama_cpp.llama_memory_seq_rm(self._mem, self.seq, n_past, -1):
            if self.recurrent:
                self.rollbacks.bounded += 1
                self._last_decode = self.n_past + 1  # used once: no second cut before a decode
            point = self._checkpoint
            if point is not None and point.n_past > n_past:
                self._checkpoint = None  # the rollback went back past it
            elif point is not None:
                del point.since[n_past - point.n_past :]  # it replays only what is kept
            self._shared.freed += self.n_past - n_past
            self.n_past = n_past
            if self.head is not None:
                self.head.cut(n_past)
            return
        point = self._checkpoint
        if point is None or point.n_past > n_past:
            raise BackendError(
                f"{self.path.name} cannot roll back its cache by {self.n_past - n_past} "
                f"tokens (a recurrent or hybrid model, and no checkpoint covers it)"
            )
        self._restore(point, n_past)

    def _restore(self, point: _Checkpoint, n_past: int) -> None:
        """Back to the checkpoint, then the kept tokens decoded again."""
        started = time.perf_counter()
        size = len(point.state)
        restored = llama_cpp.llama_state_seq_set_data_ext(
            self._ctx, point.state, size, self.seq, _PARTIAL
        )
        if restored != size:
            raise BackendError(f"llama.cpp could not restore the state of {self.path.name}")
        if not llama_cpp.llama_memory_seq_rm(self._mem, self.seq, point.n_past, -1):
            raise BackendError(f"llama.cpp could not cut the cache of {self.path.name}")
        self.n_past = point.n_past
        if self.head is not None:
            self.head.cut(point.n_past)
        again = point.since[: n_past - point.n_past]
        self._checkpoint = None
        if again:
            self.decode(again, 0)
        self._checkpoint = _Checkpoint(point.n_past, point.state, list(again))
        self.rollbacks.checkpoint += 1
        self.rollbacks.replayed_tokens += len(again)
        self.rollbacks.checkpoint_seconds += time.perf_counter() - started

    def cache_last_position(self) -> int:
        """The last position held in the KV cache (-1 when empty); for checks and tests."""
        return int(llama_cpp.llama_memory_seq_pos_max(self._mem, self.seq))

    def reset(self) -> None:
        """Empty this sequence's cache, as for a fresh run."""
        if self.n_seq == 1:
            llama_cpp.llama_memory_clear(self._mem, True)
        elif not llama_cpp.llama_memory_seq_rm(self._mem, self.seq, -1, -1):
            raise BackendError(f"llama.cpp could not empty a sequence of {self.path.name}")
        self._shared.freed += self.n_past
        self.n_past = 0
        self._checkpoint = None
        self._last_decode = 0
        if self.head is not None:
            self.head.reset()

    def compact(self) -> float | None:
        """Rewrite the shared cache so that each sequence's cells lie together, in the
        sequences' order; return the seconds it took (None: not done, the sequences' cells
        would take more than COMPACT_BYTES to copy).

        A batch's tokens take the cache's free cells in the batch's order, and a rollback frees
        cells that the next pass gives to whichever sequence comes first: after some cycles of
        guesses each sequence's cells are scattered among the others'. On a CPU, attention then
        reads each token's cells by skipping the others' at irregular places, and every pass
        runs slower, the plain ones too (``benchmarks/kv_layout.py``). Each sequence's cells are
        copied out (``llama_state_seq_get_data``, into one buffer kept for the next time), the
        cache emptied, and each copied back into cells side by side: the same keys and values
        at the same positions. Not for a recurrent model (its state is not cells)."""
        assert not self.recurrent, "a recurrent state is not laid out in cells"
        began = time.perf_counter()
        ctx, mem = self._ctx, self._mem
        sizes = [
            (seq, int(llama_cpp.llama_state_seq_get_size(ctx, seq)))
            for seq in range(self.n_seq)
            if llama_cpp.llama_memory_seq_pos_max(mem, seq) >= 0
        ]
        total = sum(size for _, size in sizes)
        if total > COMPACT_BYTES:
            return None
        shared = self._shared
        if len(shared.copy) < total:
            shared.copy = bytearray(total)
        parts, at = [], 0
        for seq, size in sizes:
            part = (ctypes.c_uint8 * size).from_buffer(shared.copy, at)
            if llama_cpp.llama_state_seq_get_data(ctx, part, size, seq) != size:
                raise BackendError(f"llama.cpp could not copy a sequence of {self.path.name}")
            parts.append((seq, part, size))
            at += size
        llama_cpp.llama_memory_clear(mem, False)
        for seq, part, size in parts:
            if llama_cpp.llama_state_seq_set_data(ctx, part, size, seq) != size:
                raise BackendError(f"llama.cpp could not restore a sequence of {self.path.name}")
        shared.freed = 0
        return time.perf_counter() - began

    @property
    def freed(self) -> int:
        """Cells the sequences' rollbacks and resets freed since the last ``compact``: holes
        that the next passes fill with whichever sequence's tokens come first."""
        return self._shared.freed

    @property
    def cells(self) -> int:
        """Cells the sequences hold (their positions)."""
        mem = self._mem
        return sum(
            int(llama_cpp.llama_memory_seq_pos_max(mem, seq)) + 1 for seq in range(self.n_seq)
        )

    def constrain(self, grammar: Grammar) -> Matcher:
        """A fresh grammar state for one generation on this model
        (``specgen.structured.grammar``)."""
        from specgen.structured.grammar import Matcher

        return Matcher(self.tokenizer(), grammar.compiled(), self.n_vocab)

    def tokenizer(self) -> Any:
        """llguidance's tokenizer for this vocabulary (built on the first grammar, then kept)."""
        if self._tokenizer is None:
            ends = [t for t in range(self.n_vocab) if self.is_eog(t)]
            self._tokenizer = tokenizer_for(self.vocab_ptr, ends, self.path.name)
        return self._tokenizer

    def listen(self, head: DecodeListener) -> None:
        """From now on ``head`` follows every decode, cut and reset of this model."""
        self.head = head

    @property
    def model_ptr(self) -> llama_cpp.llama_model_p:
        """llama.cpp's model handle (for a second context on the same weights)."""
        return self._model

    @property
    def ctx_ptr(self) -> llama_cpp.llama_context_p:
        """llama.cpp's context handle of this model's sequence."""
        return self._ctx

    def close(self) -> None:
        if getattr(self, "seq", 0):
            return  # a view: freed with the model that owns the context
        shared = getattr(self, "_shared", _Shared())
        for model in [*shared.views.values(), self]:  # every sequence's head, before the context
            head = getattr(model, "head", None)
            if head is not None:
                head.close()
                model.head = None
        if getattr(self, "_batch", None) is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_ctx", None):
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        for model in [self, *getattr(self, "_shared", _Shared()).views.values()]:
            if getattr(model, "_rows", None) is not None:  # after the context that held them
                model._rows.close()
        super().close()


def quantize(src: str | Path, dst: str | Path, ftype: str, n_threads: int = 0) -> None:
    """Convert a GGUF with llama.cpp's own quantizer (``ftype`` such as F32, F16, Q8_0, Q4_K_M)."""
    init_backend(False)
    upper = ftype.upper()
    name = "LLAMA_FTYPE_ALL_F32" if upper == "F32" else f"LLAMA_FTYPE_MOSTLY_{upper}"
    code = getattr(llama_cpp, name, None)
    if code is None:
        raise BackendError(f"unknown quantization type {ftype!r} (try F32, F16, Q8_0, Q4_K_M)")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = code
    params.allow_requantize = True
    params.nthread = n_threads or default_threads()
    status = llama_cpp.llama_model_quantize(
        str(src).encode(), str(dst).encode(), ctypes.byref(params)
    )
    if status != 0:
        raise BackendError(f"llama.cpp could not convert {src} to {ftype} (status {status})")
