"""A GGUF's vocabulary through llama.cpp: read alone (``vocab_only``, no weights) or as the
base of a loaded model (``llama.LlamaModel``): token facts, tokenize, pieces, the chat template."""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp

from specgen.backend.ggml import place_on_workers
from specgen.backend.runtime import init_backend, library_version
from specgen.errors import BackendError

_ALL_LAYERS = 2**31 - 1


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
        load_mtp: bool = False,
    ) -> None:
        init_backend(verbose)
        self.path = Path(path)
        self._eog: dict[int, bool] = {}
        if not self.path.is_file():
            raise BackendError(f"model file not found: {self.path}")
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = not _weights
        params.n_gpu_layers = _ALL_LAYERS if n_gpu_layers < 0 else n_gpu_layers
        params.load_mtp = load_mtp
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
    def vocab_ptr(self) -> llama_cpp.llama_vocab_p:
        """llama.cpp's vocabulary handle (for llguidance's tokenizer)."""
        return self._vocab

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
        """Whether ``token`` ends generation (asked of llama.cpp once a token: a draft asks
        after every guess, where a call into C costs more than a lookup)."""
        known = self._eog.get(token)
        if known is None:
            known = self._eog[token] = bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))
        return known

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
