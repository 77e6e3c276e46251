"""What ``-k auto`` knows of a pair on this machine: its costs and its typical acceptance.

Costs are facts of the machine, the models and the way of decoding (greedy or sampled), so they
outlive a generation: an engine keeps a ``CostBook`` (one ``PairProfile`` per mode) and
``specgen.session.pair`` keeps it between processes (``snapshot``/``restore``, whose JSON keys are
the file format, numbered ``COSTS_VERSION``). Each cost is a ``Timing``: a forgetting mean that
knows where its figure came from (measured in this process, or remembered from an earlier one).
"""

from __future__ import annotations

import statistics
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any, Literal

from specgen.drafters.base import BLOCK_SOURCES
from specgen.lookahead.acceptance import TYPICAL_MEMORY, Acceptance

COST_MEMORY = 0.8
# A verify length's cost leans on the line through all lengths as much as on one sample of it.
LINE_WEIGHT = 1.0
# The target runs "as fast as remembered" while its fastest step here is within this share of
# the remembered mean.
SAME_SPEED = 0.25

# A batch's passes come in many lengths (a prompt's chunk beside the others' guesses), and a
# fit takes a slope for every two lengths: past this many lengths, a fit serves
# lengths / REFIT_LENGTHS passes before it is made again, so that what it costs a pass grows
# with the lengths seen, not with their square (a server that has seen 300 would spend
# milliseconds a pass on it).
REFIT_LENGTHS = 16

SpeedCheck = Literal["yes", "no", "unknown"]
# A batch size's verdict on a kind of guess (``PairProfile.batch_rates``).
Verdict = tuple[float, float, float, float]
# The costs file's format (``store.write_versioned`` of a ``CostBook.snapshot``): a change to
# the keys ``snapshot`` writes, or to what they mean, takes the next number, and a file of
# another number is set aside (its costs are measured afresh).
COSTS_VERSION = 1


@dataclass
class Timing:
    """A forgetting mean of seconds, whose first sample is dropped once a second comes.

    The first decode of a batch shape runs cold (llama.cpp builds its graph), often twice as
    slow. A mean remembered from an earlier process is trusted until this process measures: the
    next sample is dropped where it is slower (cold), and the first one kept replaces the
    remembered mean (``only_remembered`` until then). ``measured_here`` counts this process's
    samples, ``fastest_here`` the least of them (a spike only slows a sample: the least is
    robust).
    """

    memory: float
    weight: float = 0.0
    total: float = 0.0
    count: int = 0
    next_may_be_cold: bool = False
    only_remembered: bool = False
    remembered_mean: float | None = None
    measured_here: int = 0
    fastest_here: float = float("inf")

    @classmethod
    def remembered(cls, memory: float, mean: float, weight: float = 1.0) -> Timing:
        return cls(
            memory,
            weight=weight,
            total=mean * weight,
            count=2,
            next_may_be_cold=True,
            only_remembered=True,
            remembered_mean=mean,
        )

    def add(self, value: float) -> None:
        self.measured_here += 1
        self.fastest_here = min(self.fastest_here, value)
        if self.next_may_be_cold:
            self.next_may_be_cold = False
            if value >= self.mean:  # a cold decode only runs slower: keep what was known
                return
        if self.only_remembered:  # measured here now: that replaces what was remembered
            self.only_remembered = False
            self.weight = self.total = 0.0
        self.count += 1
        if self.count == 2:  # the second sample drops the first (cold) one
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
class PairProfile:
    """What ``auto`` keeps of a pair from one generation to the next, for one way of decoding:
    seconds per guess for each source, the verify pass's seconds by tokens, and each acceptance
    key's typical acceptance by position (the prior a generation's own estimate starts from)."""

    per_guess: dict[str, Timing] = field(default_factory=dict)
    verify_by_n: dict[int, Timing] = field(default_factory=dict)
    typical: dict[str, Acceptance] = field(default_factory=dict)
    # Per source: generations in a row that left it off on a remembered cost alone, never
    # timing it here (see ``explore.RECHECK_AFTER``).
    left_off_untimed: dict[str, int] = field(default_factory=dict)
    observations: int = 0  # cycles observed, to tell whether anything new was measured
    # When each source was last looked at and how long to wait before the next look
    # (``explore``), on a clock of cycles that runs on from one generation to the next in this
    # process: a source that failed every look is looked at rarely, instead of again at once,
    # then after 8 cycles, 16, ... in every new generation (on a hybrid target with an MTP head
    # whose guesses never survive, those looks cost 7% of each 64-token generation).
    explore_cycle: int = 0
    explore_last_tried: dict[str, int] = field(default_factory=dict)
    explore_gap: dict[str, int] = field(default_factory=dict)
    # The loop's own host work as a share of each cycle (outside the models' decodes): what
    # ``doctor`` reports, and what limits the speedup where a target step is short.
    host_share: Timing | None = None
    # What batches measured of guessing, by kind ("guessing": any guess; "drafting": a source
    # that costs) and batch size: (tokens a second with it, without it, seconds its last run
    # lost, as weighed, and that weight), kept where both were trusted (``lookahead.batch``), so
    # that a new process (a server restarted) starts from its verdict instead of paying to
    # learn it again. The file keeps the weights apart (``batch_weights``), so that an earlier
    # specgen still reads the three figures it knows.
    batch_rates: dict[str, dict[int, Verdict]] = field(default_factory=dict)
    # Alike: the seconds of cycles with the kind of guess behind each verdict's first rate (a
    # forgetting sum), what a new process weighs a verdict that guessing wins as.
    batch_evidence: dict[str, dict[int, float]] = field(default_factory=dict)

    # The verify costs fitted (seconds by each n seen, never falling as n grows; and the line
    # through them: intercept, slope), kept until the next observation: ``auto`` asks for them
    # many times a cycle.
    _fit: Fit | None = field(default=None, init=False, repr=False)
    _speed: float | None = field(default=None, init=False, repr=False)
    _passes_since_fit: int = field(default=0, init=False, repr=False)

    def snapshot(self) -> dict[str, Any]:
        """What to remember (``restore``) in a later process on these models."""
        # A length decoded once here is known only by its cold first decode.
        verify = {n: t for n, t in self.verify_by_n.items() if t.weight and t.warm}
        return {
            "per_guess": {s: t.mean for s, t in self.per_guess.items() if t.weight},
            "verify_by_n": {str(n): t.mean for n, t in verify.items()},
            "verify_weight": {str(n): round(t.weight, 3) for n, t in verify.items()},
            "typical": {key: [a.kept, a.reached] for key, a in self.typical.items()},
            "unchecked": dict(self.left_off_untimed),
            **({"host_share": self.host_share.mean} if self.host_share else {}),
            # Three figures a verdict, and its weight apart: a file an earlier specgen reads.
            "batch_rates": {
                kind: {str(size): list(rates[:3]) for size, rates in sizes.items()}
                for kind, sizes in self.batch_rates.items()
            },
            "batch_weights": {
                kind: {str(size): rates[3] for size, rates in sizes.items()}
                for kind, sizes in self.batch_rates.items()
            },
            "batch_evidence": {
                kind: {str(size): round(seconds, 4) for size, seconds in sizes.items()}
                for kind, sizes in self.batch_evidence.items()
            },
        }

    @classmethod
    def restore(cls, snapshot: dict[str, Any]) -> PairProfile:
        """A profile as an earlier process left it: trusted at once, so ``auto`` needs no timing
        cycles, and followed as this process measures (each cost counts as one sample)."""
        profile = cls()
        for source, mean in snapshot.get("per_guess", {}).items():
            profile.per_guess[source] = Timing.remembered(COST_MEMORY, float(mean))
        weights = snapshot.get("verify_weight", {})
        for n, mean in snapshot.get("verify_by_n", {}).items():
            profile.verify_by_n[int(n)] = Timing.remembered(
                COST_MEMORY, float(mean), float(weights.get(n, 1.0))
            )
        for key, (kept, reached) in snapshot.get("typical", {}).items():
            profile.typical[key] = Acceptance(
                TYPICAL_MEMORY, [float(x) for x in kept], [float(x) for x in reached]
            )
        profile.left_off_untimed = {s: int(n) for s, n in snapshot.get("unchecked", {}).items()}
        if "host_share" in snapshot:
            profile.host_share = Timing.remembered(COST_MEMORY, float(snapshot["host_share"]))
        weights = snapshot.get("batch_weights", {})
        for kind, sizes in snapshot.get("batch_rates", {}).items():
            weight = weights.get(kind, {})
            profile.batch_rates[kind] = {
                int(n): _verdict(rates, weight.get(n, 1.0)) for n, rates in sizes.items()
            }
        for kind, sizes in snapshot.get("batch_evidence", {}).items():
            profile.batch_evidence[kind] = {int(n): float(s) for n, s in sizes.items()}
        return profile

    def observe_host(self, host_seconds: float, cycle_seconds: float) -> None:
        """One cycle's host work outside the models' decodes, of ``cycle_seconds`` in all."""
        if cycle_seconds <= 0:
            return
        self.observations += 1  # something new to keep, at a fixed K too
        if self.host_share is None:
            self.host_share = Timing(COST_MEMORY)
        self.host_share.add(host_seconds / cycle_seconds)

    def observe(
        self,
        source: str | None,
        drafted: int,
        draft_seconds: float,
        verify_seconds: float,
        model_guesses: int | None = None,
    ) -> None:
        """One cycle's costs: ``model_guesses`` of the ``drafted`` guesses (default all) cost
        ``draft_seconds``; the rest were free. A block source's pass is timed whole."""
        self.observe_pass(drafted + 1, verify_seconds)
        paid = drafted if model_guesses is None else model_guesses
        if source is not None and paid:
            self.observe_step(source, draft_seconds / (1 if source in BLOCK_SOURCES else paid))

    def observe_pass(self, n_tokens: int, seconds: float) -> None:
        """A target pass over ``n_tokens`` (one sequence's or a batch's) took ``seconds``."""
        self._passes_since_fit += 1  # made again when next asked (``refit_due``)
        self.observations += 1
        self.verify_by_n.setdefault(n_tokens, Timing(COST_MEMORY)).add(seconds)

    def observe_step(self, source: str, seconds: float) -> None:
        """A guess of ``source`` for one sequence (a draft step; a block source's
        whole pass) took ``seconds``."""
        self.per_guess.setdefault(source, Timing(COST_MEMORY)).add(seconds)
        self.left_off_untimed.pop(source, None)

    def guess_timed(self, source: str) -> bool:
        """Whether a guess of the source has a cost to trust: timed twice (the first one runs
        cold), or remembered."""
        timing = self.per_guess.get(source)
        return timing is not None and timing.warm

    def guess_measured_here(self, source: str) -> bool:
        """Whether this process measured the source's guesses (not only remembered them)."""
        timing = self.per_guess.get(source)
        return timing is not None and timing.measured_here > 0

    def speed_matches_remembered(self) -> SpeedCheck:
        """Whether the target runs here as fast as when the costs were remembered, so the rest
        of them can be trusted untimed: "yes" (or nothing was remembered), "no", or "unknown"
        until its step was timed twice here.

        Its fastest step here must be within SAME_SPEED of the remembered mean: one step slowed
        by something else running must not throw the costs away."""
        timing = self.verify_by_n.get(1)
        if timing is None or timing.remembered_mean is None:
            return "yes"
        if timing.measured_here < 2:
            return "unknown"
        same = abs(timing.fastest_here / timing.remembered_mean - 1.0) <= SAME_SPEED
        return "yes" if same else "no"

    def forget_remembered(self) -> None:
        """The machine runs otherwise than when the costs were kept: drop every cost not yet
        measured here (they are learned afresh) and stop comparing."""
        _forget_remembered(self.per_guess)
        _forget_remembered(self.verify_by_n)
        self._fit = self._speed = None

    def _verify_mean(self, timing: Timing) -> float:
        """A verify cost measured here as it is; one only remembered, scaled by how fast the
        target runs here against then (the median ratio over the lengths measured both then and
        here).

        ``auto`` picks among lengths measured here and lengths remembered: unscaled, a machine
        faster or slower now keeps it on the lengths it measured, since a remembered figure is
        corrected only at the lengths it picks."""
        if not timing.only_remembered:
            return timing.mean
        if self._speed is None:
            ratios = sorted(
                t.mean / t.remembered_mean
                for t in self.verify_by_n.values()
                if t.remembered_mean and not t.only_remembered
            )
            self._speed = ratios[len(ratios) // 2] if ratios else 1.0
        return timing.mean * self._speed

    def guess(self, source: str) -> float | None:
        timing = self.per_guess.get(source)
        return None if timing is None else timing.mean

    def verify(self, n: int) -> float | None:
        """Seconds to verify n tokens: from what was measured at n and a line through every
        length, and never less than for a shorter pass. None until anything was seen.

        On a CPU the pass grows near linearly with n (on a GPU it is nearly flat), so each
        length's figure leans on the line through all of them (fitted by the median of the
        slopes between every two lengths) as much as one sample, and is held to the cheapest
        longer pass (more tokens never take less time). Otherwise a figure far off, from a busy
        moment or one cold first decode (a length decoded once here is not taken as measured),
        would keep ``auto`` off that length, and off the ones below a cheaper-looking longer
        pass: nothing corrects a length ``auto`` never picks.
        """
        fit = self.verify_curve()
        return None if fit is None else fit.at(n)

    def verify_curve(self) -> Fit | None:
        """The curve ``verify`` reads (None until anything was seen): for a plan that prices
        many lengths at once."""
        if not self.verify_by_n:
            return None
        if self._fit is None or refit_due(self._passes_since_fit, len(self.verify_by_n)):
            self._speed = None
            self._fit = self._fit_verify()
            self._passes_since_fit = 0
        return self._fit

    def _fit_verify(self) -> Fit:
        points = {m: self._verify_mean(timing) for m, timing in self.verify_by_n.items()}
        return fit_passes(points, self.verify_by_n)


def refit_due(passes_since: int, lengths: int) -> bool:
    """Whether a curve over ``lengths`` lengths, fitted ``passes_since`` passes ago, is made
    again: after every pass while the lengths are few (REFIT_LENGTHS)."""
    return passes_since >= max(1, lengths // REFIT_LENGTHS)


def fit_passes(points: dict[int, float], timings: dict[int, Timing]) -> Fit:
    """The curve of a model's pass by its tokens, from each length's seconds (``points``) and
    its samples (``timings``): see ``PairProfile.verify``."""
    # A pass over m tokens costs no more than m passes over one (a batch shares the weights'
    # reads): a figure above that was timed while something else ran (a build beside a
    # benchmark left verify(4) at 29 steps of one, kept across runs), and is held to it, so
    # ``auto`` tries that length again and measures it.
    one = points.get(1)
    if one is not None:
        points = {m: min(t, m * one) for m, t in points.items()}
    ns = sorted(points)
    slopes = [(points[b] - points[a]) / (b - a) for i, a in enumerate(ns) for b in ns[i + 1 :]]
    slope = max(0.0, statistics.median(slopes)) if slopes else 0.0
    intercept = statistics.median(points[m] - slope * m for m in ns)
    # Each length shrunk toward the line, weighing its samples against the line's one, then
    # held to the cheapest longer pass: a timing is only ever slowed (a busy moment, a cold
    # decode), so where a shorter pass looks dearer, the shorter one is the one off.
    fitted: dict[int, float] = {}
    cheapest = float("inf")
    for m in reversed(ns):
        timing = timings[m]
        weight = timing.weight if timing.warm else 0.0
        shrunk = (points[m] * weight + LINE_WEIGHT * (intercept + slope * m)) / (
            weight + LINE_WEIGHT
        )
        fitted[m] = cheapest = min(shrunk, cheapest)
    return Fit(fitted, (intercept, slope))


class Fit:
    """A pass's seconds by tokens as fitted (each n seen, never falling as n grows), and the
    line through them (intercept, slope), until it is made again (``refit_due``)."""

    __slots__ = ("fitted", "line", "_lengths", "_at")

    def __init__(self, fitted: dict[int, float], line: tuple[float, float]) -> None:
        self.fitted, self.line = fitted, line
        self._lengths = sorted(fitted)
        # Each length worked out once: ``auto`` asks for the same few lengths for every K of
        # every sequence of a batch between two passes.
        self._at: dict[int, float] = {}

    def at(self, n: int) -> float:
        """Seconds of a pass over ``n`` tokens: a length seen as fitted, another on the line,
        held between the shorter and the longer lengths seen."""
        seconds = self._at.get(n)
        if seconds is None:
            seconds = self._at[n] = self._work_out(n)
        return seconds

    def _work_out(self, n: int) -> float:
        fitted, (intercept, slope), lengths = self.fitted, self.line, self._lengths
        if n in fitted:
            return fitted[n]
        # The fitted figures never fall as the length grows (``fit_passes``): the nearest
        # lengths seen below and above bound it (below the shortest, that one's).
        i = bisect_left(lengths, n)
        below = fitted[lengths[max(0, i - 1)]]
        above = fitted[lengths[i]] if i < len(lengths) else float("inf")
        return min(max(intercept + slope * n, below), above)


def _forget_remembered(table: dict[Any, Timing]) -> None:
    for key in [k for k, timing in table.items() if timing.only_remembered]:
        del table[key]
    for timing in table.values():
        timing.remembered_mean = None


@dataclass
class CostBook:
    """The profiles ``auto`` keeps, apart for greedy and for sampled decoding.

    A sampled verify pass warps every row and a sampled draft returns each guess's q (both cost
    more), and a pair agrees far more often greedy than sampled, so one mode's figures would
    mislead the other's first cycles."""

    greedy: PairProfile = field(default_factory=PairProfile)
    sampled: PairProfile = field(default_factory=PairProfile)

    def of(self, greedy: bool) -> PairProfile:
        return self.greedy if greedy else self.sampled

    @property
    def observations(self) -> int:
        return self.greedy.observations + self.sampled.observations

    def snapshot(self) -> dict[str, dict[str, dict[str, Any]]]:
        return {"greedy": self.greedy.snapshot(), "sampled": self.sampled.snapshot()}

    @classmethod
    def restore(cls, snapshot: dict[str, dict[str, dict[str, Any]]]) -> CostBook:
        """A book as ``snapshot`` left it; a mode it lacks starts afresh."""
        return cls(
            PairProfile.restore(snapshot.get("greedy", {})),
            PairProfile.restore(snapshot.get("sampled", {})),
        )

    def copy(self) -> CostBook:
        """An independent book with the same figures (what a new process would restore)."""
        return CostBook.restore(self.snapshot())


def _verdict(rates: list[float], weight: float) -> Verdict:
    """A kept verdict and its weight (a file written before weights were kept has none: 1)."""
    with_it, without, lost = (float(x) for x in rates)
    return with_it, without, lost, float(weight)
