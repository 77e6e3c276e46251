"""Acceptance by position: how often guess 1, 2, ... of a cycle survives, learned as cycles go.

a_i is the chance that guess i survives once guesses 1..i-1 did; it falls along the cycle, so
one alpha misfits. Older cycles are forgotten geometrically, so the estimate follows the text.
Kept across generations (with a slower memory), the same counts are what is typical of the pair:
the shape along the cycle that a new generation starts from and moves by one shift.
"""

from __future__ import annotations

import math

from specgen.core.speculative import judged_guesses

# Forgetting per cycle: an observation ten cycles old weighs a third of a new one.
ACCEPT_MEMORY = 0.9
# The typical acceptance by position of a source on this pair, kept across generations (and
# processes): it is where a generation's estimate starts, forgetting over ~100 cycles.
TYPICAL_MEMORY = 0.99
# Each position's rate is shrunk toward the key's pooled rate by this many observations; the
# pooled rate starts from FIRST_PRIOR, worth one observation.
PRIOR_WEIGHT = 2.0
FIRST_PRIOR = 0.5
# Where the pair's typical acceptance is known, a generation moves that shape by one shift on
# the logit scale, held near 0 by a normal prior of this spread (a shift of 0.6 takes 0.97 to
# 0.95 or 0.98); rates are kept this far off 0 and 1.
SHIFT_SPREAD = 0.6
SHIFT_STEPS = 20
RATE_FLOOR = 1e-4


class Acceptance:
    """Acceptance by position for one acceptance key, older cycles forgotten geometrically.

    ``rates`` reads a_1..a_n: where the pair's typical acceptance is known, its shape shifted by
    how this generation's guesses fared against it (a few cycles, a short answer, are read as
    "easier or harder than usual" rather than position by position, so one unlucky rejection
    moves little); else each position with little evidence leans on the key's pooled rate.
    """

    def __init__(
        self,
        memory: float = ACCEPT_MEMORY,
        kept: list[float] | None = None,
        reached: list[float] | None = None,
    ) -> None:
        self.memory = memory
        self.kept: list[float] = kept or []
        self.reached: list[float] = reached or []
        assert len(self.kept) == len(self.reached)

    def observe(self, drafted: int, accepted: int) -> None:
        judged = judged_guesses(drafted, accepted)
        while len(self.reached) < judged:
            self.reached.append(0.0)
            self.kept.append(0.0)
        for i in range(len(self.reached)):
            self.reached[i] *= self.memory
            self.kept[i] *= self.memory
        for i in range(judged):
            self.reached[i] += 1.0
            self.kept[i] += i < accepted

    def pooled(self) -> tuple[float, float]:
        """(kept, reached) over all positions."""
        return sum(self.kept), sum(self.reached)

    def rates(self, n: int, prior: float, typical: Acceptance | None = None) -> list[float]:
        """a_1..a_n: the typical shape shifted to fit this generation, where one is known;
        else each position shrunk toward this key's pooled rate, itself shrunk toward ``prior``
        (the source's pooled rate) by one observation."""
        if typical is not None and typical.reached:
            logits = [
                logit(a) for a in typical.rates_at(max(n, len(self.reached)), typical.pooled_rate())
            ]
            shift = self._shift(logits)
            return [sigmoid(x + shift) for x in logits[:n]]
        return self.rates_at(n, self.pooled_rate(prior))

    def _shift(self, logits: list[float]) -> float:
        """The logit shift of the typical shape that best fits this generation's own counts,
        under a normal prior (spread SHIFT_SPREAD) that holds it near 0 on little evidence.

        One early rejection in a text the pair usually gets right says little about the next
        cycle."""
        shift = 0.0
        for _ in range(SHIFT_STEPS):  # Newton's method on a concave log-posterior
            gradient, curvature = -shift / SHIFT_SPREAD**2, 1.0 / SHIFT_SPREAD**2
            for x, kept, reached in zip(logits, self.kept, self.reached):
                a = sigmoid(x + shift)
                gradient += kept - reached * a
                curvature += reached * a * (1.0 - a)
            step = max(-2.0, min(2.0, gradient / curvature))  # damped: no overshoot
            shift += step
            if abs(step) < 1e-4:
                break
        return shift

    def pooled_rate(self, prior: float = FIRST_PRIOR) -> float:
        """All positions together, shrunk toward ``prior`` by one observation."""
        kept, reached = self.pooled()
        return (kept + prior) / (reached + 1.0)

    def at(self, i: int) -> tuple[float, float]:
        """(kept, reached) at position i (0-based)."""
        return (self.kept[i], self.reached[i]) if i < len(self.reached) else (0.0, 0.0)

    def rates_at(self, n: int, fallback: float) -> list[float]:
        """Each position's own rate, shrunk toward ``fallback`` where it has little evidence."""
        return [
            (self.at(i)[0] + PRIOR_WEIGHT * fallback) / (self.at(i)[1] + PRIOR_WEIGHT)
            for i in range(n)
        ]


def logit(a: float) -> float:
    a = min(max(a, RATE_FLOOR), 1.0 - RATE_FLOOR)
    return math.log(a / (1.0 - a))


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))
