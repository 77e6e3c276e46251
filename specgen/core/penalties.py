"""Repetition, frequency and presence penalties, as llama.cpp applies them.

Each token that occurs ``count`` times in the last ``last_n`` tokens of the context (the prompt
and the text so far, -1: all of it) has its logit divided by ``repeat`` where positive and
multiplied by it where not, then lowered by ``count * frequency + presence``; the rest are left
alone. The penalties depend on the text before a row, so each row is penalized by its own
history: a guess's row by the context and the guesses before it, for the target's p and the
draft's q alike, and the output follows the penalized target exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

# llama.cpp's window: the last 64 tokens.
DEFAULT_LAST_N = 64
_LARGEST = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class Penalties:
    """llama.cpp's ``--repeat-penalty``, ``--frequency-penalty``, ``--presence-penalty`` and
    ``--repeat-last-n``; the defaults change nothing."""

    repeat: float = 1.0
    frequency: float = 0.0
    presence: float = 0.0
    last_n: int = DEFAULT_LAST_N

    def __post_init__(self) -> None:
        if not (math.isfinite(self.repeat) and self.repeat > 0.0):
            raise ValueError("repeat_penalty must be a number above 0 (1 is none)")
        if not -2.0 <= self.frequency <= 2.0:
            raise ValueError("frequency_penalty must be from -2 to 2")
        if not -2.0 <= self.presence <= 2.0:
            raise ValueError("presence_penalty must be from -2 to 2")
        if self.last_n < -1:
            raise ValueError("repeat_last_n must be -1 (the whole context), 0 (none) or more")

    @property
    def active(self) -> bool:
        """Whether these penalties change any row."""
        if self.last_n == 0:
            return False
        return self.repeat != 1.0 or self.frequency != 0.0 or self.presence != 0.0

    def window(self, history: Sequence[int], more: Sequence[int] = ()) -> list[int]:
        """The tokens counted for the row after ``history`` followed by ``more``."""
        if self.last_n < 0:
            return [*history, *more]
        if len(more) >= self.last_n:
            return list(more[len(more) - self.last_n :])
        return [*history[max(0, len(history) - (self.last_n - len(more))) :], *more]

    def apply(
        self, logits: np.ndarray, history: Sequence[int], more: Sequence[int] = ()
    ) -> np.ndarray:
        """``logits`` (the row after ``history`` and ``more``) penalized (a new array; ids past
        the row, a draft's shorter vocabulary, are left out)."""
        out = np.array(logits, dtype=np.float32, copy=True)
        seen = np.asarray(self.window(history, more), dtype=np.int64)
        if not self.active or seen.size == 0:
            return out
        ids, counts = np.unique(seen[(seen >= 0) & (seen < out.shape[0])], return_counts=True)
        row = out[ids].astype(np.float64)
        with np.errstate(all="ignore"):
            scaled = np.where(row <= 0, row * self.repeat, row / self.repeat)
        scaled = scaled - counts * self.frequency - self.presence
        # A penalty near 0 (or a huge one) sends a logit past float32: it stays the largest
        # finite one, so every row stays a distribution; a token ruled out (-inf) stays out.
        scaled = np.clip(scaled, -_LARGEST, _LARGEST)
        out[ids] = np.where(np.isneginf(row), row, scaled)
        return out


def penalties_of(penalties: Penalties | None) -> Penalties | None:
    """The penalties that change something (None: none do)."""
    return penalties if penalties is not None and penalties.active else None


# A request's names for the fields (llama-server's and OpenAI's JSON, the API's keywords).
REQUEST_FIELDS = {
    "repeat_penalty": "repeat",
    "frequency_penalty": "frequency",
    "presence_penalty": "presence",
    "repeat_last_n": "last_n",
}


def penalties_from(given: Mapping[str, Any], base: Penalties | None = None) -> Penalties | None:
    """The penalties a request asks for (``REQUEST_FIELDS`` of ``given``) over ``base``'s; the
    base where it names none. ValueError, naming the field, on a value out of range."""
    asked: dict[str, Any] = {}
    for name, field in REQUEST_FIELDS.items():
        value = given.get(name)
        if value is None:
            continue
        whole = field == "last_n"
        if isinstance(value, bool) or not isinstance(value, int if whole else int | float):
            raise ValueError(f"'{name}' must be {'a whole number' if whole else 'a number'}")
        asked[field] = value if whole else float(value)
    if not asked:
        return base
    return replace(base or Penalties(), **asked)
