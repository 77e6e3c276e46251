"""How many guesses to ask for, and from which source, before each cycle: fixed K or ``auto``.

A drafter offers candidate sources of guesses each cycle (a draft model; an n-gram match of some
length); a policy picks one and a lookahead K for it, or K = 0 (the target alone). The policy
sees only what past cycles measured, never the cycle it decides, so the output stays exact: the
choice is a function of the text so far, like the guesses themselves.

- ``FixedLookahead`` (``-k N``): the first candidate, N guesses.
- ``AdaptiveLookahead`` (``-k auto``, ``specgen.lookahead.adaptive``): the source and K with the
  most expected tokens per second, from acceptance by position (``acceptance``) and the costs
  (``costs``), exploring now and then a source it left alone (``explore``).

The K a user may ask for (``check_lookahead``) and the rule that a generation with no drafter
runs the target alone (``effective_lookahead``) live in ``specgen.core.lookahead``; they are
re-exported here.
"""

from __future__ import annotations

from collections.abc import Sequence

from specgen.core.lookahead import (
    DEFAULT_LOOKAHEAD,
    LOOKAHEAD_RANGE,
    MAX_LOOKAHEAD,
    Lookahead,
    check_lookahead,
    effective_lookahead,
    is_lookahead,
    parse_lookahead,
)
from specgen.drafters.base import TARGET_ALONE, Candidate, NgramTail, Plan
from specgen.lookahead.adaptive import AUTO_MAX_LOOKAHEAD, AdaptiveLookahead
from specgen.lookahead.batch import BatchLoad
from specgen.lookahead.costs import CostBook, PairProfile

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
    "BatchLoad",
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
    lookahead: Lookahead,
    drafts: bool,
    profile: PairProfile,
    rollback_window: int = MAX_LOOKAHEAD,
    load: BatchLoad | None = None,
    slot: int = 0,
) -> LookaheadPolicy:
    """The policy a generation runs: auto over ``profile``, a fixed K, or the target alone.

    Auto asks for no more guesses than the target can roll back without a checkpoint
    (``rollback_window``: a recurrent target's snapshots), and at least one; in a batch
    (``load``), it prices K by the whole batch."""
    lookahead = effective_lookahead(lookahead, drafts)
    if lookahead == "auto":
        window = max(1, min(AUTO_MAX_LOOKAHEAD, rollback_window))
        return AdaptiveLookahead(profile, window, load, slot)
    return FixedLookahead(lookahead)
