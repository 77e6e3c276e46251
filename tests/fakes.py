"""A scripted stand-in for a llama.cpp model: logits are a pure function of the cached prefix.

Because the logits hash the *whole* cache, a rollback that leaves a stale token behind changes
every later distribution, so the engine tests catch cache bugs without loading any weights.
Time is a ``FakeClock`` that the fake models advance as a real decode would take time, so what
``-k auto`` measures is exact and the same on every machine, and no test sleeps.
"""

from __future__ import annotations

import zlib

import numpy as np

PIECES = [bytes([ord("a") + i]) for i in range(12)] + [b" ", b"\n", b"\xc3", b"\xa9"]


class FakeClock:
    """Seconds that pass only when a fake model decodes (or a test says so)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeModel:
    def __init__(self, n_vocab: int = 16, n_ctx: int = 512, salt: int = 0, noise: float = 0.0,
                 sharpness: float = 2.0, eog: int | None = None, call_seconds: float = 0.0,
                 token_seconds: float = 0.0, clock: FakeClock | None = None) -> None:
        self.n_vocab, self.n_ctx = n_vocab, n_ctx
        # A real decode costs a fixed amount per call plus a little per token (a batch is cheap
        # per token): each decode advances ``clock`` so, which makes what the adaptive lookahead
        # measures meaningful.
        self.call_seconds, self.token_seconds = call_seconds, token_seconds
        self.clock = clock if clock is not None else FakeClock()
        self.salt, self.noise, self.sharpness, self.eog = salt, noise, sharpness, eog
        self.cache: list[int] = []
        self.decode_calls: list[tuple[int, int]] = []

    @property
    def n_past(self) -> int:
        return len(self.cache)

    def logits_after(self, prefix: list[int]) -> np.ndarray:
        """The logits this model gives for the token that follows ``prefix``."""
        base = self._gauss(prefix, 0)
        if self.noise:
            base = base + self.noise * self._gauss(prefix, self.salt)
        return (base * self.sharpness).astype(np.float32)

    def _gauss(self, prefix: list[int], salt: int) -> np.ndarray:
        seed = zlib.crc32(np.asarray(prefix, dtype=np.int32).tobytes()) ^ (salt * 2654435761)
        return np.random.default_rng(seed & 0xFFFFFFFF).standard_normal(self.n_vocab)

    def decode(self, tokens: list[int], n_logits: int = 1) -> np.ndarray:
        assert self.n_past + len(tokens) <= self.n_ctx, "decode past the context"
        self.decode_calls.append((len(tokens), n_logits))
        self.clock.advance(self.call_seconds + self.token_seconds * len(tokens))
        rows = []
        for token in tokens:
            self.cache.append(token)
            rows.append(self.logits_after(self.cache))
        if n_logits == 0:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        return np.array(rows[-n_logits:])

    def rollback(self, n_past: int) -> None:
        del self.cache[n_past:]

    def reset(self) -> None:
        self.cache.clear()

    def piece(self, token: int) -> bytes:
        return PIECES[token % len(PIECES)]

    def is_eog(self, token: int) -> bool:
        return token == self.eog
