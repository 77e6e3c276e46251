"""A head that reads the target's hidden states as the drafter: the target's own MTP head, an
EAGLE3 head or a DFlash block drafter.

The head (``backend.mtp.MtpHead``, ``backend.heads``) follows the target's cache by itself: it
reads every token the target decodes and is cut back with it, so this drafter only draws
guesses. Each comes from the head's logits (the whole row, or its top-k from the backend on a
GPU), warped as the target's are: that is its q, so the accept rule is the exact min(1, p/q)
one (llama.cpp drafts these heads greedily and keeps a guess only where it matches the target's
own draw; this keeps more guesses when sampling, and the same ones when greedy).

A step head (MTP, EAGLE3) gives the row of each guess from the guess before it; a block head
(DFlash) gives every guess's row from one pass over the last token and masks, each row the
head's distribution for its position given the context alone: a guess drawn from its row and
judged by it is exact all the same.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol, TypeGuard, cast

from specgen.core.constraint import Constraint
from specgen.core.coupling import Draws
from specgen.core.penalties import Penalties
from specgen.core.sampling import Row, SamplingParams
from specgen.drafters.base import Candidate, FollowUp, Proposal
from specgen.drafters.model import draft_top_k, draw_guesses
from specgen.stats import Clock
from specgen.structured.grammar import LogitBias


class Head(Protocol):
    """What the drafter needs of a step head (``backend.mtp.MtpHead``, ``backend.heads.
    Eagle3Head`` have it)."""

    kind: str  # what the stats count its guesses as: "mtp", "eagle3"
    rows_on_device: bool  # the target's: the head runs where the target's output layer does

    def catch_up(self) -> int:
        """Read what the target decoded since the head last drafted; how many tokens."""

    def sample_top_k(self, k: int) -> int:
        """Rows from now on: their ``k`` likeliest tokens (``TopK``), or whole (0)."""

    def start(self, token: int) -> Row:
        """Logits of the guess after ``token``, the context's last (not yet in the cache)."""

    def step(self, token: int) -> Row:
        """Logits of the guess after ``token``, the last guess."""

    def end(self) -> None:
        """Drafting is over for this cycle."""


class BlockHead(Protocol):
    """What the drafter needs of a block head (``backend.heads.DFlashHead`` has it)."""

    kind: str  # "dflash"
    rows_on_device: bool

    @property
    def max_block(self) -> int:
        """The most guesses one pass gives."""

    def catch_up(self) -> int:
        """Read what the target decoded since the head last drafted; how many tokens."""

    def sample_top_k(self, k: int) -> int:
        """Rows from now on: their ``k`` likeliest tokens (``TopK``), or whole (0)."""

    def block(self, token: int, k: int) -> list[Row]:
        """The rows of the ``k`` guesses after ``token``, the context's last, from one pass."""

    def end(self) -> None:
        """Drafting is over for this cycle."""


def _blocks(head: Head | BlockHead) -> TypeGuard[BlockHead]:
    """Whether the head drafts a block in one pass."""
    return hasattr(head, "block")


class HeadDrafter:
    """Guesses from a head that reads the target's hidden states."""

    def __init__(
        self,
        head: Head | BlockHead,
        is_eog: Callable[[int], bool],
        room: Callable[[], int],
        p_min: float = 0.0,
        clock: Clock = time.perf_counter,
    ) -> None:
        if not 0.0 <= p_min < 1.0:
            raise ValueError("draft_p_min must be in [0, 1)")
        self.head, self.is_eog, self.room, self.p_min, self.clock = head, is_eog, room, p_min, clock
        self._fresh = True
        self._constraint: Constraint | None = None
        self._bias: LogitBias | None = None
        self._penalties: Penalties | None = None

    def constrain(
        self,
        constraint: Constraint | None,
        bias: LogitBias | None = None,
        penalties: Penalties | None = None,
    ) -> None:
        self._constraint, self._bias, self._penalties = constraint, bias, penalties

    def begin(self, prompt: Sequence[int], reuse_prefix: bool = False) -> None:
        """The head reads the prompt (its end) when first asked for guesses."""
        self._fresh = True

    def candidates(self, context: Sequence[int]) -> list[Candidate]:
        room = self.room()
        kind = self.head.kind
        if _blocks(self.head):
            room = min(room, self.head.max_block)
        return [Candidate(kind, kind, room)] if room > 0 else []

    def propose(
        self,
        context: Sequence[int],
        candidate: Candidate,
        k: int,
        sampling: SamplingParams,
        rng: Draws,
        follow: FollowUp | None = None,
    ) -> Proposal:
        out, head = Proposal(), self.head
        head.sample_top_k(
            draft_top_k(
                sampling,
                self.p_min,
                self._constraint,
                self._bias or self._penalties,
                head.rows_on_device,
            )
        )
        # What the head reads first is the prompt's end (prompt time, as a draft model's
        # prompt pass is) or what the target decoded alone (a cost of having been off).
        started = self.clock()
        if head.catch_up():
            seconds = self.clock() - started
            if self._fresh:
                out.prompt_seconds = seconds
            else:
                out.catch_up_seconds = seconds
        self._fresh = False
        try:
            if _blocks(head):
                rows = iter(head.block(context[-1], k))

                def logits_after(guess: int | None) -> Row:
                    return next(rows)
            else:
                step_head = cast(Head, head)  # not a block head: a step head

                def logits_after(guess: int | None) -> Row:
                    if guess is None:
                        return step_head.start(context[-1])
                    return step_head.step(guess)

            draw_guesses(
                out, logits_after, k, sampling, rng, self.p_min, self.is_eog, context, follow,
                self._constraint, self._bias, self._penalties,
            )  # fmt: skip
        finally:
            head.end()
        return out

    def rollback_to(self, n_accepted: int) -> None:
        """The head is cut back with the target's cache: nothing to do."""

    def end(self, tokens: Sequence[int]) -> None:
        """Nothing is kept from one generation to the next."""
