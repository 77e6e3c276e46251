"""A target's own MTP (multi-token prediction, "nextn") head, drafting from a second context.

Qwen3.5/3.6 and others ship one more transformer block in the target's GGUF
(``blk.{N-1}.nextn.*``): given a token and the target's hidden state of the position before it,
it predicts the token after. llama.cpp runs it in a context of type MTP on the same weights; its
KV cache holds only that block. The sequence, as llama.cpp's own driver has it
(``common/speculative.cpp``, ``draft-mtp``):

- the target returns a hidden-state row for every token it decodes
  (``llama_set_embeddings_nextn(target, true, unmasked)``), and the head reads each token paired
  with the hidden state of the token before it: the head's cache at position p holds
  (x_p, h_{p-1}). llama.cpp reads each target decode as it comes; specgen keeps the rows
  (``read``) and the head reads them in one batch when it next drafts (``catch_up``), at most
  the latest ``READ_WINDOW``: a target that runs alone (``-k auto`` turned speculation off) pays
  only for copying rows, not for a layer per token, and a long prompt is read by the head only
  at its end. What the head read is its context; its guesses stay exact whatever it read, since
  each is judged by the q it was drawn from;
- to draft, the head decodes (last token, h of the position before it), then each guess with the
  head's own hidden state (``start``, ``step``): one full-vocabulary logits row per guess, so the
  engine's exact min(1, p/q) rule applies;
- before the target verifies, the drafted positions leave the head's cache (``end``); when the
  target rolls back, the head is cut with it (``cut``).

The five functions this needs are llama.cpp's staging API (``llama-ext.h``), exported under C++
names and bound by llama-cpp-python in ``llama_cpp_ext``, which says it is not stable: every use
is here, and a build without them is one clear error, never a crash.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

import llama_cpp
import numpy as np

from specgen.backend.rows import TopKRows
from specgen.backend.runtime import decode
from specgen.errors import BackendError

if TYPE_CHECKING:
    from specgen.backend.llama import LlamaModel
    from specgen.core.sampling import Row

# The most positions the head reads at once, the latest (of a prompt, or of text the target
# decoded alone): the cost of a probe after a long stretch without drafting stays bounded, and
# so does the memory of rows kept. With real weights the effect of the window on acceptance is
# unmeasured here (no MTP weights could be downloaded); llama.cpp reads everything.
READ_WINDOW = 256


class Unread:
    """What a head has not read yet of its target's decodes: tokens from position ``start`` on,
    each with a row of what the head reads of it, at most the latest ``READ_WINDOW``; ``gap``:
    older ones were dropped unread (the head's cache then starts afresh at ``start``)."""

    def __init__(self, width: int) -> None:
        self.tokens: list[int] = []
        self.rows = np.zeros((0, width), dtype=np.float32)
        self.start = 0
        self.gap = False

    def add(self, tokens: list[int], start: int, rows: np.ndarray) -> None:
        """The target decoded ``tokens`` from position ``start``; ``rows`` one a token."""
        if not self.tokens:
            self.start = start
        self.tokens += tokens
        self.rows = np.concatenate([self.rows, rows])
        drop = len(self.tokens) - READ_WINDOW
        if drop > 0:
            self.tokens = self.tokens[drop:]
            self.rows = self.rows[drop:]
            self.start += drop
            self.gap = True

    def keep_before(self, n_past: int) -> None:
        """The target rolled back to ``n_past`` tokens: what was past it goes."""
        keep = max(0, n_past - self.start)
        self.tokens = self.tokens[:keep]
        self.rows = self.rows[:keep]

    def taken(self) -> None:
        """The head read all of it."""
        self.tokens = []
        self.rows = self.rows[:0]

    def clear(self) -> None:
        """Nothing read, nothing unread: a fresh start."""
        self.taken()
        self.start = 0
        self.gap = False


def staging_api() -> ModuleType:
    """llama-cpp-python's bindings of llama.cpp's staging functions MTP drafting needs."""
    try:
        import llama_cpp.llama_cpp_ext as ext
    except (ImportError, AttributeError) as err:
        raise BackendError(
            f"this build of llama-cpp-python ({llama_cpp.__version__}) lacks llama.cpp's MTP "
            f"functions ({err}); install llama-cpp-python 0.3.36 or later, or pass --no-mtp"
        ) from err
    return ext


def supports_mtp() -> bool:
    """Whether this build has the functions MTP drafting needs."""
    try:
        staging_api()
    except BackendError:
        return False
    return True


class MtpHead:
    """The MTP layers of a loaded target, as a draft that shares its weights."""

    kind = "mtp"  # what its guesses are counted as

    def __init__(self, target: LlamaModel) -> None:
        if not target.mtp_loaded or target.n_nextn == 0:
            # llama.cpp aborts the process on an MTP context of a model loaded without them.
            raise BackendError(
                f"{target.path.name} was loaded without MTP layers; it cannot draft with its "
                f"MTP head (load it with them, or pass --no-mtp)"
            )
        if target.n_nextn != 1:
            raise BackendError(
                f"{target.path.name} has {target.n_nextn} chained MTP heads, which specgen "
                f"cannot drive yet; pass --no-mtp, or give a --draft model"
            )
        ext = staging_api()
        self._ext, self.target = ext, target
        self.n_vocab = target.n_vocab
        self.n_embd = int(llama_cpp.llama_model_n_embd_out(target.model_ptr))
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = target.n_ctx
        params.n_batch = target.n_batch
        params.n_ubatch = target.n_batch
        params.n_threads = target.n_threads
        params.n_threads_batch = target.n_threads
        params.ctx_type = llama_cpp.LLAMA_CONTEXT_TYPE_MTP
        params.n_rs_seq = 0
        params.ctx_other = target.ctx_ptr
        ctx = llama_cpp.llama_init_from_model(target.model_ptr, params)
        if not ctx:
            raise BackendError(f"llama.cpp could not create an MTP context for {target.path.name}")
        self._ctx = ctx
        self._mem = llama_cpp.llama_get_memory(ctx)
        self.rows_on_device = target.rows_on_device
        self._rows = TopKRows(ctx, self.n_vocab, target.backend_sampling, "the MTP head")
        ext.llama_set_embeddings_nextn(target.ctx_ptr, True, False)  # h for every target token
        ext.llama_set_embeddings_nextn(ctx, True, True)  # h for output rows only
        self._batch = llama_cpp.llama_batch_init(target.n_batch, self.n_embd, 1)
        self._tokens = (llama_cpp.llama_token * target.n_batch)()
        self._batch.token = self._tokens  # a batch that carries token ids and embeddings
        self._embd = np.ctypeslib.as_array(self._batch.embd, shape=(target.n_batch, self.n_embd))
        # The target's hidden states of its last decode (from position _h_start on), and the
        # one before them: what a cut back into that decode starts the next draft from.
        self._h = np.zeros((0, self.n_embd), dtype=np.float32)
        self._h_start = 0
        self._before = np.zeros(self.n_embd, dtype=np.float32)
        self._pending = self._before  # h of the position before the next one the head reads
        self._own: np.ndarray | None = None  # the head's own h after its last draft step
        self._draft_at = 0
        # What the head has not read yet: each token with the target's h of the position
        # before it.
        self._unread = Unread(self.n_embd)

    # -- following the target ----------------------------------------------------------------
    def read(self, tokens: list[int], start: int, row: int = 0) -> None:
        """The target just decoded ``tokens`` from position ``start`` (from ``row`` of its
        batch on): keep them, each with the hidden state of the position before it, for the
        head to read (``catch_up``)."""
        n = len(tokens)
        ptr = self._ext.llama_get_embeddings_nextn(self.target.ctx_ptr)
        if not ptr:
            raise BackendError("llama.cpp returned no hidden states for the MTP head")
        h = np.ctypeslib.as_array(ptr, shape=(row + n, self.n_embd))[row:]
        rows = np.empty((n, self.n_embd), dtype=np.float32)
        rows[0] = self._pending
        rows[1:] = h[:-1]
        self._unread.add(tokens, start, rows)
        self._before, self._h, self._h_start = self._pending, h.copy(), start
        self._pending = self._h[-1]

    def catch_up(self) -> int:
        """Read what the target decoded since the head last drafted; how many tokens."""
        unread = self._unread
        n = len(unread.tokens)
        if not n:
            return 0
        if unread.gap:  # the head's cache holds one stretch of positions, the latest
            llama_cpp.llama_memory_clear(self._mem, True)
            unread.gap = False
        step = self.target.n_batch
        for at in range(0, n, step):
            chunk = unread.tokens[at : at + step]
            self._decode(chunk, unread.start + at, unread.rows[at : at + step], False)
        unread.taken()
        return n

    def cut(self, n_past: int) -> None:
        """The target rolled back to ``n_past`` tokens, within its last decode."""
        if not self._h_start <= n_past <= self._h_start + len(self._h):
            raise BackendError("the MTP head can only roll back within the target's last decode")
        self._unread.keep_before(n_past)
        llama_cpp.llama_memory_seq_rm(self._mem, 0, n_past, -1)
        self._pending = (
            self._before if n_past == self._h_start else self._h[n_past - 1 - self._h_start]
        )

    def reset(self) -> None:
        llama_cpp.llama_memory_clear(self._mem, True)
        self._h = np.zeros((0, self.n_embd), dtype=np.float32)
        self._h_start = 0
        self._before = self._pending = np.zeros(self.n_embd, dtype=np.float32)
        self._unread.clear()

    # -- drafting ------------------------------------------------------------------------------
    @property
    def top_k(self) -> int:
        return self._rows.k

    def sample_top_k(self, k: int) -> int:
        """Rows from the next step on: their top-k from the backend (k), or whole (0)."""
        return self._rows.set(k)

    def start(self, token: int) -> Row:
        """Logits of the guess after ``token`` (the last one, not yet in the target's cache);
        ``catch_up`` first."""
        assert not self._unread.tokens, "the head reads what it missed before it drafts"
        self._draft_at = self.target.n_past
        return self._step(token, self._pending)

    def step(self, token: int) -> Row:
        """Logits of the guess after ``token`` (the last guess), from the head's own state."""
        assert self._own is not None, "step() follows start()"
        return self._step(token, self._own)

    def end(self) -> None:
        """Drafting is over: the drafted positions leave the head's cache (the target's verify
        pass writes them again with its own hidden states)."""
        llama_cpp.llama_memory_seq_rm(self._mem, 0, self.target.n_past, -1)
        self._own = None

    def _step(self, token: int, h: np.ndarray) -> Row:
        position = self._draft_at
        self._decode([token], position, h[None, :], output=True)
        self._draft_at += 1
        # One row per decode: a masked MTP context returns row 0's state for a longer batch.
        own = self._ext.llama_get_embeddings_nextn_ith(self._ctx, 0)
        if not own:
            raise BackendError("llama.cpp returned no hidden state from the MTP head")
        self._own = np.ctypeslib.as_array(own, shape=(self.n_embd,)).copy()
        if self._rows.k:
            return self._rows.rows(1)[0]
        logits = llama_cpp.llama_get_logits_ith(self._ctx, 0)
        return np.ctypeslib.as_array(logits, shape=(self.n_vocab,))

    def _decode(self, tokens: list[int], start: int, h: np.ndarray, output: bool) -> None:
        batch = self._batch
        for i, token in enumerate(tokens):
            self._tokens[i] = token
            batch.pos[i] = start + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = output and i == len(tokens) - 1
        self._embd[: len(tokens)] = h
        batch.n_tokens = len(tokens)
        status = decode(self._ctx, batch)
        if status != 0:
            raise BackendError(f"llama_decode failed on the MTP head (status {status})")

    def close(self) -> None:
        if getattr(self, "_batch", None) is not None:
            self._batch.token = None  # ours, not llama_batch_init's: it must not free it
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_ctx", None):
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_rows", None) is not None:  # after the context that held its chain
            self._rows.close()


def attach(target: LlamaModel) -> MtpHead:
    """The target's own MTP head, drafting from a second context on its weights; from now on
    it reads every decode of the target (one head a model: a second call returns the first)."""
    if isinstance(target.head, MtpHead):
        return target.head
    head = MtpHead(target)
    target.listen(head)
    return head
