"""What a grammar constraint offers the loop, and how a mask meets the logits.

A ``Constraint`` is one generation's grammar state (``specgen.structured.grammar.Matcher`` over
llguidance is one): which tokens may come next, how much of a draft it allows, which tokens it
forces. The mask is applied to the logits before top-k, top-p, min-p and temperature (llama.cpp's
and llama-cpp-python's order), to the target's rows and the draft's alike, so the output follows
the target's distribution restricted by the grammar, exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from specgen.core.penalties import Penalties
from specgen.core.sampling import Row


class Constraint(Protocol):
    def allowed(self) -> np.ndarray:
        """A bool per token of the vocabulary: may it come next?"""

    def consume(self, token: int) -> None:
        """The token came next (it was allowed)."""

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of ``tokens``, in order, would be allowed from here (state unchanged)."""

    def forced(self) -> list[int]:
        """The tokens the grammar forces from here (empty when there is a choice)."""

    def rollback(self, n: int) -> None:
        """Forget the last ``n`` tokens consumed."""


class Bias(Protocol):
    """Numbers added to some logits (``specgen.structured.grammar.LogitBias``)."""

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """``logits`` with the biases added (a new array)."""


def shaped(
    logits: Row,
    bias: Bias | None,
    constraint: Constraint | None,
    penalties: Penalties | None = None,
    history: Sequence[int] = (),
    more: Sequence[int] = (),
) -> Row:
    """A row of logits as the warp reads it, for the target and the draft alike: the logit
    bias first, then the penalties of the text before the row (``history`` then ``more``), then
    the grammar's mask in its current state, llama.cpp's order (the row itself where none: a
    bias, penalties or a mask need the whole row, ``core.sampling.row_top_k``)."""
    if bias is None and constraint is None and penalties is None:
        return logits
    assert isinstance(logits, np.ndarray), "a bias, penalties and a mask apply to whole rows"
    if bias is not None:
        logits = bias.apply(logits)
    if penalties is not None:
        logits = penalties.apply(logits, history, more)
    if constraint is not None:
        logits = masked(logits, constraint.allowed())
    return logits


def masked(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """``logits`` with every token not ``allowed`` at -inf (a new array). A draft's vocabulary
    may be up to 128 tokens longer or shorter than the target's: ids the target has not are
    not allowed."""
    n = logits.shape[0]
    if allowed.shape[0] != n:
        fit = np.zeros(n, dtype=bool)
        common = min(n, allowed.shape[0])
        fit[:common] = allowed[:common]
        allowed = fit
    return np.where(allowed, logits, np.float32(-np.inf))
