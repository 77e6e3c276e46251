"""Reading a GGUF file's header (its metadata) without llama.cpp and without the weights.

A GGUF begins with its metadata (architecture, quantization, context length, the vocabulary);
the tensors follow. Reading only the header lets ``specgen models info`` and ``models check``
describe a multi-gigabyte file on the Hub from a few megabytes of ranged reads, and lets the CPU
self-test learn a file's quantization cheaply. Pure: it reads from any ``read(n)`` callable.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MAGIC = b"GGUF"
# GGUF value types -> struct formats (little-endian); 8 is a string, 9 an array.
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9
# Arrays of these keys are kept whole, as are short arrays of numbers (per-layer settings such as
# a hybrid's head counts); other arrays (scores, merges, ...) are only counted.
KEPT_ARRAYS = ("tokenizer.ggml.tokens",)
SHORT_ARRAY = 4096
# tokenizer.ggml.model -> llama.cpp's vocabulary type, and whether it adds BOS / EOS by default
VOCAB_MODELS = {
    "no_vocab": (0, False, False),
    "llama": (1, True, False),
    "gpt2": (2, False, False),
    "gemma4": (2, True, False),  # BPE, as llama.cpp reads it (llama-vocab.cpp)
    "bert": (3, True, True),
    "t5": (4, False, True),
    "rwkv": (5, False, False),
    "plamo2": (6, False, False),
}
MAX_STRING = 1 << 26
MAX_COUNT = 1 << 31

Reader = Callable[[int], bytes]


class GGUFError(ValueError):
    """The bytes are not a GGUF header (wrong magic, cut short, nonsense sizes)."""


@dataclass
class Header:
    version: int
    n_tensors: int
    metadata: dict[str, Any]
    size: int  # bytes of header read
    tensors: tuple[str, ...] | None = None  # the tensors' names, where they were read

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)


def read_header(read: Reader, tensors: bool = False) -> Header:
    """The metadata of a GGUF, read from its first bytes; with ``tensors``, the names of its
    tensors too (they follow the metadata: a few dozen bytes a tensor)."""
    stream = _Stream(read)
    if stream.take(4) != MAGIC:
        raise GGUFError("not a GGUF file (it does not start with 'GGUF')")
    version = stream.unpack("<I")
    if version not in (2, 3):
        raise GGUFError(f"GGUF version {version} is not supported (2 and 3 are)")
    n_tensors, n_kv = stream.unpack("<Q"), stream.unpack("<Q")
    if n_kv > MAX_COUNT:
        raise GGUFError("the GGUF header is corrupt (absurd metadata count)")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = stream.string()
        kind = stream.unpack("<I")
        metadata[key] = stream.value(kind, keep=key in KEPT_ARRAYS)
    names: tuple[str, ...] | None = None
    if tensors:
        if n_tensors > MAX_COUNT:
            raise GGUFError("the GGUF header is corrupt (absurd tensor count)")
        found = []
        for _ in range(n_tensors):
            found.append(stream.string())
            n_dims = stream.unpack("<I")
            if n_dims > 8:
                raise GGUFError("the GGUF header is corrupt (a tensor of more than 8 dimensions)")
            stream.take(8 * n_dims + 4 + 8)  # dimensions, type, offset
        names = tuple(found)
    return Header(version, n_tensors, metadata, stream.offset, names)


class _Stream:
    def __init__(self, read: Reader) -> None:
        self._read, self.offset = read, 0

    def take(self, n: int) -> bytes:
        data = self._read(n)
        if len(data) != n:
            raise GGUFError("the GGUF header is cut short (a truncated or partial file)")
        self.offset += n
        return data

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.unpack("<Q")
        if n > MAX_STRING:
            raise GGUFError("the GGUF header is corrupt (absurd string length)")
        return self.take(n).decode("utf-8", errors="replace")

    def value(self, kind: int, keep: bool = True) -> Any:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.unpack("<I"), self.unpack("<Q")
            if count > MAX_COUNT or item == _ARRAY:
                raise GGUFError("the GGUF header is corrupt (absurd array)")
            if item in _SCALARS and not keep and count > SHORT_ARRAY:
                self.take(struct.calcsize(_SCALARS[item]) * count)
                return ArrayInfo(item, count)
            values = [self.value(item) for _ in range(count)]
            return values if keep or item in _SCALARS else ArrayInfo(item, count)
        raise GGUFError(f"the GGUF header is corrupt (unknown value type {kind})")


@dataclass(frozen=True)
class ArrayInfo:
    """An array that was skipped, not kept: its item type and length."""

    item_type: int
    count: int


class HeaderVocabulary:
    """A vocabulary read from a GGUF header: the shape ``specgen.models.compat`` checks."""

    def __init__(self, header: Header, name: str) -> None:
        self.header, self.name = header, name
        tokens = header.get("tokenizer.ggml.tokens")
        if not isinstance(tokens, list):
            raise GGUFError(f"{name} has no vocabulary in its header")
        self._tokens = tokens
        self.n_vocab = len(tokens)
        model = header.get("tokenizer.ggml.model", "llama")
        self._type, self._adds_bos, self._adds_eos = VOCAB_MODELS.get(model, (-1, False, False))

    @property
    def vocab_type(self) -> int:
        return self._type

    @property
    def bos(self) -> int:
        return int(self.header.get("tokenizer.ggml.bos_token_id", -1))

    @property
    def eos(self) -> int:
        return int(self.header.get("tokenizer.ggml.eos_token_id", -1))

    @property
    def adds_bos(self) -> bool:
        return bool(self.header.get("tokenizer.ggml.add_bos_token", self._adds_bos))

    @property
    def adds_eos(self) -> bool:
        return bool(self.header.get("tokenizer.ggml.add_eos_token", self._adds_eos))

    def token_text(self, token: int) -> bytes:
        return self._tokens[token].encode("utf-8") if 0 <= token < self.n_vocab else b""


# A flag llama.cpp sets in general.file_type when it guessed the type from the tensors.
FILE_TYPE_GUESSED = 1024


def file_type_code(header: Header) -> int | None:
    value = header.get("general.file_type")
    return int(value) & ~FILE_TYPE_GUESSED if isinstance(value, int) else None


def facts(header: Header, name: str, size: int | None) -> dict[str, object]:
    """What `specgen models info` shows, from the header alone (no llama.cpp)."""
    from specgen.models.compat import VOCAB_TYPES

    arch = header.get("general.architecture") or "unknown"
    ctx = header.get(f"{arch}.context_length")
    vocab = None
    try:
        vocab = HeaderVocabulary(header, name)
    except GGUFError:
        pass

    def token(which: str) -> dict[str, object] | None:
        if vocab is None:
            return None
        tid = getattr(vocab, which)
        return {
            "id": tid,
            "text": vocab.token_text(tid).decode("utf-8", "replace"),
            "added": getattr(vocab, f"adds_{which}"),
        }

    code = file_type_code(header)
    return {
        "file": name,
        "size_bytes": size,
        "name": header.get("general.name"),
        "architecture": arch,
        "size_label": header.get("general.size_label"),
        "quantization": FILE_TYPES.get(code, str(code)) if code is not None else None,
        "context_length": int(ctx) if isinstance(ctx, int) else None,
        "vocab_type": VOCAB_TYPES.get(vocab.vocab_type, "?") if vocab else None,
        "vocab_size": vocab.n_vocab if vocab else None,
        "bos": token("bos"),
        "eos": token("eos"),
        "chat_template": isinstance(header.get("tokenizer.chat_template"), str),
    }


# llama.cpp's llama_ftype names (general.file_type), for reading headers without llama.cpp.
FILE_TYPES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    19: "IQ2_XXS",
    20: "IQ2_XS",
    21: "Q2_K_S",
    22: "IQ3_XS",
    23: "IQ3_XXS",
    24: "IQ1_S",
    25: "IQ4_NL",
    26: "IQ3_S",
    27: "IQ3_M",
    28: "IQ2_S",
    29: "IQ2_M",
    30: "IQ4_XS",
    31: "IQ1_M",
    32: "BF16",
    36: "TQ1_0",
    37: "TQ2_0",
    38: "MXFP4_MOE",
}


def read_local(path: str, tensors: bool = False) -> Header:
    """The header of a local GGUF file (with ``tensors``, their names too)."""
    with open(path, "rb") as fh:
        return read_header(fh.read, tensors)
