"""When ``-k auto`` tries again a source it left alone: the exploration state of a generation.

When nothing beats the target alone, the policy runs it alone and now and then spends a cycle
on a few guesses of a source it left alone (exploring), more rarely while those cycles fail: the
wait doubles from EXPLORE_GAP_FIRST up to EXPLORE_GAP_MAX cycles. A source whose costs alone
rule it out (even if every guess survived it could not beat the target alone) is not explored
until its costs change. Where that verdict rests on a cost only remembered from an earlier
process, every RECHECK_AFTER-th generation times the source with one guess: a cost measured in a
busy moment must not turn speculation off for good, and a source that truly cannot pay costs
one guess now and then. Free candidates (n-gram matches) are never explored: every cycle they
are offered in scores them in hindsight.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from specgen.drafters.base import Candidate
from specgen.lookahead.costs import PairProfile, SpeedCheck

# A source is first timed with one guess (a draft slower than the target costs little to find
# out); in a batch with two, so that one sequence's cycle times the draft's steps for all
# (``BatchLoad.draft_timed``: two steps, the first runs cold). Exploring a source left alone
# takes a few.
TIMING_LOOKAHEAD, BATCH_TIMING_LOOKAHEAD = 1, 2
EXPLORE_LOOKAHEAD = 3
# Cycles to wait before a source left alone is explored again, doubling while it fails.
EXPLORE_GAP_FIRST, EXPLORE_GAP_MAX = 8, 128
# Generations in a row that may leave a source off on a remembered cost alone before one times
# it here.
RECHECK_AFTER = 8

# What to do with a candidate that was due for a look: time it with one guess, explore it with a
# few, or nothing this cycle.
Step = Literal["time", "explore"] | None


@dataclass
class Exploration:
    """One generation's exploration state, by acceptance key (a source for model runs)."""

    cycle: int = 0
    # The last cycle each key drafted or was looked at, and the cycles to wait after that.
    last_tried: dict[str, int] = field(default_factory=dict)
    gap: dict[str, int] = field(default_factory=dict)
    ruled_out: set[str] = field(default_factory=set)  # keys whose costs alone rule them out
    left_off: set[str] = field(default_factory=set)  # sources left off untimed, once each
    explored: set[str] = field(default_factory=set)  # keys explored in this generation

    def tried(self, key: str) -> None:
        """The key drafted this cycle (or was looked at): its wait starts again."""
        self.last_tried[key] = self.cycle

    def due(self, candidate: Candidate, chosen: str | None) -> bool:
        """Whether a candidate not chosen this cycle has waited long enough for a look."""
        key = candidate.acceptance_key
        idle = self.cycle - self.last_tried.get(key, -EXPLORE_GAP_MAX)
        return not (
            key == chosen or candidate.preview or idle < self.gap.get(key, EXPLORE_GAP_FIRST)
        )

    def judge(
        self,
        candidate: Candidate,
        hope: float,
        alone_rate: float,
        best_rate: float,
        speed: SpeedCheck,
        profile: PairProfile,
    ) -> Step:
        """What to do with a candidate due for a look, whose best rate if every guess survived
        is ``hope`` (tokens per second) against the target alone's and this cycle's best.

        A cost only remembered rules a source out once the target is seen to run as fast as it
        did then (otherwise the remembered costs were dropped), and for RECHECK_AFTER
        generations in a row at most."""
        key, source = candidate.acceptance_key, candidate.source
        self.tried(key)  # looked at: look again after the gap
        self.ruled_out.discard(key)
        if hope <= alone_rate:
            if not profile.guess_measured_here(source):
                if speed == "unknown":  # wait until the target's own speed is known
                    self.last_tried[key] = self.cycle - EXPLORE_GAP_MAX  # look next cycle
                    return None
                if source not in self.left_off:  # once a generation
                    left_off = profile.left_off_untimed.get(source, 0)
                    if left_off >= RECHECK_AFTER:
                        return "time"
                    self.left_off.add(source)
                    profile.left_off_untimed[source] = left_off + 1
            self.ruled_out.add(key)
        if hope > best_rate:
            self.gap[key] = min(2 * self.gap.get(key, EXPLORE_GAP_FIRST), EXPLORE_GAP_MAX)
            return "explore"
        return None

    def settled(self, candidate: Candidate | None) -> None:
        """The cycle drafts from ``candidate`` (None: the target alone): it is waited for from
        the first gap again."""
        if candidate is not None:
            self.gap[candidate.acceptance_key] = EXPLORE_GAP_FIRST
