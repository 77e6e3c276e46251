"""How many guesses to ask for, and from which source, before each cycle: fixed K or ``auto``.

A drafter offers sources of guesses each cycle (a draft model; an n-gram match of some length);
a policy picks one and a lookahead K for it, or K = 0 (the target alone). The policy sees only
what past cycles measured, never the cycle it decides, so the output stays exact: the choice is
a function of the text so far, like the guesses themselves.

``AdaptiveLookahead`` (``-k auto``) measures, as it goes:
- acceptance by position for each source, a_1, a_2, ... (a_i: the chance that guess i survives
  once guesses 1..i-1 did; it falls along the cycle, so one alpha misfits): the shape typical
  of the pair, moved by one shift fitted to this generation's guesses (older cycles forgotten
  geometrically so the estimate follows the text);
- the costs: seconds per guess for each source, and the target's verify pass over n tokens as a
  function of n (each length's figure leaning on a robust line through all of them, and never
  falling as n grows);
and picks the K that maximizes expected tokens per second,

    E[tokens](K) / (K * draft cost + verify(K + 1)),   E[tokens](K) = 1 + sum_j prod_{i<=j} a_i

(Leviathan et al. 2023, Chen et al. 2023, with per-position rates), a draft model's K at most
twice the longest run of guesses this generation kept (GROWTH_FIRST to begin). K = 0 wins when
nothing pays; then it probes a source now and then (ever more rarely while probes keep
failing), and stops probing a source whose costs alone rule it out even if every guess survived
(a cost remembered from another process that does so is timed again every RECHECK_AFTER
generations).

Costs are facts of the machine, the models and the way of decoding (greedy or sampled), so they
outlive a generation (an engine keeps them, one ``Costs`` per mode in a ``CostBook``, and
``specgen.session`` keeps them between processes); acceptance is a fact of the text, so each
generation learns its own, starting from what is typical of the pair (``Costs.typical``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from specgen.core.speculative import MAX_LOOKAHEAD, expected_tokens_by_position

# The longest cycle ``auto`` plans: past this the verify pass's cost is extrapolated too far.
AUTO_MAX_LOOKAHEAD = 32
# Forgetting per cycle: an observation ten cycles old weighs a third of a new one.
ACCEPT_MEMORY = 0.9
# The typical acceptance by position of a source on this pair, kept across generations (and
# processes): it is where a generation's estimate starts, forgetting over ~100 cycles.
TYPICAL_MEMORY = 0.99
COST_MEMORY = 0.8
# A verify length's cost leans on the line through all lengths as much as on one sample of it.
LINE_WEIGHT = 1.0
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
# A source is first timed with one guess (a draft slower than the target costs little to find
# out); a probe of an offer left alone takes a few, and the gaps (in cycles) before an offer
# left alone is probed again double while probes fail.
TIMING_LOOKAHEAD = 1
PROBE_LOOKAHEAD = 3
PROBE_GAP_FIRST, PROBE_GAP_MAX = 8, 128
# Generations that may leave a source off on a cost remembered from another process alone,
# never timing it here, before one times it: a cost measured in a busy moment must not turn
# speculation off for good, and a source that truly cannot pay costs one guess now and then.
RECHECK_AFTER = 8
# A cycle of paid guesses is a bet: K draft steps are spent whether the guesses survive or not,
# and past the longest run this text has shown survive, acceptance is known from other texts
# only. So K for paid guesses is at most GROWTH_RATE times that run (from GROWTH_FIRST): on a
# CPU the rate is nearly flat past K = 8-12 when every guess survives, so the ramp costs little,
# while one long cycle that fails early costs as much as several short ones.
GROWTH_FIRST, GROWTH_RATE = 8, 2


@dataclass(frozen=True)
class Offer:
    """One source of guesses a drafter can use this cycle.

    ``source`` is what the stats count (``model``, ``ngram``); ``key`` what acceptance is
    learned under (an n-gram match of 4 tokens predicts better than one of 1); ``limit`` the most
    guesses it can give.
    """

    source: str
    key: str
    limit: int
    # The guesses this offer would make, where they cost nothing to know (an n-gram match's
    # continuation): scored in hindsight against the tokens a cycle produced, an offer not
    # taken is still learned about.
    preview: tuple[int, ...] = ()


@dataclass(frozen=True)
class Plan:
    """The policy's decision for one cycle: ask ``offer`` for ``lookahead`` guesses (0: none)."""

    offer: Offer | None
    lookahead: int
    probe: bool = False


TARGET_ALONE = Plan(None, 0)


class FixedLookahead:
    """``-k N``: the drafter's first offer, N guesses (fewer where the offer has fewer)."""

    def __init__(self, lookahead: int) -> None:
        if not 0 <= lookahead <= MAX_LOOKAHEAD:
            raise ValueError(f"lookahead (K) must be from 0 to {MAX_LOOKAHEAD}")
        self.lookahead = lookahead

    def begin(self) -> None:
        """A new generation: nothing to forget."""

    def plan(self, offers: Sequence[Offer], room: int) -> Plan:
        if not offers or self.lookahead == 0 or room <= 0:
            return TARGET_ALONE
        offer = offers[0]
        return Plan(offer, min(self.lookahead, offer.limit, room))

    def observe(self, plan: Plan, drafted: int, accepted: int, draft_seconds: float,
                verify_seconds: float, offers: Sequence[Offer] = (),
                produced: Sequence[int] = (), switch: tuple[Offer, int] | None = None) -> None:
        """Fixed K learns nothing."""


@dataclass
class _Ema:
    """An exponentially weighted mean whose first sample is dropped once a second comes: the
    first decode of a batch shape runs cold (llama.cpp builds its graph), often twice as slow.
    A mean remembered from an earlier process is trusted until this process measures: its first
    sample is dropped where it is slower (cold), and the first one kept replaces the remembered
    mean. ``seen_here`` counts what this process measured."""

    memory: float
    weight: float = 0.0
    total: float = 0.0
    count: int = 0
    cold_pending: bool = False
    remembered_only: bool = False
    remembered_mean: float | None = None
    seen_here: int = 0
    fastest_here: float = float("inf")  # a spike only slows a sample: the least is robust

    @classmethod
    def remembered(cls, memory: float, mean: float, weight: float = 1.0) -> _Ema:
        return cls(memory, weight=weight, total=mean * weight, count=2, cold_pending=True,
                   remembered_only=True, remembered_mean=mean)

    def add(self, value: float) -> None:
        self.seen_here += 1
        self.fastest_here = min(self.fastest_here, value)
        if self.cold_pending:
            self.cold_pending = False
            if value >= self.mean:  # a cold decode only runs slower: keep what was known
                return
        if self.remembered_only:  # measured here now: that replaces what was remembered
            self.remembered_only = False
            self.weight = self.total = 0.0
        self.count += 1
        if self.count == 2:
            self.weight = self.total = 0.0
        self.weight = self.memory * self.weight + 1.0
        self.total = self.memory * self.total + value

    @property
    def warm(self) -> bool:
        """Whether it holds more than a first (cold) sample: a remembered mean, or a second."""
        return self.count >= 2

    @property
    def mean(self) -> float:
        assert self.weight, "an average is read only after a sample was added"
        return self.total / self.weight


@dataclass
class Costs:
    """What ``auto`` keeps from one generation to the next: seconds per draft guess for each
    source, the verify pass's seconds by tokens, and each key's typical acceptance by position
    (the prior a generation's own estimate starts from)."""

    per_guess: dict[str, _Ema] = field(default_factory=dict)
    verify_by_n: dict[int, _Ema] = field(default_factory=dict)
    typical: dict[str, _Acceptance] = field(default_factory=dict)
    # Per source: generations in a row that left it off on a remembered cost alone.
    unchecked: dict[str, int] = field(default_factory=dict)
    observations: int = 0  # cycles observed, to tell whether anything new was measured

    # The verify costs fitted (seconds by each n seen, never falling as n grows; and the line
    # through them: intercept, slope), kept until the next observation: ``auto`` asks for them
    # many times a cycle.
    _fit: tuple[dict[int, float], tuple[float, float]] | None = field(
        default=None, init=False, repr=False)
    _speed: float | None = field(default=None, init=False, repr=False)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """What to remember (``restore``) in a later process on these models."""
        # A length decoded once here is known only by its cold first decode.
        verify = {n: e for n, e in self.verify_by_n.items() if e.weight and e.warm}
        return {"per_guess": {s: e.mean for s, e in self.per_guess.items() if e.weight},
                "verify_by_n": {str(n): e.mean for n, e in verify.items()},
                "verify_weight": {str(n): round(e.weight, 3) for n, e in verify.items()},
                "typical": {key: [a.kept, a.reached] for key, a in self.typical.items()},
                "unchecked": dict(self.unchecked)}

    @classmethod
    def restore(cls, snapshot: dict[str, dict[str, Any]]) -> Costs:
        """Costs as an earlier process left them: trusted at once, so ``auto`` needs no timing
        cycles, and followed as this process measures (each counts as one sample)."""
        costs = cls()
        for source, mean in snapshot.get("per_guess", {}).items():
            costs.per_guess[source] = _Ema.remembered(COST_MEMORY, float(mean))
        weights = snapshot.get("verify_weight", {})
        for n, mean in snapshot.get("verify_by_n", {}).items():
            costs.verify_by_n[int(n)] = _Ema.remembered(COST_MEMORY, float(mean),
                                                        float(weights.get(n, 1.0)))
        for key, (kept, reached) in snapshot.get("typical", {}).items():
            costs.typical[key] = _Acceptance(TYPICAL_MEMORY, [float(x) for x in kept],
                                             [float(x) for x in reached])
        costs.unchecked = {s: int(n) for s, n in snapshot.get("unchecked", {}).items()}
        return costs

    def observe(self, source: str | None, drafted: int, draft_seconds: float,
                verify_seconds: float, paid: int | None = None) -> None:
        """One cycle's costs: ``paid`` of the ``drafted`` guesses (default all) cost
        ``draft_seconds``; the rest were free."""
        self._fit = self._speed = None
        self.observations += 1
        self.verify_by_n.setdefault(drafted + 1, _Ema(COST_MEMORY)).add(verify_seconds)
        paid = drafted if paid is None else paid
        if source is not None and paid:
            self.per_guess.setdefault(source, _Ema(COST_MEMORY)).add(draft_seconds / paid)
            self.unchecked.pop(source, None)

    def timings(self, source: str) -> int:
        ema = self.per_guess.get(source)
        return 0 if ema is None else ema.count

    def timed_here(self, source: str) -> bool:
        """Whether this process measured the source's guesses (not only remembered them)."""
        ema = self.per_guess.get(source)
        return ema is not None and ema.seen_here > 0

    def as_remembered(self) -> bool | None:
        """Whether the target runs here as fast as when the costs were remembered (its
        fastest step here within a quarter of the remembered mean: one step slowed by something
        else running must not throw the costs away), so the rest of them can be trusted
        untimed; None until it was timed twice."""
        ema = self.verify_by_n.get(1)
        if ema is None or ema.remembered_mean is None:
            return True
        if ema.seen_here < 2:
            return None
        return abs(ema.fastest_here / ema.remembered_mean - 1.0) <= 0.25

    def forget_remembered(self) -> None:
        """The machine runs otherwise than when the costs were kept: drop every cost not yet
        measured here (they are learned afresh) and stop comparing."""
        for table in (self.per_guess, self.verify_by_n):
            for key in [k for k, ema in table.items() if ema.remembered_only]:
                del table[key]  # type: ignore[attr-defined]
            for ema in table.values():  # type: ignore[attr-defined]
                ema.remembered_mean = None
        self._fit = self._speed = None

    def _verify_mean(self, ema: _Ema) -> float:
        """A verify cost measured here as it is; one only remembered, scaled by how fast the
        target runs here against then (the median ratio over the lengths measured both then and
        here): auto picks among lengths measured here and lengths remembered, and a machine
        faster or slower now made it stick to the ones it had measured (a remembered figure is
        corrected only at lengths it picks)."""
        if not ema.remembered_only:
            return ema.mean
        if self._speed is None:
            ratios = sorted(e.mean / e.remembered_mean for e in self.verify_by_n.values()
                            if e.remembered_mean and not e.remembered_only)
            self._speed = ratios[len(ratios) // 2] if ratios else 1.0
        return ema.mean * self._speed

    def guess(self, source: str) -> float | None:
        ema = self.per_guess.get(source)
        return None if ema is None else ema.mean

    def verify(self, n: int) -> float | None:
        """Seconds to verify n tokens: from what was measured at n and a line through every
        length, and never less than for a shorter pass. None until anything was seen.

        On a CPU the pass grows near linearly with n (on a GPU it is nearly flat), so each
        length's figure leans on the line through all of them (fitted by the median of the
        slopes between every two lengths) as much as one sample, and is held to the cheapest
        longer pass (more tokens never take less time). A figure far off, from a busy moment
        or one cold first decode (a length decoded once here is not taken as measured), would
        otherwise keep ``auto`` off that length, and off the ones below a cheaper-looking
        longer pass, for good: nothing corrects a length ``auto`` never picks.
        """
        if not self.verify_by_n:
            return None
        if self._fit is None:
            self._fit = self._fit_verify()
        fitted, (intercept, slope) = self._fit
        if n in fitted:
            return fitted[n]
        below = max((t for m, t in fitted.items() if m < n), default=min(fitted.values()))
        above = min((t for m, t in fitted.items() if m > n), default=float("inf"))
        return min(max(intercept + slope * n, below), above)

    def _fit_verify(self) -> tuple[dict[int, float], tuple[float, float]]:
        points = {m: self._verify_mean(ema) for m, ema in self.verify_by_n.items()}
        ns = sorted(points)
        slopes = [(points[b] - points[a]) / (b - a) for i, a in enumerate(ns) for b in ns[i + 1:]]
        slope = max(0.0, statistics.median(slopes)) if slopes else 0.0
        intercept = statistics.median(points[m] - slope * m for m in ns)
        # Each length shrunk toward the line, weighing its samples against the line's one, then
        # held to the cheapest longer pass: a timing is only ever slowed (a busy moment, a cold
        # decode), so where a shorter pass looks dearer, the shorter one is the one off.
        fitted: dict[int, float] = {}
        cheapest = float("inf")
        for m in reversed(ns):
            ema = self.verify_by_n[m]
            weight = ema.weight if ema.warm else 0.0
            shrunk = (points[m] * weight + LINE_WEIGHT * (intercept + slope * m)) / (
                weight + LINE_WEIGHT)
            fitted[m] = cheapest = min(shrunk, cheapest)
        return fitted, (intercept, slope)


@dataclass
class CostBook:
    """The costs ``auto`` keeps, apart for greedy and for sampled decoding: a sampled verify
    pass warps every row and a sampled draft returns each guess's q (both cost more), and a
    pair agrees far more often greedy than sampled, so one mode's figures would mislead the
    other's first cycles."""

    greedy: Costs = field(default_factory=Costs)
    sampled: Costs = field(default_factory=Costs)

    def of(self, greedy: bool) -> Costs:
        return self.greedy if greedy else self.sampled

    @property
    def observations(self) -> int:
        return self.greedy.observations + self.sampled.observations

    def snapshot(self) -> dict[str, dict[str, dict[str, Any]]]:
        return {"greedy": self.greedy.snapshot(), "sampled": self.sampled.snapshot()}

    @classmethod
    def restore(cls, snapshot: dict[str, dict[str, dict[str, Any]]]) -> CostBook:
        """A book as ``snapshot`` left it; a mode it lacks starts afresh."""
        return cls(Costs.restore(snapshot.get("greedy", {})),
                   Costs.restore(snapshot.get("sampled", {})))


class _Acceptance:
    """Acceptance by position for one key, older cycles forgotten geometrically.

    Kept across generations, it is what is typical of the pair (its shape along the cycle);
    a generation's own counts move that shape by one shift, so a few cycles (a short answer)
    are read as "easier or harder than usual" rather than position by position, where one
    unlucky rejection cut K for many cycles. With nothing typical known, a position with
    little evidence leans on the key's pooled rate (all positions together).
    """

    def __init__(self, memory: float = ACCEPT_MEMORY, kept: list[float] | None = None,
                 reached: list[float] | None = None) -> None:
        self.memory = memory
        self.kept: list[float] = kept or []
        self.reached: list[float] = reached or []
        assert len(self.kept) == len(self.reached)

    def observe(self, drafted: int, accepted: int) -> None:
        judged = min(drafted, accepted + 1)
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

    def rates(self, n: int, prior: float, typical: _Acceptance | None = None) -> list[float]:
        """a_1..a_n. Where the pair's typical acceptance is known, its shape along the cycle,
        shifted (on the logit scale) by how this generation's guesses fared against it at every
        position together; else each position shrunk toward this key's pooled rate, itself
        shrunk toward ``prior`` (the source's pooled rate) by one observation."""
        if typical is not None and typical.reached:
            logits = [_logit(a) for a in typical.rates_at(max(n, len(self.reached)),
                                                           typical.pooled_rate())]
            shift = self._shift(logits)
            return [_sigmoid(logit + shift) for logit in logits[:n]]
        return self.rates_at(n, self.pooled_rate(prior))

    def _shift(self, logits: list[float]) -> float:
        """The logit shift of the typical shape that best fits this generation's own counts,
        under a normal prior (spread SHIFT_SPREAD) that holds it near 0 on little evidence:
        one early rejection in a text the pair usually gets right says little about the
        next cycle."""
        shift = 0.0
        for _ in range(SHIFT_STEPS):  # Newton's method on a concave log-posterior
            gradient, curvature = -shift / SHIFT_SPREAD**2, 1.0 / SHIFT_SPREAD**2
            for logit, kept, reached in zip(logits, self.kept, self.reached):
                a = _sigmoid(logit + shift)
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
        return [(self.at(i)[0] + PRIOR_WEIGHT * fallback) / (self.at(i)[1] + PRIOR_WEIGHT)
                for i in range(n)]


class AdaptiveLookahead:
    """``-k auto``: the source and K with the most expected tokens per second, from past cycles."""

    def __init__(self, costs: Costs | None = None, max_lookahead: int = AUTO_MAX_LOOKAHEAD
                 ) -> None:
        self.costs = costs if costs is not None else Costs()
        self.max_lookahead = max_lookahead
        self.begin()

    def begin(self) -> None:
        """A new generation: acceptance is a fact of the text, so start it afresh."""
        self.acceptance: dict[str, _Acceptance] = {}
        self._source_of: dict[str, str] = {}
        self._cycle = 0
        self._tried: dict[str, int] = {}  # key -> the last cycle it drafted
        self._gap: dict[str, int] = {}  # key -> cycles to wait before probing it again
        self._hopeless: set[str] = set()  # keys whose costs alone rule them out, for now
        self._left_off: set[str] = set()  # sources left off untimed in this generation
        self._longest: dict[str, int] = {}  # key -> most guesses kept in one cycle
        # Keys probed in this generation: the typical acceptance is what ruled them out, so
        # the probe's own evidence speaks for them from then on.
        self._probed: set[str] = set()

    def plan(self, offers: Sequence[Offer], room: int) -> Plan:
        self._cycle += 1
        if not offers or room <= 0:
            return TARGET_ALONE
        alone = self.costs.verify_by_n.get(1)
        if alone is None or not alone.warm:
            return TARGET_ALONE  # the first two cycles time the target alone (one runs cold)
        target_step = alone.mean
        same_speed = self.costs.as_remembered()
        if same_speed is False:
            self.costs.forget_remembered()
        # Free guesses (an n-gram's continuation) need no timing: they cost a lookup. A draft
        # model is timed twice (its first step runs cold) before its costs are trusted.
        timed = [offer for offer in offers
                 if offer.preview or self.costs.timings(offer.source) >= 2]
        best, best_rate = TARGET_ALONE, 1.0 / target_step
        for offer in timed:
            if offer.key in self._hopeless:
                continue
            k, rate = self._best_lookahead(offer, room, optimistic=False)
            if rate > best_rate:
                best, best_rate = Plan(offer, k), rate
        # A source not yet timed (a draft model) is timed once nothing timed pays, so it is
        # not run while prompt lookup does well.
        untimed = [offer for offer in offers if offer not in timed]
        if untimed and not best.lookahead:
            return self._probe(untimed[0], room, TIMING_LOOKAHEAD)
        # Explore: an offer left alone for a while that would win if its guesses survived
        # (the draft model while speculation is off). Each probe that does not win doubles the
        # wait before the next one. Free offers (n-gram matches) are never probed: every cycle
        # they are offered in scores them in hindsight.
        chosen = best.offer.key if best.offer else None
        for offer in timed:
            idle = self._cycle - self._tried.get(offer.key, -PROBE_GAP_MAX)
            if offer.key == chosen or offer.preview or \
                    idle < self._gap.get(offer.key, PROBE_GAP_FIRST):
                continue
            _, hope = self._best_lookahead(offer, room, optimistic=True)
            self._tried[offer.key] = self._cycle  # checked: look again after the gap
            # Costs alone rule it out even if every guess survived: skip it until then. A cost
            # only remembered from another process rules it out once the target is seen to run
            # as fast as it did then (otherwise the remembered costs were dropped above), and
            # for RECHECK_AFTER generations: then one times it, for it may have been measured
            # in a busy moment, and a source never run would never correct it.
            self._hopeless.discard(offer.key)
            if hope <= 1.0 / target_step:
                if not self.costs.timed_here(offer.source):
                    if same_speed is None:  # wait until the target's own speed is known
                        self._tried[offer.key] = self._cycle - PROBE_GAP_MAX  # next cycle
                        continue
                    if offer.source not in self._left_off:  # once a generation
                        left_off = self.costs.unchecked.get(offer.source, 0)
                        if left_off >= RECHECK_AFTER:
                            return self._probe(offer, room, TIMING_LOOKAHEAD)
                        self._left_off.add(offer.source)
                        self.costs.unchecked[offer.source] = left_off + 1
                self._hopeless.add(offer.key)
            if hope > best_rate:
                self._gap[offer.key] = min(2 * self._gap.get(offer.key, PROBE_GAP_FIRST),
                                           PROBE_GAP_MAX)
                return self._probe(offer, room)
        if best.offer is not None:
            self._gap[best.offer.key] = PROBE_GAP_FIRST
        return best

    def _probe(self, offer: Offer, room: int, lookahead: int = PROBE_LOOKAHEAD) -> Plan:
        # What was learned about this offer before is stale: the probe starts it afresh.
        self.acceptance.pop(offer.key, None)
        self._probed.add(offer.key)
        self._tried[offer.key] = self._cycle
        return Plan(offer, min(lookahead, offer.limit, room), probe=True)

    def _best_lookahead(self, offer: Offer, room: int, optimistic: bool) -> tuple[int, float]:
        """The K in 1..limit with the most expected tokens per second, and that rate.

        ``optimistic``: what the offer could do at best, every guess surviving, and a verify
        length not measured yet costing no more than the longest one measured (the pass never
        gets cheaper as it grows, so that bounds it). The line through the lengths measured is
        no bound: after the first cycles it runs through 1 and 2 tokens only, the steepest part
        of the curve on a CPU, and made a draft that pays at K=10 look hopeless for good.
        """
        guess = self.costs.guess(offer.source) or 0.0
        limit = min(offer.limit, room, self.max_lookahead)
        measured = max(self.costs.verify_by_n) if optimistic else limit + 1
        if not offer.preview and not optimistic:
            longest = self._longest.get(offer.key, 0)
            limit = min(limit, max(GROWTH_FIRST, GROWTH_RATE * longest))
        if optimistic:
            rates = [1.0] * limit
        else:
            typical = None if offer.key in self._probed else self.costs.typical.get(offer.key)
            rates = self.acceptance.get(offer.key, _Acceptance()).rates(
                limit, self._source_prior(offer.source), typical)
        expected = expected_tokens_by_position(rates)
        best_k, best_rate = 0, 0.0
        for k in range(1, limit + 1):
            verify = self.costs.verify(min(k + 1, measured))
            assert verify is not None, "verify(1) was measured, so every n has an estimate"
            rate = expected[k] / (k * guess + verify)
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k, best_rate

    def _source_prior(self, source: str) -> float:
        """The source's pooled rate over all its keys (n-gram matches of every length)."""
        kept = reached = 0.0
        for key, acceptance in self.acceptance.items():
            if self._source_of.get(key) == source:
                k, r = acceptance.pooled()
                kept, reached = kept + k, reached + r
        return (kept + FIRST_PRIOR) / (reached + 1.0)

    def observe(self, plan: Plan, drafted: int, accepted: int, draft_seconds: float,
                verify_seconds: float, offers: Sequence[Offer] = (),
                produced: Sequence[int] = (), switch: tuple[Offer, int] | None = None) -> None:
        """Learn from one cycle: its costs, its acceptance, and in hindsight the acceptance of
        the free offers not taken (the cycle's ``produced`` tokens are the target's own).
        With ``switch`` (offer, n), the last n guesses came free from that offer."""
        source = plan.offer.source if plan.offer else None
        paid = drafted - (switch[1] if switch else 0)
        self.costs.observe(source, drafted, draft_seconds, verify_seconds, paid)
        if plan.offer is not None and paid:
            self._learn(plan.offer, paid, min(accepted, paid))
        if switch is not None and accepted >= paid:  # the switch's guesses were judged
            self._learn(switch[0], switch[1], accepted - paid)
        for offer in offers:
            if offer == plan.offer or not offer.preview or not produced:
                continue
            # A point-mass guess g is kept with probability p(g), the same chance that the
            # target's own token there is g: matching what was produced is a fair coin.
            judged = min(len(offer.preview), len(produced))
            matched = 0
            while matched < judged and offer.preview[matched] == produced[matched]:
                matched += 1
            self._learn(offer, judged, matched)

    def _learn(self, offer: Offer, drafted: int, accepted: int) -> None:
        self._longest[offer.key] = max(self._longest.get(offer.key, 0), accepted)
        self._tried[offer.key] = self._cycle
        self._source_of[offer.key] = offer.source
        self.acceptance.setdefault(offer.key, _Acceptance()).observe(drafted, accepted)
        self.costs.typical.setdefault(offer.key, _Acceptance(TYPICAL_MEMORY)).observe(
            drafted, accepted)


def _logit(a: float) -> float:
    a = min(max(a, RATE_FLOOR), 1.0 - RATE_FLOOR)
    return math.log(a / (1.0 - a))


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


LookaheadPolicy = FixedLookahead | AdaptiveLookahead
