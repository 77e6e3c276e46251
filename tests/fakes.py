"""A scripted stand-in for a llama.cpp model: logits are a pure function of the cached prefix.

Because the logits hash the *whole* cache, a rollback that leaves a stale token behind changes
every later distribution, so the engine tests catch cache bugs without loading any weights.
Time is a ``FakeClock`` that the fake models advance as a real decode would take time, so what
``-k auto`` measures is exact and the same on every machine, and no test sleeps.

A fake also has what a loaded model shows of its vocabulary (tokenize, pieces, a chat template),
so the command line, batches, bench and the server run on it in-process: ``write_fake`` writes a
model file that ``load_fake`` (swapped in for llama.cpp by ``fake_backend``) loads as a fake.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from specgen.core.sampling import TopK
from specgen.engine import CycleDone, Finished

if TYPE_CHECKING:
    from specgen.engine import GenerationConfig, SpeculativeEngine
    from specgen.stats import Stats

PIECES = [bytes([ord("a") + i]) for i in range(12)] + [b" ", b"\n", b"\xc3", b"\xa9"]
# A chat template in the Hugging Face style, as a GGUF carries one.
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


class FakeClock:
    """Seconds that pass only when a fake model decodes (or a test says so)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeModel:
    def __init__(
        self,
        n_vocab: int = 16,
        n_ctx: int = 512,
        salt: int = 0,
        noise: float = 0.0,
        sharpness: float = 2.0,
        eog: int | None = None,
        call_seconds: float = 0.0,
        token_seconds: float = 0.0,
        clock: FakeClock | None = None,
        path: Path = Path("fake.gguf"),
        n_threads: int = 1,
        chat_template: str | None = CHAT_TEMPLATE,
        repeat: int = 0,
        backend_sampling: bool = True,
        rows_on_device: bool = True,
    ) -> None:
        self.n_vocab, self.n_ctx = n_vocab, n_ctx
        # As a llama.cpp build with backend sampling: rows come back as their top-k when asked.
        self.backend_sampling, self.rows_on_device = backend_sampling, rows_on_device
        self.top_k = 0
        # A real decode costs a fixed amount per call plus a little per token (a batch is cheap
        # per token): each decode advances ``clock`` so, which makes what the adaptive lookahead
        # measures meaningful.
        self.call_seconds, self.token_seconds = call_seconds, token_seconds
        self.clock = clock if clock is not None else FakeClock()
        self.salt, self.noise, self.sharpness, self.eog = salt, noise, sharpness, eog
        self.path, self.n_threads, self.description = path, n_threads, "fake model"
        self.template = chat_template
        self.repeat = repeat  # > 0: the text mostly counts 0, 1, ... repeat-1 round and round
        self.cache: list[int] = []
        self.decode_calls: list[tuple[int, int]] = []
        self._rows: dict[tuple[int, ...], np.ndarray] = {}  # logits_after, as computed

    @property
    def n_past(self) -> int:
        return len(self.cache)

    def logits_after(self, prefix: list[int]) -> np.ndarray:
        """The logits this model gives for the token that follows ``prefix``."""
        base = self._gauss(prefix, 0)
        if self.noise:
            base = base + self.noise * self._gauss(prefix, self.salt)
        logits = (base * self.sharpness).astype(np.float32)
        if self.repeat and prefix:
            logits[(prefix[-1] + 1) % self.repeat] += 6.0
        return logits

    def _gauss(self, prefix: list[int], salt: int) -> np.ndarray:
        seed = zlib.crc32(np.asarray(prefix, dtype=np.int32).tobytes()) ^ (salt * 2654435761)
        return np.random.default_rng(seed & 0xFFFFFFFF).standard_normal(self.n_vocab)

    def sample_top_k(self, k: int) -> int:
        self.top_k = k if self.backend_sampling else 0
        return self.top_k

    def decode(self, tokens: list[int], n_logits: int = 1) -> np.ndarray | list[TopK]:
        assert 0 <= n_logits <= len(tokens), "logits can only be asked for decoded rows"
        assert self.n_past + len(tokens) <= self.n_ctx, "decode past the context"
        self.decode_calls.append((len(tokens), n_logits))
        self.clock.advance(self.call_seconds + self.token_seconds * len(tokens))
        self.cache.extend(tokens)
        if n_logits == 0:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        # Only the rows asked for are computed, as llama.cpp computes only the flagged ones.
        end = len(self.cache)
        rows = [self._row(self.cache[: end - n_logits + 1 + i]) for i in range(n_logits)]
        if self.top_k:
            return [TopK.of(row, self.top_k) for row in rows]
        return np.array(rows)

    def _row(self, prefix: list[int]) -> np.ndarray:
        """``logits_after(prefix)``, computed once per prefix (a pure function of it)."""
        key = tuple(prefix)
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = self.logits_after(prefix)
        return row

    # An attention model's cache: cut anywhere, no checkpoint ever needed.
    rollback_anywhere = True
    recurrent = False

    @property
    def rollback_window(self) -> int:
        return self.n_ctx

    def keep_rollback_point(self, undo: int, one_decode: bool = True) -> None:
        """Nothing to keep: the cache is a list."""

    def constrain(self, grammar):
        """A fake's 16 pieces cannot spell JSON: structured output is tested on real models;
        here it is a user's error, as a model without the tokens would be."""
        from specgen.errors import UserError

        raise UserError("fake models have no grammar engine")

    def rollback(self, n_past: int) -> None:
        del self.cache[n_past:]

    def reset(self) -> None:
        self.cache.clear()

    def piece(self, token: int) -> bytes:
        return PIECES[token % len(PIECES)]

    def is_eog(self, token: int) -> bool:
        return token == self.eog

    # -- what a loaded model shows of its vocabulary (``backend.Vocabulary``) ------------------
    vocab_type = 2  # BPE
    bos = eos = -1  # none added: a prompt is its text alone
    adds_bos = adds_eos = False

    def token_text(self, token: int) -> bytes:
        return PIECES[token] if 0 <= token < len(PIECES) else b""

    def tokenize(
        self, text: str, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        """A token per byte: the byte's own piece where there is one, else one of the letters."""
        return [
            PIECES.index(bytes([b])) if bytes([b]) in PIECES else b % 12
            for b in text.encode("utf-8")
        ]

    def chat_template(self) -> str | None:
        return self.template


def run_to_end(
    engine: SpeculativeEngine, config: GenerationConfig, prompt: Sequence[int]
) -> tuple[list[int], Stats]:
    """Drive the engine to the end of a generation: the tokens it generated, and its stats."""
    tokens: list[int] = []
    for event in engine.generate(prompt, config):
        if isinstance(event, CycleDone):
            tokens.extend(event.tokens)
    assert isinstance(event, Finished), "a generation always ends with Finished"
    return tokens[: event.stats.n_generated], event.stats


def write_fake(path: Path, **params: object) -> Path:
    """A model file that ``load_fake`` loads as a ``FakeModel`` with these parameters."""
    path.write_text(json.dumps({"fake_model": params}))
    return path


def load_fake(path: Path, n_ctx: int, n_threads: int, clock: FakeClock) -> FakeModel:
    """The fake a ``write_fake`` file describes, with the context and threads asked for."""
    params = json.loads(path.read_text())["fake_model"]
    return FakeModel(
        **{**params, "n_ctx": n_ctx or params.get("n_ctx", 512)},
        path=path,
        n_threads=n_threads or 1,
        clock=clock,
    )
