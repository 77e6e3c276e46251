"""How many guesses to ask for, and from which source, before each cycle: fixed K or ``auto``.

A drafter offers candidate sources of guesses each cycle (a draft model; an n-gram match of some
length); a policy picks one and a lookahead K for it, or K = 0 (the target alone). The policy
sees only what past cycles measured, never the cycle it decides, so the output stays exact: the
choice is a function of the text so far, like the guesses themselves.

- ``FixedLookahead`` (``-k N``): the first candidate, N guesses.
- ``AdaptiveLookahead`` (``-k auto``, ``specgen.lookahead.adaptive``): the source and K with the
  most expected tokens per second, from acceptance by position (``acceptance``) and the costs
  (``costs``), exploring now and then a source it left alone (``explore``).

This module is also the one home of the K a user may ask for (``check_lookahead``) and of the
rule that a generation with no drafter runs the target alone (``effective_lookahead``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from specgen.drafters.base import TARGET_ALONE, Candidate, NgramTail, Plan
from specgen.lookahead.adaptive import AUTO_MAX_LOOKAHEAD, AdaptiveLookahead
from specgen.lookahead.costs import CostBook, PairProfile

# A lookahead as asked for: a fixed K, or "auto" (chosen before each cycle from past cycles).
Lookahead = int | Literal["auto"]
# The largest K anyone may ask for (the CLI, models.toml, the API and bench share it).
MAX_LOOKAHEAD = 64
# K when nothing else says (a named pair's own, and what bench found, come first): auto, which
# matched or beat the best fixed K on the demo pairs and never runs much slower than the target
# alone.
DEFAULT_LOOKAHEAD: Lookahead = "auto"
LOOKAHEAD_RANGE = f"'auto' or a K from 0 to {MAX_LOOKAHEAD}"
# A recurrent or hybrid target keeps llama.cpp's per-token snapshots of its state for this many
# tokens (n_rs_seq), so a rollback of up to that many guesses costs no checkpoint; each costs one
# more copy of the state in memory. Auto is capped to it; a fixed K gets that many, up to
# MAX_SNAPSHOTS (beyond, a checkpoint every cycle). An MTP head's acceptance falls fast along
# the cycle (K 1-3 is typical), so auto with a head keeps fewer.
AUTO_SNAPSHOTS, AUTO_SNAPSHOTS_MTP, MAX_SNAPSHOTS = 8, 4, 16

__all__ = [
    "AUTO_MAX_LOOKAHEAD",
    "AUTO_SNAPSHOTS",
    "MAX_SNAPSHOTS",
    "DEFAULT_LOOKAHEAD",
    "LOOKAHEAD_RANGE",
    "MAX_LOOKAHEAD",
    "AdaptiveLookahead",
    "CostBook",
    "FixedLookahead",
    "Lookahead",
    "LookaheadPolicy",
    "PairProfile",
    "check_lookahead",
    "effective_lookahead",
    "is_lookahead",
    "parse_lookahead",
    "policy_for",
    "snapshots_for",
]


def check_lookahead(value: object, what: str = "lookahead (K)") -> Lookahead:
    """``value`` as a lookahead: "auto" or a whole number from 0 to MAX_LOOKAHEAD; ValueError
    (naming ``what``) otherwise."""
    if value == "auto":
        return "auto"
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_LOOKAHEAD:
        return value
    raise ValueError(f"{what} must be {LOOKAHEAD_RANGE}")


def is_lookahead(value: object) -> bool:
    """Whether ``value`` is a lookahead one may ask for (``check_lookahead``)."""
    try:
        check_lookahead(value)
    except ValueError:
        return False
    return True


def parse_lookahead(text: str) -> Lookahead:
    """``"auto"`` or a whole number from 0 to MAX_LOOKAHEAD, as typed; ValueError otherwise."""
    if text.strip().lower() == "auto":
        return "auto"
    return check_lookahead(int(text))


def effective_lookahead(lookahead: Lookahead, drafts: bool) -> Lookahead:
    """The lookahead a generation runs at: what was asked for, or 0 (the target alone) where
    nothing drafts."""
    return lookahead if drafts else 0


def snapshots_for(lookahead: Lookahead, mtp: bool = False) -> int:
    """How many snapshots a recurrent target keeps for this lookahead (``AUTO_SNAPSHOTS``)."""
    if lookahead == "auto":
        return AUTO_SNAPSHOTS_MTP if mtp else AUTO_SNAPSHOTS
    return min(lookahead, MAX_SNAPSHOTS)


class FixedLookahead:
    """``-k N``: the drafter's first candidate, N guesses (fewer where it has fewer)."""

    def __init__(self, lookahead: int) -> None:
        if isinstance(check_lookahead(lookahead), str):
            raise ValueError("a fixed lookahead is a K, not 'auto'")
        self.lookahead = lookahead

    def begin(self) -> None:
        """A new generation: nothing to forget."""

    def plan(self, candidates: Sequence[Candidate], budget: int) -> Plan:
        if not candidates or self.lookahead == 0 or budget <= 0:
            return TARGET_ALONE
        candidate = candidates[0]
        return Plan(candidate, min(self.lookahead, candidate.limit, budget))

    def observe(
        self,
        plan: Plan,
        drafted: int,
        accepted: int,
        draft_seconds: float,
        verify_seconds: float,
        candidates: Sequence[Candidate] = (),
        produced: Sequence[int] = (),
        ngram_tail: NgramTail | None = None,
    ) -> None:
        """Fixed K learns nothing."""


LookaheadPolicy = FixedLookahead | AdaptiveLookahead


def policy_for(
    lookahead: Lookahead, drafts: bool, profile: PairProfile, rollback_window: int = MAX_LOOKAHEAD
) -> LookaheadPolicy:
    """The policy a generation runs: auto over ``profile``, a fixed K, or the target alone.

    Auto asks for no more guesses than the target can roll back without a checkpoint
    (``rollback_window``: a recurrent target's snapshots), and at least one."""
    lookahead = effective_lookahead(lookahead, drafts)
    if lookahead == "auto":
        return AdaptiveLookahead(profile, max(1, min(AUTO_MAX_LOOKAHEAD, rollback_window)))
    return FixedLookahead(lookahead)
