"""EAGLE3 and DFlash heads: small drafters that read the target's own hidden states.

Both are GGUFs of their own (llama.cpp's ``eagle3`` and ``dflash`` architectures) loaded beside
the target, in a context that borrows the target's embeddings and output layer where the head
has none (``ctx_other``). The target hands them the inputs of some of its layers for every token
it decodes (``llama_set_embeddings_layer_inp``); what each head does with them, as llama.cpp's
own drivers have it (``common/speculative.cpp``, ``draft-eagle3`` and ``draft-dflash``):

- **EAGLE3** fuses three layers' states into one vector g per position (its encoder, ``fc``),
  and its one decoder layer reads, at position P, the pair (token P+1, g_P): the next token with
  what the target knew at P. So after the target has decoded up to position e, the head can
  write every pair but the last, whose token (e+1) is the one about to be drafted from. To
  draft, the head decodes (last, g_e) and then each guess with its own pre-norm state, one
  full-vocabulary row per guess (a reduced vocabulary comes back mapped through ``d2t``, -inf
  elsewhere), so the engine's exact min(1, p/q) rule applies.
- **DFlash** writes each position's fused states straight into its own cache, then drafts a
  whole block in one pass over ``[last, mask x n]`` (attention within the block not causal):
  row i is the head's distribution for guess i, given the context alone. A guess drawn from row
  i and judged by row i keeps the output exact.

Like ``backend.mtp``, a head keeps what the target decoded (``read``) and reads it when it next
drafts (``catch_up``), at most the latest ``READ_WINDOW`` positions; it is cut back with the
target (``cut``). Four of the functions this needs are llama.cpp's staging API, exported under
C++ names and bound by nobody: they are bound here (``_bound``), and a build without them is one
clear error, never a crash.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

import llama_cpp
import numpy as np

from specgen.backend.mtp import Unread, staging_api
from specgen.backend.rows import TopKRows
from specgen.backend.runtime import decode, init_backend
from specgen.backend.runtime import encode as run_encode
from specgen.errors import BackendError

if TYPE_CHECKING:
    from specgen.backend.llama import LlamaModel
    from specgen.core.sampling import Row

# The kinds of head, by their GGUF architecture, and what a person calls one.
EAGLE3, DFLASH = "eagle3", "dflash"
HEAD_KINDS = (EAGLE3, DFLASH)
HEAD_NAMES = {EAGLE3: "an EAGLE3 head", DFLASH: "a DFlash head"}
# The target architectures whose llama.cpp graph hands out a layer's input states (the models
# that set ``t_layer_inp`` in 0.3.36's src/models): on any other, llama.cpp aborts the process
# on the first decode with a head reading it. ``models.arch`` refuses them from the header
# first; this is the same list, for a head attached here directly.
LAYER_STATE_ARCHS = (
    "bailingmoe3", "deepseek4", "gemma4", "gpt-oss", "hunyuan_vl", "lfm2", "llama", "mimo2",
    "minimax-01", "minimax-m2", "muse-glimmer", "nanbeige", "nemotron_h", "qwen3", "qwen35",
    "qwen35moe", "qwen3moe", "qwen3next", "qwen4exp",
)  # fmt: skip

# llama.cpp's staging functions that llama-cpp-python 0.3.36 does not bind, by their Itanium
# C++ names (GCC and Clang; an MSVC build names them otherwise, and is told so).
_MANGLED = {
    "set_layer_inp": (
        "llama_set_embeddings_layer_inp",
        "_Z30llama_set_embeddings_layer_inpP13llama_contextjb",
        [llama_cpp.llama_context_p_ctypes, ctypes.c_uint32, ctypes.c_bool],
        None,
    ),
    "get_layer_inp": (
        "llama_get_embeddings_layer_inp",
        "_Z30llama_get_embeddings_layer_inpP13llama_contextj",
        [llama_cpp.llama_context_p_ctypes, ctypes.c_uint32],
        ctypes.POINTER(ctypes.c_float),
    ),
    "target_layer_ids": (
        "llama_model_target_layer_ids",
        "_Z28llama_model_target_layer_idsPK11llama_model",
        [llama_cpp.llama_model_p_ctypes],
        ctypes.POINTER(ctypes.c_int32),
    ),
    "target_layer_ids_n": (
        "llama_model_target_layer_ids_n",
        "_Z30llama_model_target_layer_ids_nPK11llama_model",
        [llama_cpp.llama_model_p_ctypes],
        ctypes.c_uint32,
    ),
}
_bindings: SimpleNamespace | None = None


def _bound() -> SimpleNamespace:
    """The functions the heads need: llama-cpp-python's bindings of the MTP staging API, and
    ours of the four it leaves out."""
    global _bindings
    if _bindings is not None:
        return _bindings
    ext = staging_api()
    lib = llama_cpp.llama_cpp._lib
    found: dict[str, object] = {}
    for name, (plain, symbol, argtypes, restype) in _MANGLED.items():
        try:
            function = getattr(lib, symbol)
        except AttributeError as err:
            raise BackendError(
                f"this build of llama.cpp lacks {plain}, which EAGLE3 and DFlash heads need "
                f"(llama-cpp-python 0.3.36 built with GCC or Clang has it); draft with a draft "
                f"model instead"
            ) from err
        function.argtypes, function.restype = argtypes, restype
        found[name] = function
    _bindings = SimpleNamespace(ext=ext, **found)
    return _bindings


def supports_heads() -> bool:
    """Whether this build has the functions EAGLE3 and DFlash heads need."""
    try:
        _bound()
    except BackendError:
        return False
    return True


@dataclass
class _Weights:
    """A head's weights, loaded once for every sequence of one target context: each sequence's
    head has a context of its own on them (``users``); the last to close frees them."""

    model: llama_cpp.llama_model_p
    shelf: dict[str, object]
    key: str
    users: int = 0

    def release(self) -> None:
        self.users -= 1
        if self.users <= 0:
            self.shelf.pop(self.key, None)
            llama_cpp.llama_model_free(self.model)


def _weights_for(target: LlamaModel, path: Path, kind: str) -> _Weights:
    """The head file's weights beside ``target``'s context, loaded on first use."""
    shelf = target._shared.weights
    key = str(path.resolve())
    found = shelf.get(key)
    if not isinstance(found, _Weights):
        init_backend(False)
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = 2**31 - 1 if target.rows_on_device else 0
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not model:
            raise BackendError(f"llama.cpp could not load {path.name} as {HEAD_NAMES[kind]}")
        found = _Weights(model, shelf, key)
        shelf[key] = found
    found.users += 1
    return found


class _Head:
    """What both kinds share: the head's weights and context beside the target's, the target's
    layer states kept for the head to read, and the cut back with the target."""

    kind = ""

    def __init__(self, target: LlamaModel, path: Path) -> None:
        api = _bound()
        self._api, self.target, self.path = api, target, Path(path)
        self._weights: _Weights | None = _weights_for(target, self.path, self.kind)
        try:
            self._open(self._weights.model)
            self._more()
        except BaseException:
            self.close()  # the weights go back too: a refused head leaves nothing loaded
            raise
        # Only a head that passed every check has the target hand out its layers' states.
        for lid in self.layers:
            api.set_layer_inp(target.ctx_ptr, lid, True)

    def _more(self) -> None:
        """What a kind of head checks and keeps of its own (after the context is open)."""

    def _open(self, model: llama_cpp.llama_model_p) -> None:
        api, target = self._api, self.target
        self._model = model
        self._metadata = _meta(model)  # the head's GGUF metadata, read once
        arch = self._metadata.get("general.architecture", "?")
        if arch != self.kind:
            raise BackendError(f"{self.path.name} is a {arch} model, not {HEAD_NAMES[self.kind]}")
        n_vocab = int(llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model)))
        if n_vocab != target.n_vocab:
            raise BackendError(
                f"{self.path.name} has a vocabulary of {n_vocab} tokens and {target.path.name} "
                f"one of {target.n_vocab}: it is a head for another target"
            )
        target_arch = _meta(target.model_ptr).get("general.architecture", "?")
        if target_arch not in LAYER_STATE_ARCHS:
            raise BackendError(
                f"{target.path.name} is a {target_arch} model, whose layers llama.cpp cannot "
                f"hand to a head"
            )
        n = int(api.target_layer_ids_n(model))
        ids = api.target_layer_ids(model)
        self.layers = tuple(int(ids[i]) for i in range(n))
        n_layer = int(llama_cpp.llama_model_n_layer(target.model_ptr))
        if n_layer in self.layers:
            raise BackendError(
                f"{self.path.name} reads the final hidden state of {target.path.name} (layer "
                f"{n_layer}), which specgen cannot hand to a head yet"
            )
        if not self.layers or any(not 0 <= lid < n_layer for lid in self.layers):
            raise BackendError(
                f"{self.path.name} reads layers {list(self.layers)} of its target, and "
                f"{target.path.name} has {n_layer}: it is a head for another target"
            )
        self.n_embd_target = int(llama_cpp.llama_model_n_embd(target.model_ptr))
        self.n_embd = int(llama_cpp.llama_model_n_embd(model))
        # llama.cpp reads each position's states as wide as the head was trained on (EAGLE3:
        # its target_hidden_size; DFlash: its own width): another width reads past the rows.
        trained = int(self._metadata.get(f"{self.kind}.target_hidden_size", "0") or 0)
        wanted = trained if self.kind == EAGLE3 else self.n_embd
        if wanted and wanted != self.n_embd_target:
            raise BackendError(
                f"{self.path.name} reads hidden states {wanted} wide and those of "
                f"{target.path.name} are {self.n_embd_target}: it is a head for another target"
            )
        self.n_vocab = target.n_vocab
        params_ctx = llama_cpp.llama_context_default_params()
        params_ctx.n_ctx = target.n_ctx
        params_ctx.n_batch = target.n_batch
        params_ctx.n_ubatch = target.n_batch
        params_ctx.n_threads = target.n_threads
        params_ctx.n_threads_batch = target.n_threads
        params_ctx.n_outputs_max_per_seq = target.n_batch
        params_ctx.ctx_other = target.ctx_ptr
        ctx = llama_cpp.llama_init_from_model(model, params_ctx)
        if not ctx:
            raise BackendError(f"llama.cpp could not create a context for {self.path.name}")
        self._ctx = ctx
        self._mem = llama_cpp.llama_get_memory(ctx)
        self.rows_on_device = target.rows_on_device
        self._rows = TopKRows(ctx, self.n_vocab, target.backend_sampling, self.path.name)
        self.n_batch = target.n_batch
        # What the target decoded that the head has not read: its tokens and layer states.
        self._unread = Unread(self.n_enc)

    @property
    def n_enc(self) -> int:
        """The width of one position's states, all the layers read side by side."""
        return len(self.layers) * self.n_embd_target

    # -- following the target ----------------------------------------------------------------
    def read(self, tokens: list[int], start: int, row: int = 0) -> None:
        """The target just decoded ``tokens`` from position ``start``, from ``row`` of its
        batch on: keep them with the states of the layers the head reads."""
        n = len(tokens)
        rows = np.empty((n, self.n_enc), dtype=np.float32)
        width = self.n_embd_target
        for i, lid in enumerate(self.layers):
            ptr = self._api.get_layer_inp(self.target.ctx_ptr, lid)
            if not ptr:
                raise BackendError(f"llama.cpp returned no states of layer {lid} for the head")
            states = np.ctypeslib.as_array(ptr, shape=(row + n, width))
            rows[:, i * width : (i + 1) * width] = states[row:]
        unread = self._unread
        in_order = not unread.tokens or start == unread.start + len(unread.tokens)
        assert in_order, "the head reads the target in order"
        unread.add(tokens, start, rows)

    def reset(self) -> None:
        llama_cpp.llama_memory_clear(self._mem, True)
        self._unread.clear()

    @property
    def top_k(self) -> int:
        return self._rows.k

    def sample_top_k(self, k: int) -> int:
        """Rows from the next step on: their top-k from the backend (k), or whole (0)."""
        return self._rows.set(k)

    def _row(self, index: int) -> Row:
        if self._rows.k:
            return self._rows.rows(1, index)[0]
        logits = llama_cpp.llama_get_logits_ith(self._ctx, index)
        return np.ctypeslib.as_array(logits, shape=(self.n_vocab,)).copy()

    def _run(
        self,
        positions: range,
        tokens: list[int] | None,
        embd: np.ndarray | None,
        outputs: set[int],
        encode: bool = False,
    ) -> None:
        """One decode (or encode) of the head: rows at ``positions``, with ``tokens`` and/or
        ``embd`` rows, logits for the rows in ``outputs``."""
        n = len(positions)
        width = 0 if embd is None else embd.shape[1]
        batch = llama_cpp.llama_batch_init(n, width, 1)
        ids = None
        try:
            if tokens is not None:
                ids = (llama_cpp.llama_token * n)(*tokens)
                if width:
                    batch.token = ids  # a batch with both: ours, not llama_batch_init's
                else:
                    ctypes.memmove(batch.token, ids, n * ctypes.sizeof(llama_cpp.llama_token))
            if embd is not None:
                ctypes.memmove(batch.embd, embd.ctypes.data, embd.nbytes)
            for i, position in enumerate(positions):
                batch.pos[i] = position
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = i in outputs
            batch.n_tokens = n
            status = (run_encode if encode else decode)(self._ctx, batch)
            if status != 0:
                raise BackendError(
                    f"llama.cpp failed on the {self.kind} head {self.path.name} (status {status})"
                )
        finally:
            if ids is not None and width:
                batch.token = None  # ours: llama_batch_free must not free it
            llama_cpp.llama_batch_free(batch)

    def close(self) -> None:
        if getattr(self, "_ctx", None):
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_rows", None) is not None:  # after the context that held its chain
            self._rows.close()
            self._rows = None  # type: ignore[assignment]
        weights = getattr(self, "_weights", None)
        if weights is not None:
            self._weights = None
            weights.release()


class Eagle3Head(_Head):
    """An EAGLE3 head: one decoder layer over (next token, fused target states), drafting one
    guess a step from its own state."""

    kind = EAGLE3

    def _more(self) -> None:
        if len(self.layers) != 3:
            raise BackendError(
                f"{self.path.name} reads {len(self.layers)} target layers; an EAGLE3 head reads 3"
            )
        self._api.ext.llama_set_embeddings_nextn(self._ctx, True, True)
        # The last position the target decoded whose pair is not written yet (the one the next
        # draft starts from), its g, and whether its pair is written already (a draft wrote it
        # with the token the target then decoded there).
        self._seed_at = -1
        self._seed = np.zeros(self.n_embd, dtype=np.float32)
        self._seed_written = False
        self._own: np.ndarray | None = None
        self._draft_at = 0
        # The g of every position of the last read (a cut back into it seeds the next draft).
        self._g = np.zeros((0, self.n_embd), dtype=np.float32)
        self._g_start = 0

    def _encode(self, states: np.ndarray) -> np.ndarray:
        """g for each row of ``states`` (the encoder: one pass, no cache)."""
        out = np.empty((len(states), self.n_embd), dtype=np.float32)
        for at in range(0, len(states), self.n_batch):
            chunk = states[at : at + self.n_batch]
            # The encoder reads no cache and no positions, but llama.cpp checks them against
            # the cache's: they go on from its last (as its own driver places them).
            after = int(llama_cpp.llama_memory_seq_pos_max(self._mem, 0)) + 1
            positions = range(after, after + len(chunk))
            self._run(positions, None, chunk, set(range(len(chunk))), encode=True)
            ptr = self._api.ext.llama_get_embeddings_nextn(self._ctx)
            if not ptr:
                raise BackendError(f"the EAGLE3 head {self.path.name} returned no g")
            out[at : at + len(chunk)] = np.ctypeslib.as_array(ptr, shape=(len(chunk), self.n_embd))
        return out

    def catch_up(self) -> int:
        """Write the pairs of what the target decoded since the head last drafted; how many
        positions it read."""
        unread = self._unread
        n = len(unread.tokens)
        if not n:
            return 0
        start = unread.start
        if unread.gap:  # the cache holds one stretch of positions, the latest
            llama_cpp.llama_memory_clear(self._mem, True)
            unread.gap, self._seed_at = False, -1
        g = self._encode(unread.rows)
        # The pairs (token P+1, g_P): the one left from the last read, then this read's but its
        # last, which waits for the token drafted from it.
        pairs_at, pairs_tokens, pairs_g = [], [], []
        if self._seed_at >= 0 and self._seed_at == start - 1 and not self._seed_written:
            pairs_at.append(start - 1)
            pairs_tokens.append(unread.tokens[0])
            pairs_g.append(self._seed)
        for i in range(n - 1):
            pairs_at.append(start + i)
            pairs_tokens.append(unread.tokens[i + 1])
            pairs_g.append(g[i])
        for at in range(0, len(pairs_at), self.n_batch):
            span = slice(at, at + self.n_batch)
            first = pairs_at[span][0]
            positions = range(first, first + len(pairs_at[span]))
            self._run(positions, pairs_tokens[span], np.stack(pairs_g[span]), set())
        self._g, self._g_start = g, start
        self._seed_at, self._seed, self._seed_written = start + n - 1, g[-1].copy(), False
        unread.taken()
        return n

    def cut(self, n_past: int) -> None:
        """The target rolled back to ``n_past`` tokens: pairs whose token is gone go, and the
        next draft starts from g of position n_past - 1."""
        unread = self._unread.start if self._unread.tokens else None
        self._unread.keep_before(n_past)
        last = n_past - 1
        llama_cpp.llama_memory_seq_rm(self._mem, 0, max(last, 0), -1)
        if unread is not None and last >= unread:
            return  # the seed comes with the rows still unread
        if last < 0:
            self.reset()
        elif last == self._seed_at:
            self._seed_written = False
        elif self._g_start <= last < self._g_start + len(self._g):
            self._seed_at, self._seed = last, self._g[last - self._g_start].copy()
            self._seed_written = False
        else:
            raise BackendError("the EAGLE3 head can only roll back within the target's last read")

    def reset(self) -> None:
        super().reset()
        self._seed_at, self._seed_written, self._own = -1, False, None
        self._g = self._g[:0]

    def start(self, token: int) -> Row:
        """Logits of the guess after ``token`` (the last one, not yet in the target's cache);
        ``catch_up`` first."""
        assert not self._unread.tokens, "the head reads what it missed before it drafts"
        if self._seed_at < 0:
            raise BackendError("the EAGLE3 head has read nothing of the target to draft from")
        self._draft_at = self._seed_at
        return self._step(token, self._seed)

    def step(self, token: int) -> Row:
        """Logits of the guess after ``token`` (the last guess), from the head's own state."""
        assert self._own is not None, "step() follows start()"
        return self._step(token, self._own)

    def end(self) -> None:
        """Drafting is over: the guesses' pairs leave the cache. The first pair stays: its token
        is the one the target verifies next, at the position after the seed's."""
        llama_cpp.llama_memory_seq_rm(self._mem, 0, self._seed_at + 1, -1)
        self._seed_written = self._own is not None or self._seed_written
        self._own = None

    def _step(self, token: int, g: np.ndarray) -> Row:
        position = self._draft_at
        llama_cpp.llama_memory_seq_rm(self._mem, 0, position, -1)
        self._run(range(position, position + 1), [token], g[None, :], {0})
        self._draft_at += 1
        own = self._api.ext.llama_get_embeddings_nextn_ith(self._ctx, 0)
        if not own:
            raise BackendError(f"the EAGLE3 head {self.path.name} returned no state")
        self._own = np.ctypeslib.as_array(own, shape=(self.n_embd,)).copy()
        return self._row(0)


class DFlashHead(_Head):
    """A DFlash head: the target's fused states written into its cache, a block of guesses from
    one pass."""

    kind = DFLASH

    def _more(self) -> None:
        meta = self._metadata
        # DSpark and DFlash2 heads (a Markov head, a selector lattice) are refused before they
        # load (``session.fit.check_head``): what is left is DFlash's plain block.
        self.block_size = int(meta.get("dflash.block_size", "16") or 16)
        self.mask = int(llama_cpp.llama_vocab_mask(llama_cpp.llama_model_get_vocab(self._model)))
        if not 0 <= self.mask < self.n_vocab:
            raise BackendError(
                f"{self.path.name} names no mask token (tokenizer.ggml.mask_token_id)"
            )
        causal = meta.get("dflash.attention.causal", "false") == "true"
        llama_cpp.llama_set_causal_attn(self._ctx, causal)
        self._written = 0  # the cache holds the target's states of positions below this
        self._drafted_at = -1  # where the last block went (removed by ``end``)

    @property
    def max_block(self) -> int:
        """The most guesses one pass drafts (the block's positions after the last token)."""
        return self.block_size - 1

    def catch_up(self) -> int:
        """Write the states of what the target decoded since the head last drafted into the
        head's cache; how many positions."""
        unread = self._unread
        n = len(unread.tokens)
        if not n:
            return 0
        if unread.gap or unread.start != self._written:
            llama_cpp.llama_memory_clear(self._mem, True)
            unread.gap = False
        for at in range(0, n, self.n_batch):
            chunk = unread.rows[at : at + self.n_batch]
            first = unread.start + at
            self._run(range(first, first + len(chunk)), None, chunk, set())
        self._written = unread.start + n
        unread.taken()
        return n

    def block(self, token: int, k: int) -> list[Row]:
        """The head's rows for the ``k`` guesses after ``token`` (the last one, not yet in the
        target's cache), from one pass over [token, mask x k]; ``catch_up`` first."""
        assert not self._unread.tokens, "the head reads what it missed before it drafts"
        k = max(0, min(k, self.max_block))
        if not k:
            return []
        at = self._written
        self._drafted_at = at
        tokens = [token] + [self.mask] * k
        self._run(range(at, at + k + 1), tokens, None, set(range(1, k + 1)))
        if self._rows.k:
            return list(self._rows.rows(k, 1))
        logits = llama_cpp.llama_get_logits_ith(self._ctx, 1)
        return list(np.ctypeslib.as_array(logits, shape=(k, self.n_vocab)).copy())

    def end(self) -> None:
        """Drafting is over: the block leaves the cache (the target's states take its place)."""
        if self._drafted_at >= 0:
            llama_cpp.llama_memory_seq_rm(self._mem, 0, self._drafted_at, -1)
            self._drafted_at = -1

    def cut(self, n_past: int) -> None:
        """The target rolled back to ``n_past`` tokens: the states past it go."""
        self._unread.keep_before(n_past)
        if self._written > n_past:
            llama_cpp.llama_memory_seq_rm(self._mem, 0, n_past, -1)
            self._written = n_past

    def reset(self) -> None:
        super().reset()
        self._written = 0
        self._drafted_at = -1


def _meta(model: llama_cpp.llama_model_p) -> dict[str, str]:
    """A loaded model's metadata, key to value as text."""
    out: dict[str, str] = {}
    buf = ctypes.create_string_buffer(256)
    for i in range(int(llama_cpp.llama_model_meta_count(model))):
        if llama_cpp.llama_model_meta_key_by_index(model, i, buf, 256) < 0:
            continue
        key = buf.value.decode("utf-8", "replace")
        if llama_cpp.llama_model_meta_val_str_by_index(model, i, buf, 256) < 0:
            continue
        out[key] = buf.value.decode("utf-8", "replace")
    return out


Head = Eagle3Head | DFlashHead


def attach(target: LlamaModel, path: str | Path, kind: str) -> Eagle3Head | DFlashHead:
    """The ``kind`` head in ``path``, loaded beside the target; from now on it reads every
    decode of the target (one head a model)."""
    if kind not in HEAD_KINDS:
        raise BackendError(f"unknown kind of head {kind!r} (known: {', '.join(HEAD_KINDS)})")
    if target.head is not None:
        raise BackendError(f"{target.path.name} has a head already")
    head: Eagle3Head | DFlashHead = (Eagle3Head if kind == EAGLE3 else DFlashHead)(
        target, Path(path)
    )
    target.listen(head)
    return head
