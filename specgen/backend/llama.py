"""A GGUF loaded through llama-cpp-python's low-level API: tokenize, decode, roll back.

It wraps the low-level API (batches with per-row logits flags, ``llama_decode``,
``llama_get_logits``, ``llama_memory_seq_rm``), never the high-level ``Llama`` class, whose
``logits_all=True`` would compute and keep logits for every prompt token. It knows nothing of
speculation: the engine decides what to decode and which logits rows to read.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np

from specgen.backend.ggml import place_on_workers
from specgen.backend.runtime import init_backend, library_version
from specgen.errors import BackendError, ContextFull
from specgen.machine import default_threads

_ALL_LAYERS = 2**31 - 1


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


class Vocabulary:
    """A model's vocabulary alone, read without the weights (``vocab_only``)."""

    def __init__(
        self,
        path: str | Path,
        verbose: bool = False,
        *,
        _weights: bool = False,
        n_gpu_layers: int = 0,
        workers: tuple[str, ...] = (),
        local_head: bool = True,
    ) -> None:
        init_backend(verbose)
        self.path = Path(path)
        if not self.path.is_file():
            raise BackendError(f"model file not found: {self.path}")
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = not _weights
        params.n_gpu_layers = _ALL_LAYERS if n_gpu_layers < 0 else n_gpu_layers
        keep = place_on_workers(params, workers, local_head) if workers else []
        model = llama_cpp.llama_model_load_from_file(str(self.path).encode(), params)
        if not model:
            raise BackendError(
                f"llama.cpp could not load {self.path} (not a GGUF file, or an architecture this "
                f"build of llama.cpp ({library_version()}) does not know; try --verbose)"
            )
        self._placement = keep  # the model keeps pointers into these arrays
        self._model = model
        self._vocab = llama_cpp.llama_model_get_vocab(model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self._pieces: dict[int, bytes] = {}

    # -- facts about the vocabulary -----------------------------------------------------------
    @property
    def vocab_type(self) -> int:
        return int(llama_cpp.llama_vocab_type(self._vocab))

    @property
    def bos(self) -> int:
        return int(llama_cpp.llama_vocab_bos(self._vocab))

    @property
    def eos(self) -> int:
        return int(llama_cpp.llama_vocab_eos(self._vocab))

    @property
    def adds_bos(self) -> bool:
        return bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))

    @property
    def adds_eos(self) -> bool:
        return bool(llama_cpp.llama_vocab_get_add_eos(self._vocab))

    def token_text(self, token: int) -> bytes:
        """The vocabulary's stored text for a token (what llama.cpp's pair check compares)."""
        return llama_cpp.llama_vocab_get_text(self._vocab, token) or b""

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def chat_template(self) -> str | None:
        raw = llama_cpp.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8", errors="replace") if raw else None

    # -- text <-> tokens ----------------------------------------------------------------------
    def tokenize(
        self, text: str, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 16
        buf = (llama_cpp.llama_token * n_max)()
        n = llama_cpp.llama_tokenize(
            self._vocab, data, len(data), buf, n_max, add_special, parse_special
        )
        if n < 0:
            n_max = -n
            buf = (llama_cpp.llama_token * n_max)()
            n = llama_cpp.llama_tokenize(
                self._vocab, data, len(data), buf, n_max, add_special, parse_special
            )
        if n < 0:
            raise BackendError("llama.cpp could not tokenize the prompt")
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """The bytes a token stands for when printed (special tokens render as nothing)."""
        cached = self._pieces.get(token)
        if cached is None:
            buf = ctypes.create_string_buffer(64)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, 64, 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, -n, 0, False)
            cached = buf.raw[: max(n, 0)]
            self._pieces[token] = cached
        return cached

    def close(self) -> None:
        if getattr(self, "_model", None):
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        self.close()


class LlamaModel(Vocabulary):
    """A loaded model with its own context, KV cache and decode batch (one sequence, id 0)."""

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
        )
        n_train = int(llama_cpp.llama_model_n_ctx_train(self._model))
        n_ctx = options.n_ctx or min(4096, n_train or 4096)
        n_threads = options.n_threads or default_threads()
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = min(options.n_batch, n_ctx)
        params.n_ubatch = params.n_batch
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        ctx = llama_cpp.llama_init_from_model(self._model, params)
        if not ctx:
            raise BackendError(
                f"llama.cpp could not create a context of {n_ctx} tokens for "
                f"{self.path.name} (too little memory? try a smaller --ctx-size)"
            )
        self._ctx = ctx
        self._mem = llama_cpp.llama_get_memory(ctx)
        self.n_ctx = int(llama_cpp.llama_n_ctx(ctx))
        self.n_batch = int(params.n_batch)
        self.n_threads = n_threads
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        self.n_past = 0
        self.description = self._describe()

    def _describe(self) -> str:
        buf = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(self._model, buf, 256)
        return buf.value.decode("utf-8", errors="replace")

    def decode(self, tokens: list[int], n_logits: int = 1) -> np.ndarray:
        """Append ``tokens`` to the cache; return logits of the last ``n_logits`` rows.

        The result is a view into llama.cpp's buffer, shape (n_logits, n_vocab): it is valid until
        the next decode on this model, so read or copy what you keep before then.
        """
        assert 0 <= n_logits <= len(tokens), "logits can only be asked for decoded rows"
        if self.n_past + len(tokens) > self.n_ctx:
            raise ContextFull(f"the context of {self.n_ctx} tokens is full")
        start = 0
        while start < len(tokens):
            chunk = tokens[start : start + self.n_batch]
            first_logit_row = len(tokens) - n_logits - start
            self._decode_chunk(chunk, first_logit_row)
            start += len(chunk)
        if n_logits == 0:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        ptr = llama_cpp.llama_get_logits(self._ctx)
        return np.ctypeslib.as_array(ptr, shape=(n_logits, self.n_vocab))

    def _decode_chunk(self, chunk: list[int], first_logit_row: int) -> None:
        batch = self._batch
        for i, token in enumerate(chunk):
            batch.token[i] = token
            batch.pos[i] = self.n_past + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i >= first_logit_row
        batch.n_tokens = len(chunk)
        status = llama_cpp.llama_decode(self._ctx, batch)
        if status != 0:
            raise BackendError(f"llama_decode failed on {self.path.name} (status {status})")
        self.n_past += len(chunk)

    def rollback(self, n_past: int) -> None:
        """Drop every cached position from ``n_past`` on (the rejected guesses)."""
        if n_past >= self.n_past:
            return
        if not llama_cpp.llama_memory_seq_rm(self._mem, 0, n_past, -1):
            raise BackendError(
                f"{self.path.name} cannot roll back its cache (a recurrent or hybrid "
                f"architecture); speculative decoding needs a model that can"
            )
        self.n_past = n_past

    def cache_last_position(self) -> int:
        """The last position held in the KV cache (-1 when empty); for checks and tests."""
        return int(llama_cpp.llama_memory_seq_pos_max(self._mem, 0))

    def reset(self) -> None:
        """Empty the KV cache, as for a fresh run."""
        llama_cpp.llama_memory_clear(self._mem, True)
        self.n_past = 0

    def close(self) -> None:
        if getattr(self, "_batch", None) is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_ctx", None):
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
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
