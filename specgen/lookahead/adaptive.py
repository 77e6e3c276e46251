"""``-k auto``: before each cycle, the source and K with the most expected tokens per second.

For each candidate it reads the acceptance by position a_1, a_2, ... learned so far
(``acceptance``) and the costs (``costs``: seconds per guess, the verify pass by length), and
picks the K that maximizes

    E[tokens](K) / (K * guess cost + verify(K + 1)),   E[tokens](K) = 1 + sum_j prod_{i<=j} a_i

(Leviathan et al. 2023, Chen et al. 2023, with per-position rates; a block drafter's K guesses
cost one pass, ``drafters.base.draft_cost``). K = 0, the target alone,
wins when nothing pays; then ``explore`` decides when a source left alone is tried again. The
policy sees only what past cycles measured, never the cycle it decides, so the output stays
exact.
"""

from __future__ import annotations

from collections.abc import Sequence

from specgen.core.speculative import expected_tokens_by_position
from specgen.drafters.base import (
    HEAD_SOURCES,
    TARGET_ALONE,
    Candidate,
    NgramTail,
    Plan,
    draft_cost,
    model_guesses,
)
from specgen.lookahead.acceptance import FIRST_PRIOR, TYPICAL_MEMORY, Acceptance
from specgen.lookahead.batch import BatchLoad, Others
from specgen.lookahead.costs import PairProfile
from specgen.lookahead.explore import (
    BATCH_TIMING_LOOKAHEAD,
    EXPLORE_LOOKAHEAD,
    TIMING_LOOKAHEAD,
    Exploration,
)

# The longest cycle ``auto`` plans: past this the verify pass's cost is extrapolated too far.
AUTO_MAX_LOOKAHEAD = 32
# A cycle of a draft model's guesses is a bet: K draft steps are spent whether the guesses
# survive or not, and past the longest run this text has shown survive, acceptance is known from
# other texts only. So K for a model's guesses is at most GROWTH_RATE times that run (from
# GROWTH_FIRST): on a CPU the rate is nearly flat past K = 8-12 when every guess survives, so the
# ramp costs little, while one long cycle that fails early costs as much as several short ones.
GROWTH_FIRST, GROWTH_RATE = 8, 2

# A time below any a clock can measure (a step that read 0 s: a coarse clock, a fake one).
SHORTEST = 1e-9


class AdaptiveLookahead:
    """``-k auto``: the source and K with the most expected tokens per second, from past cycles.

    ``profile`` is what is known of the pair (costs, typical acceptance) and outlives the
    generation; everything else is this generation's and starts afresh in ``begin``. With
    ``load``, the generation is sequence ``slot`` of a batch, and a K is priced by what it adds
    to the whole batch's tokens per second (``lookahead.batch``); the batch's passes are timed
    by its scheduler, not here.
    """

    def __init__(
        self,
        profile: PairProfile | None = None,
        max_lookahead: int = AUTO_MAX_LOOKAHEAD,
        load: BatchLoad | None = None,
        slot: int = 0,
    ) -> None:
        self.profile = profile if profile is not None else PairProfile()
        self.max_lookahead = max_lookahead
        self.load, self.slot = load, slot
        self._others = Others()
        self.begin()

    def begin(self) -> None:
        """A new generation: acceptance is a fact of the text, so start it afresh."""
        self.acceptance: dict[str, Acceptance] = {}
        profile = self.profile
        self.exploration = Exploration(
            profile.explore_cycle, profile.explore_last_tried, profile.explore_gap
        )
        self._source_of: dict[str, str] = {}
        self._longest: dict[str, int] = {}  # key -> most guesses kept in one cycle

    def plan(self, candidates: Sequence[Candidate], budget: int) -> Plan:
        """This cycle's plan, for at most ``budget`` guesses (tokens left in the budget and the
        context)."""
        exploration = self.exploration
        exploration.cycle += 1
        self.profile.explore_cycle = exploration.cycle
        critical = self.load is None or self.load.on_critical_path(self.slot)
        if not candidates or budget <= 0 or not critical:
            return TARGET_ALONE
        # 1. The first two cycles time the target alone (the first one runs cold).
        alone_rate = self._alone_rate()
        if alone_rate is None:
            return TARGET_ALONE
        if self.load is not None and self.load.guessing_loses():
            return TARGET_ALONE  # this batch measured faster without guesses
        speed = self.profile.speed_matches_remembered()
        if speed == "no":
            self.profile.forget_remembered()
        # Where this batch measured drafting slower than going without it (a draft model's
        # batched step on a CPU), only free guesses (prompt lookup) are left.
        if self.load is not None and self.load.drafting_loses():
            candidates = [c for c in candidates if c.preview]
        # 2. The best plan among candidates whose costs are known. Free guesses (an n-gram's
        #    continuation) cost a lookup; a draft model is timed twice (its first step runs
        #    cold) before its costs are trusted.
        timed = [c for c in candidates if c.preview or self._timed(c.source)]
        best, best_rate = TARGET_ALONE, alone_rate
        for candidate in timed:
            if candidate.acceptance_key in exploration.ruled_out:
                continue
            k, rate = self._best_lookahead(candidate, budget, optimistic=False)
            if rate > best_rate:
                best, best_rate = Plan(candidate, k), rate
        # In a batch, each sequence's best K with the others' held can settle where every one
        # drafts because the others do (their draft steps are paid anyway), below what the batch
        # gives with none drafting: then none drafts, and from there one drafts only where that
        # raises the batch's rate.
        if best.lookahead and self.load is not None and best_rate < self.load.plain_rate():
            best, best_rate = TARGET_ALONE, alone_rate
        # A read before the first guess is priced by what drafting measured here too: the
        # formula's rates run high in a batch (the host's time, the others' luck).
        if self._read_waits(best.candidate, budget):
            best, best_rate = TARGET_ALONE, alone_rate
        # 3. A source not yet timed (a draft model) is timed once nothing timed pays, so it is
        #    not run while prompt lookup does well.
        untimed = [c for c in candidates if c not in timed]
        if untimed and not best.lookahead and self._may_time():
            return self._time(untimed[0], budget)
        # 4. A candidate left alone for a while that would win if its guesses survived (the
        #    draft model while speculation is off) is explored instead.
        chosen = best.candidate.acceptance_key if best.candidate else None
        for candidate in timed:
            if not exploration.due(candidate, chosen):
                continue
            # A look that needs a read is priced as step 2 prices a plan's.
            if self._read_waits(candidate, budget):
                continue
            _, hope = self._best_lookahead(candidate, budget, optimistic=True)
            verdict = exploration.judge(candidate, hope, alone_rate, best_rate, speed, self.profile)
            if verdict == "time" and self._may_time():
                return self._time(candidate, budget)
            if verdict == "explore":
                return self._explore(candidate, budget)
        exploration.settled(best.candidate)
        return best

    def _timed(self, source: str) -> bool:
        """Whether a guess of ``source`` has a cost to trust: its own, or in a batch that timed
        the draft model's batched steps, theirs (``BatchLoad.draft_seconds_by_k`` prices it)."""
        if self.profile.guess_timed(source):
            return True
        return source == "model" and self.load is not None and self.load.draft_timed()

    def _may_time(self) -> bool:
        """Whether this sequence may time a source this cycle: in a batch, one sequence a
        cycle does (``BatchLoad.claim_timing``)."""
        return self.load is None or self.load.claim_timing(self.slot)

    def _time(self, candidate: Candidate, budget: int) -> Plan:
        """A cycle that times ``candidate``'s guesses: one step alone, two in a batch (whose
        steps are timed by the batch, the first running cold)."""
        lookahead = TIMING_LOOKAHEAD if self.load is None else BATCH_TIMING_LOOKAHEAD
        return self._explore(candidate, budget, lookahead)

    def _read_waits(self, candidate: Candidate | None, budget: int) -> bool:
        """In a batch, whether ``candidate``'s read before its first guess (a pass every
        sequence waits for) does not pay by what drafting measured here
        (``BatchLoad.read_pays``)."""
        setup = candidate.setup if candidate is not None else 0
        return bool(setup) and self.load is not None and not self.load.read_pays(setup, budget)

    def _explore(
        self, candidate: Candidate, budget: int, lookahead: int = EXPLORE_LOOKAHEAD
    ) -> Plan:
        # What was learned about this candidate before is stale: exploring starts it afresh,
        # and its own evidence speaks for it from then on (the typical acceptance is what ruled
        # it out).
        key = candidate.acceptance_key
        self.acceptance.pop(key, None)
        self.exploration.explored.add(key)
        self.exploration.tried(key)
        return Plan(candidate, min(lookahead, candidate.limit, budget), explore=True)

    def _best_lookahead(
        self, candidate: Candidate, budget: int, optimistic: bool
    ) -> tuple[int, float]:
        """The K in 1..limit with the most expected tokens per second, and that rate.

        ``optimistic``: what the candidate could do at best, every guess surviving, and a verify
        length not measured yet costing no more than the longest one measured. That bounds it,
        since the pass never gets cheaper as it grows; the line through the lengths measured is
        no bound, as after the first cycles it runs through 1 and 2 tokens only, the steepest
        part of the curve on a CPU.
        """
        key = candidate.acceptance_key
        guess = self.profile.guess(candidate.source) or 0.0
        limit = min(candidate.limit, budget, self.max_lookahead)
        measured = max(self.profile.verify_by_n) if optimistic else None
        if not candidate.preview and not optimistic:
            longest = self._longest.get(key, 0)
            limit = min(limit, max(GROWTH_FIRST, GROWTH_RATE * longest))
        if optimistic:
            rates = [1.0] * limit
        else:
            typical = None if key in self.exploration.explored else self.profile.typical.get(key)
            rates = self.acceptance.get(key, Acceptance()).rates(
                limit, self._source_prior(candidate.source), typical
            )
        expected = expected_tokens_by_position(rates)
        setup = self._setup_seconds(candidate)
        seconds = self._cycle_seconds(limit, guess, measured, candidate.source)
        others = self._others.tokens if self.load is not None else 0.0
        best_k, best_rate = 0, 0.0
        for k in range(1, limit + 1):
            # A first read the source needs, shared over the cycles the budget leaves.
            share = setup / max(1.0, budget / expected[k])
            rate = (others + expected[k]) / max(seconds[k] + share, SHORTEST)
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k, best_rate

    def _alone_rate(self) -> float | None:
        """Tokens per second of the target alone (None: not timed yet); in a batch, the
        batch's with this sequence drafting nothing."""
        if self.load is None:
            alone = self.profile.verify_by_n.get(1)
            if alone is None or not alone.warm:
                return None
            return 1.0 / max(alone.mean, SHORTEST)
        if not self.load.ready:
            return None
        self._others = self.load.others(self.slot, self.profile)
        return (self._others.tokens + 1.0) / max(self._cycle_seconds(0, 0.0, None)[0], SHORTEST)

    def _setup_seconds(self, candidate: Candidate) -> float:
        """In a batch, the seconds of the read a source needs before its first guess (every
        sequence waits for it), by the draft passes this batch timed, or at most a step a token
        before it timed any; 0 alone, where the read is the cost of the first cycle only."""
        if self.load is None or not candidate.setup:
            return 0.0
        read = self.load.draft_pass(candidate.setup)
        if read is not None:
            return read
        # No draft pass timed in this batch yet: at most a step of one token per token read (a
        # pass over m tokens costs no more than m over one). Priced as free, a fresh server's
        # full batch stalled for a read of dozens of tokens to look at three guesses.
        step = self.profile.guess(candidate.source)
        return candidate.setup * step if step is not None else 0.0

    def _cycle_seconds(
        self, limit: int, guess: float, measured: int | None, source: str | None = None
    ) -> list[float]:
        """Seconds of a cycle where this sequence drafts k = 0..``limit`` guesses of ``source``
        at ``guess`` seconds each (a pass no longer than ``measured`` where given), all but a
        first read's; in a batch, the batch's, the others as they were (``lookahead.batch``).
        Every K of a plan priced in one go: the curves are looked up once, not once a K."""
        load = self.load
        others = self._others if load is not None else Others()
        curve = self.profile.verify_curve()
        assert curve is not None, "a pass was timed, so every length has an estimate"
        # The draft model's steps as batched, where timed; heads draft one sequence after
        # another, a draft model's steps for all at once.
        model = limit if source == "model" else 0
        batched = load.draft_seconds_by_k(model, others.drafts) if load is not None else None
        host = load.host_seconds() if load is not None else 0.0
        out = []
        for k in range(limit + 1):
            n = others.verify_tokens + k + 1
            verify = curve.at(n if measured is None else min(n, measured))
            if batched is not None:
                mine = k if source == "model" else 0
                draft = batched[mine] + draft_cost(source, k - mine, guess)
            elif source in HEAD_SOURCES:
                draft = others.draft_seconds + draft_cost(source, k, guess)
            else:
                draft = max(draft_cost(source, k, guess), others.draft_seconds)
            out.append(draft + others.head_seconds + verify + host)
        return out

    def _source_prior(self, source: str) -> float:
        """The source's pooled rate over all its keys (n-gram matches of every length)."""
        kept = reached = 0.0
        for key, acceptance in self.acceptance.items():
            if self._source_of.get(key) == source:
                k, r = acceptance.pooled()
                kept, reached = kept + k, reached + r
        return (kept + FIRST_PRIOR) / (reached + 1.0)

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
        """Learn from one cycle: its costs, its acceptance, and in hindsight the acceptance of
        the free candidates not taken (the cycle's ``produced`` tokens are the target's own).
        With ``ngram_tail``, the last guesses came free from an n-gram match."""
        source = plan.candidate.source if plan.candidate else None
        paid = model_guesses(drafted, ngram_tail)
        if self.load is None:  # a batch's passes are timed by its scheduler
            self.profile.observe(source, drafted, draft_seconds, verify_seconds, paid)
        if plan.candidate is not None and paid:
            self._learn(plan.candidate, paid, min(accepted, paid))
        if ngram_tail is not None and accepted >= paid:  # the tail's guesses were judged
            self._learn(ngram_tail.candidate, ngram_tail.n, accepted - paid)
        for candidate in candidates:
            if candidate == plan.candidate or not candidate.preview or not produced:
                continue
            # A point-mass guess g is kept with probability p(g), the same chance that the
            # target's own token there is g: matching what was produced is a fair coin.
            judged = min(len(candidate.preview), len(produced))
            matched = 0
            while matched < judged and candidate.preview[matched] == produced[matched]:
                matched += 1
            self._learn(candidate, judged, matched)

    def _learn(self, candidate: Candidate, drafted: int, accepted: int) -> None:
        key = candidate.acceptance_key
        self._longest[key] = max(self._longest.get(key, 0), accepted)
        self.exploration.tried(key)
        self._source_of[key] = candidate.source
        # Made only where missing (``setdefault`` would build one every cycle).
        own = self.acceptance.get(key)
        if own is None:
            own = self.acceptance[key] = Acceptance()
        own.observe(drafted, accepted)
        typical = self.profile.typical.get(key)
        if typical is None:
            typical = self.profile.typical[key] = Acceptance(TYPICAL_MEMORY)
        typical.observe(drafted, accepted)
