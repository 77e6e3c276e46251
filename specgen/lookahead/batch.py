"""What the other sequences of a batch cost and give a cycle: how ``-k auto`` prices one
sequence's K by the whole batch.

Several sequences share one target pass per cycle (``specgen.engine.streams``): the pass over N
tokens in all costs V(N), the draft model's steps are batched too (a cycle drafts for as long as
its longest drafter), and every sequence's kept tokens come out of the same pass. So a
sequence's K is worth what it adds to the batch's tokens per second, given what the others do:

    rate(K) = (E_others + E(K)) / (D(n_1) + ... + D(n_max(K, K_others)) + V(N_others + K + 1) + H)

E(K) is this sequence's expected tokens per cycle at K (``core.speculative``), E_others what
the others give a cycle as each goes now (one token where it goes plainly, what its cycles with
guesses kept where it guesses), N_others the tokens they put in the pass, K_others the most
guesses any of them drafts; "now" is the plan a sequence made in this cycle where it planned
before this one (``planned``), else its last cycle's; the draft model's step j decodes one
token for each sequence still drafting (n_j of them; the first step also reads each one's last
kept guess, so it counts two), D is the draft context's pass by its tokens, measured in this
batch as V is (a draft model's step over four sequences costs several of one: on a CPU a small
draft's batched step can cost as much as the target's), and H the host's seconds a cycle
outside the passes (the loop's work, a server's hand-offs), measured on this batch size's plain
cycles: every cycle pays it, so fewer, longer cycles pay it less often. Each sequence, choosing
the K that maximises this with the others held, raises the batch's rate (a coordinate ascent); where
the target's batched pass grows with every token (a CPU, several streams), guesses that are
not nearly sure to survive cost more than they give and K falls, to 0 for all where plain
batching wins. V is the pair's own verify curve (``costs.PairProfile.verify``): a pass over N
tokens costs about the same whichever sequences they belong to, so the costs a single stream
measured price a batch from its first cycle, and every batched pass adds to them.

The formula rests on estimates: a joining request's prompt in a pass, the host's own work for
a sequence's guesses are not in it. So the batch also measures itself: for each batch size,
its tokens per second over the cycles where any sequence guessed and over those where none did
(the wall time from one target pass's end to the next, less the draft's reads of prompts and of
what it missed: those are the price of starting to guess, which the formula weighs as a
candidate's ``setup``, not of guessing; counted in, every retry would measure a sequence's
catch-up, and lose). Where
guessing measured slower, no sequence guesses at that size, and the formula's choice runs again
for ``RETRY_FOR`` cycles once the batch has run plainly long enough that the last such run's
loss (its seconds and the draft's reads it needed, less what plain cycles would have taken for
its tokens) is ``RETRY_SHARE`` of the time: so a change (other texts, another load on the
machine) is seen, and retrying costs a bounded share of the batch's time however dear a run of
guesses is (a draft that must catch up on what it missed, a slow quantized draft). A retry
that loses again doubles the weight of its loss (up to ``RETRY_BACKOFF_MAX`` times), so a
batch size where guessing keeps losing spends a share that halves with each retry (a tenth of a
percent or so), not three per cent for good; one that wins starts the weight afresh. Cycles where
a source that costs (a draft model, a head) drafted are measured the same way against plain
cycles (not against prompt lookup's free guesses alone, which come where the text repeats and
would price the draft against runs it is not offered beside): where they measured slower, only
free guesses are made at that size (retried alike), and a draft's read must pay by that measure.
These rates are kept apart by mode (greedy guesses survive far more often than sampled ones)
and outlive the process (``PairProfile.batch_rates``, in the costs file): a server started
again begins each size and mode from the last verdict instead of paying again to learn it (on
a CPU a fresh server's first cycles of a draft model's guesses at each size cost several
percent of a short run). Where guessing lost, the verdict weighs one cycle and is retried as
the last process would have; where it won, it weighs the seconds of cycles behind it, as if
that process went on, since a new process's first few cycles with guesses (a long guess that
missed among them) would otherwise overturn it and leave the batch plain until a retry.

A batch that nothing will join (``closed``: the last prompts of a file) takes as long as its
longest sequence: there a sequence ahead of another plans no guesses while, going plainly, it
would still end no later than the one furthest behind at that one's pace (``on_critical_path``),
since its guesses would end nothing sooner; where the slowest's guesses survive, the ones ahead
keep guessing too, or they would become the slowest (they take turns otherwise). While
nothing waits to join a server's batch (``waves``), requests that arrived together (a burst:
parallel tool calls, a batch of requests, whose sender waits for all) end together alike.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from specgen.drafters.base import HEAD_SOURCES, draft_cost
from specgen.lookahead.costs import (
    COST_MEMORY,
    CostBook,
    Fit,
    PairProfile,
    Timing,
    Verdict,
    fit_passes,
    refit_due,
)

# Tokens a sequence puts in a cycle's first draft step: the drawn token, and the last kept guess
# where every guess survived (then the draft never decoded it). Counted as two, the most.
FIRST_STEP_TOKENS = 2
# A batch size's measured rates are trusted after this many cycles of each kind; guessing that
# measured slower is tried again for RETRY_FOR cycles once the plain cycles since its last run
# took 1 / RETRY_SHARE times what that run lost.
TRUST_AFTER, RETRY_FOR, RETRY_SHARE = 4, 4, 0.03
# A retry that loses again doubles how much its loss weighs, up to this many times.
RETRY_BACKOFF_MAX = 8.0
RATE_MEMORY = 0.95  # each cycle's weight in a measured rate falls by this much a cycle
# A batch size's host time a cycle (outside the target's pass and the draft's passes: the
# loop's work, a server's hand-offs) is the median of its last this many plain cycles, so
# that a compaction, a pause or the wait for a burst's next request is not a cycle's.
HOST_SAMPLES = 16
# Generations that arrive within this many seconds of each other are one wave (``waves``): a
# burst sent at once reaches a server over some milliseconds, and may be admitted over a pass.
WAVE_SECONDS = 0.5


@dataclass
class _Rate:
    """A forgetting ratio of tokens to seconds over cycles."""

    tokens: float = 0.0
    seconds: float = 0.0
    cycles: int = 0

    def add(self, tokens: float, seconds: float) -> None:
        self.tokens = RATE_MEMORY * self.tokens + tokens
        self.seconds = RATE_MEMORY * self.seconds + seconds
        self.cycles += 1

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class _Measured:
    """One batch size's cycles with a kind of guess (``guessed``: any guess, or a draft that
    costs) and without (``plain``), the last run of cycles with it, and the seconds of the
    cycles without it since."""

    guessed: _Rate = field(default_factory=_Rate)
    plain: _Rate = field(default_factory=_Rate)
    run_tokens: float = 0.0  # of the last run of cycles with guesses
    run_seconds: float = 0.0
    waited: float = 0.0  # seconds of plain cycles since that run
    retry_left: int = 0
    # How many times its loss the last run weighs: doubled by each retry that lost again.
    weight: float = 1.0
    retried: bool = False  # a retry ran since guessing was last judged

    def add(self, guessed: bool, tokens: float, seconds: float, read: float = 0.0) -> None:
        """A cycle with the kind of guess or without; ``read``: seconds of the draft's reads
        before it, left out of the rates (the price of starting, not of guessing) but counted
        in what a run of such cycles lost, so that retries pay for their reads too."""
        if guessed:
            if self.waited:  # a new run
                self.run_tokens = self.run_seconds = self.waited = 0.0
            self.guessed.add(tokens, seconds)
            self.run_tokens += tokens
            self.run_seconds += seconds + read
            self.retry_left = max(0, self.retry_left - 1)
        else:
            self.plain.add(tokens, seconds)
            self.waited += seconds

    def lost(self, plain: float) -> float:
        """Seconds the last run of cycles with guesses took past what plain cycles at
        ``plain`` tokens per second would have taken for its tokens, times its ``weight``."""
        return self.weight * (self.run_seconds - self.run_tokens / plain) if plain > 0 else 0.0

    @property
    def trusted(self) -> bool:
        """Whether both kinds of cycle were measured often enough to trust."""
        return min(self.guessed.cycles, self.plain.cycles) >= TRUST_AFTER

    def verdict(self) -> Verdict | None:
        """What a later process starts from (``remembered``): tokens a second with the kind of
        guess and without it, the seconds its last run lost as weighed, and the weight (None:
        not trusted yet)."""
        if not self.trusted:
            return None
        plain = self.plain.rate
        return self.guessed.rate, plain, max(0.0, self.lost(plain)), self.weight

    @classmethod
    def remembered(cls, verdict: Verdict, size: int, evidence: float = 0.0) -> _Measured:
        """Rates an earlier process measured at a batch of ``size``, trusted at once but
        weighing one cycle each (of a token a sequence), so that this process's own soon
        outweigh them; a retry of a kind that lost waits as one after that last run would, and
        one that loses again waits as long again as that process's next would have. Where the
        kind of guess won, its rate weighs the ``evidence`` behind it (the seconds of its
        cycles, as forgotten), as if that process went on: a batch that guesses goes on
        measuring its guesses, and its first few cycles, a long guess that missed among them,
        would otherwise overturn what dozens measured and leave it plain until a retry.
        Where it lost, a retry judges it again, as soon as the last process's would have."""
        with_it, without, lost, weight = verdict
        measured = cls(run_seconds=lost / weight, weight=weight)
        for rate, into in ((with_it, measured.guessed), (without, measured.plain)):
            seconds = size / max(rate, 1e-9)
            if into is measured.guessed and with_it >= without:
                seconds = max(seconds, evidence)
            into.tokens, into.seconds, into.cycles = rate * seconds, seconds, TRUST_AFTER
        return measured


@dataclass
class _Cycle:
    """The cycle a target pass closed: its seconds (the draft passes before it too), the
    sequences in the batch, and what their reports add after it."""

    seconds: float
    size: int
    mode: bool | None  # the sequences' (greedy or sampled; None: both)
    tokens: float = 0.0
    guessed: bool = False
    drafted: bool = False  # a source that costs (a draft model, a head) guessed in it
    read: float = 0.0  # seconds of the draft's reads before it (not in ``seconds``)


@dataclass
class _Slot:
    """One sequence's last cycles: tokens kept, tokens in the pass, guesses it paid for."""

    greedy: bool
    tokens: Timing = field(default_factory=lambda: Timing(COST_MEMORY))
    # Kept in its cycles with guesses: what it gives a cycle where it guesses (a plain cycle
    # gives one), whatever share of its cycles guessed lately.
    guessed_tokens: Timing = field(default_factory=lambda: Timing(COST_MEMORY))
    verify_tokens: int = 1
    paid: int = 0
    source: str | None = None  # of the paid guesses


@dataclass(frozen=True)
class Others:
    """What the other sequences of the batch give and put in a cycle."""

    tokens: float = 0.0  # kept per cycle
    verify_tokens: int = 0  # in the target's pass
    draft_seconds: float = 0.0  # the longest of their drafts, at one sequence's step cost
    drafts: tuple[int, ...] = ()  # the draft model's guesses of each one that drafted with it
    head_seconds: float = 0.0  # their heads' drafts, one after another (``HEAD_SOURCES``)


@dataclass
class BatchLoad:
    """The sequences of one batch, as ``-k auto`` prices them; the engine reports each
    sequence's cycles and the scheduler each pass's time (``observe_target``, ``observe_draft``).
    """

    costs: CostBook
    slots: dict[int, _Slot] = field(default_factory=dict)
    target_passes: int = 0
    # The draft context's passes, seconds by tokens in them (every sequence's, batched).
    draft_by_n: dict[int, Timing] = field(default_factory=dict)
    # By batch size and mode (greedy or sampled; None: both in the batch): guesses survive far
    # more often greedy. Each starts from what an earlier process measured of that mode
    # (``PairProfile.batch_rates``) and leaves it what this one measures.
    measured: dict[tuple[int, bool | None], _Measured] = field(default_factory=dict)
    # Alike: cycles where a source that costs drafted, against the others (plain, or free
    # guesses alone).
    drafting: dict[tuple[int, bool | None], _Measured] = field(default_factory=dict)
    draft_steps: int = 0  # the draft model's steps timed here
    _draft_fit: Fit | None = field(default=None, init=False, repr=False)
    _draft_passes_since_fit: int = field(default=0, init=False, repr=False)
    _drafting: float = field(default=0.0, init=False, repr=False)  # draft steps this cycle
    _reading: float = field(default=0.0, init=False, repr=False)  # draft reads this cycle
    _last_end: float | None = field(default=None, init=False, repr=False)  # of a target pass
    # By batch size: the host's seconds of its last plain cycles, and their median.
    _host: dict[int, deque[float]] = field(default_factory=dict, init=False, repr=False)
    _host_median: dict[int, float] = field(default_factory=dict, init=False, repr=False)
    # The last pass's cycle's (size, host seconds), kept once its sequences' reports show that
    # none guessed in it: what every cycle pays, guessing or not (a cycle with guesses adds
    # its own host work, and a head's decodes, untimed here; the measured rates weigh those).
    _pending_host: tuple[int, float] | None = field(default=None, init=False, repr=False)
    _cycle: _Cycle | None = field(default=None, init=False, repr=False)
    _leaving: set[int] = field(default_factory=set, init=False, repr=False)
    # The sequence timing a source's guesses this cycle (``claim_timing``).
    _timing: int | None = field(default=None, init=False, repr=False)
    # No generation will join this batch (a file's, ``generate_many``'s last prompt started):
    # then it ends with its last sequence, and a sequence ahead of that one gains nothing by
    # guessing (``on_critical_path``).
    closed: bool = False
    # None waits to join (a server's queue is empty): the sequences that arrived together (within
    # WAVE_SECONDS of each other: parallel tool calls, a burst of requests) end together, as a
    # closed batch's do.
    waves: bool = False
    _left: dict[int, int | None] = field(default_factory=dict, init=False, repr=False)
    _arrived: dict[int, float] = field(default_factory=dict, init=False, repr=False)

    def join(self, slot: int, greedy: bool) -> None:
        if self._leaving and slot not in self._leaving:  # it takes a leaver's place
            self.slots.pop(self._leaving.pop(), None)
        self._leaving.discard(slot)
        self.slots[slot] = _Slot(greedy)

    def leave(self, slot: int) -> None:
        """``slot`` ended. It is counted until the next target pass: a request that takes its
        place before then (the next of a file, a waiting one) keeps the batch's size to the
        others' plans, which would otherwise price a cycle or two as a smaller batch (and a
        draft's first read of its prompt for it)."""
        if slot in self.slots:
            self._leaving.add(slot)
        self._left.pop(slot, None)

    def note_left(self, slot: int, left: int | None) -> None:
        """``slot`` has at most ``left`` tokens to go by its ``max_tokens`` (None: the context
        bounds it instead, and nothing says when it ends). The engine says so every cycle."""
        self._left[slot] = left

    def arrive(self, slot: int, at: float) -> None:
        """``slot``'s next generation arrived at ``at`` (seconds on the pair's clock: a server's
        request when it was received, a batch's prompt when it started)."""
        self._arrived[slot] = at

    def on_critical_path(self, slot: int) -> bool:
        """Whether ``slot`` may be the one that ends its batch, or its wave: always in an open
        batch, where a sequence that ends sooner frees its place for the next. In a closed
        one, the one that has most tokens left (by ``note_left``; any not bounded by its
        ``max_tokens``: every one), and one ahead of it that, at a token a cycle, would end
        after it at its pace (its tokens a cycle lately); with ``waves``, among those that
        arrived with it. A closed batch (a wave, whose sender waits for all of it) takes as
        long as its longest sequence, so guesses elsewhere end nothing sooner and only
        lengthen the passes (and the draft's steps) every sequence shares: there the one ahead
        runs plainly until the others catch up, and they end together. Ahead by less than the
        slowest's pace makes up, it guesses on: holding every one but the slowest back would
        have them take turns, each guessing a cycle in N, slower than all guessing."""
        mine = self._left.get(slot)
        if mine is None or not (self.closed or self.waves):
            return True
        others = [
            (s, n)
            for s, n in self._left.items()
            if s != slot and (self.closed or self._together(s, slot))
        ]
        if any(n is None for _, n in others):
            return True
        most = max((n for _, n in others if n is not None), default=0)
        if mine >= most:
            return True
        # Ahead, it waits only where it ends no later going plain (a token a cycle) than the
        # slowest at that one's pace lately: guesses that survive keep all of them guessing.
        pace = max(self._pace(s) for s, n in others if n == most)
        return mine * pace > most

    def _pace(self, slot: int) -> float:
        """Tokens ``slot`` kept a cycle lately (1 until it reported)."""
        found = self.slots.get(slot)
        return max(1.0, found.tokens.mean) if found is not None and found.tokens.weight else 1.0

    def _together(self, one: int, other: int) -> bool:
        """Whether two slots' generations arrived together (one wave)."""
        a, b = self._arrived.get(one), self._arrived.get(other)
        return a is not None and b is not None and abs(a - b) <= WAVE_SECONDS

    def report(
        self, slot: int, kept: int, verify_tokens: int, paid: int, source: str | None
    ) -> None:
        """One cycle of ``slot``: ``kept`` tokens from a pass of ``verify_tokens``, ``paid``
        guesses drafted (by ``source``, at a cost)."""
        found = self.slots.get(slot)
        if found is None:
            return
        if self._cycle is not None:
            self._cycle.tokens += kept
            self._cycle.guessed |= verify_tokens > 1
            self._cycle.drafted |= paid > 0 and (source == "model" or source in HEAD_SOURCES)
        if verify_tokens > 1:  # a cycle with guesses: its host time is not every cycle's
            self._pending_host = None
        found.tokens.add(float(kept))
        if verify_tokens > 1:
            found.guessed_tokens.add(float(kept))
        found.verify_tokens, found.paid, found.source = verify_tokens, paid, source

    def planned(self, slot: int, lookahead: int, source: str | None) -> None:
        """``slot`` plans ``lookahead`` guesses of ``source`` this cycle: the sequences that plan
        after it in the cycle price theirs with this plan, not its last cycle's (a sequence
        whose guesses ride on the draft steps another pays for sees them paid), so the batch
        does not swing between cycles where one drafts and cycles where the other does."""
        found = self.slots.get(slot)
        if found is None:
            return
        costs = source == "model" or source in HEAD_SOURCES
        found.verify_tokens = lookahead + 1
        found.paid, found.source = (lookahead, source) if costs and lookahead else (0, None)

    def others(self, slot: int, profile: PairProfile) -> Others:
        """What the sequences other than ``slot`` give and cost a cycle, their guesses priced
        by ``profile``."""
        rest = [s for key, s in self.slots.items() if key != slot]
        if not rest:
            return Others()
        drafts = [
            draft_cost(s.source, s.paid, profile.guess(s.source) or 0.0)
            for s in rest
            if s.source is not None and s.source not in HEAD_SOURCES
        ]
        heads = sum(
            draft_cost(s.source, s.paid, profile.guess(s.source) or 0.0)
            for s in rest
            if s.source in HEAD_SOURCES
        )
        return Others(
            sum(_gives(s) for s in rest),
            sum(s.verify_tokens for s in rest),
            max(drafts, default=0.0),
            tuple(s.paid for s in rest if s.source == "model" and s.paid),
            heads,
        )

    def draft_pass(self, n_tokens: int) -> float | None:
        """Seconds of a draft pass over ``n_tokens`` (None until one was timed here)."""
        fit = self._fitted_draft()
        return None if fit is None else fit.at(n_tokens)

    def _fitted_draft(self) -> Fit | None:
        if self._draft_fit is None or refit_due(self._draft_passes_since_fit, len(self.draft_by_n)):
            points = {n: t.mean for n, t in self.draft_by_n.items() if t.weight}
            if points:
                self._draft_fit = fit_passes(points, self.draft_by_n)
                self._draft_passes_since_fit = 0
        return self._draft_fit

    def draft_seconds_by_k(self, limit: int, others: tuple[int, ...]) -> list[float] | None:
        """Seconds of a cycle's draft-model steps where this sequence drafts k guesses and the
        others ``others``, for every k from 0 to ``limit`` (a plan prices them all): a step per
        guess of the longest, each over the sequences still drafting, each step's pass priced
        once with this sequence's guess in it and once without (None until a draft pass was
        timed here)."""
        fit = self._fitted_draft()
        if fit is None:
            return None
        longest = max(others, default=0)
        with_mine, without = [], []  # step s + 1's pass
        for step in range(1, max(limit, longest) + 1):
            drafting = sum(1 for n in others if n >= step)
            width = FIRST_STEP_TOKENS if step == 1 else 1
            if step <= limit:
                with_mine.append(fit.at((drafting + 1) * width))
            without.append(fit.at(drafting * width) if drafting else 0.0)
        # This sequence's k guesses put it in the first k steps; the others' run to the
        # longest of theirs.
        tail = [0.0] * (max(limit, longest) + 1)
        for step in range(longest - 1, -1, -1):
            tail[step] = tail[step + 1] + without[step]
        by_k, mine = [], 0.0
        for k in range(limit + 1):
            by_k.append(mine + tail[k])
            if k < limit:
                mine += with_mine[k]
        return by_k

    @property
    def ready(self) -> bool:
        """Whether batched passes were timed here: the first two run cold."""
        return self.target_passes >= 2

    def plain_rate(self) -> float:
        """Tokens per second of the batch with none guessing, from the target's pass over one
        token a sequence (0: not timed)."""
        n = len(self.slots)
        passes = [p.verify(n) for p in self._profiles()]
        seconds = max((s for s in passes if s is not None), default=None)
        return n / (seconds + self.host_seconds()) if seconds else 0.0

    def host_seconds(self) -> float:
        """The host's seconds a cycle at the batch's size now, outside the target's and the
        draft's passes (the loop's work, a server's hand-offs): a cost of every cycle, which
        fewer, longer cycles pay less often. From this size's last plain cycles (one with
        guesses adds its own host work, which the measured rates weigh); 0 until one was
        timed."""
        return self._host_median.get(len(self.slots), 0.0)

    def _modes(self) -> set[bool]:
        return {s.greedy for s in self.slots.values()}

    def _profiles(self) -> list[PairProfile]:
        return [self.costs.of(greedy) for greedy in sorted(self._modes())]

    def _mode(self) -> bool | None:
        """Whether the batch's sequences decode greedily (None: some do, some sample)."""
        modes = self._modes()
        return modes.pop() if len(modes) == 1 else None

    def _measured(self, kind: str, size: int, mode: bool | None) -> _Measured:
        """The rates of ``kind`` ("guessing" or "drafting") at a batch of ``size`` in ``mode``:
        from what an earlier process kept of that mode where this one has measured none."""
        table = self.measured if kind == "guessing" else self.drafting
        found = table.get((size, mode))
        if found is None:
            found = _Measured()
            if mode is not None:
                profile = self.costs.of(mode)
                verdict = profile.batch_rates.get(kind, {}).get(size)
                if verdict is not None:
                    evidence = profile.batch_evidence.get(kind, {}).get(size, 0.0)
                    found = _Measured.remembered(verdict, size, evidence)
            table[size, mode] = found
        return found

    def observe_target(
        self, seconds: float, n_tokens: int, verifies: bool = True, ended: float | None = None
    ) -> None:
        """A batched target pass over ``n_tokens`` took ``seconds``: a point of the verify
        curve of every mode in the batch. ``verifies``: every sequence in it verified guesses
        (or took its next token); a pass that also read a prompt is no cycle to measure.
        ``ended``: the clock when it ended. Then the cycle is the time since the last target
        pass ended (the host's time in it too), else its draft steps and this pass; either way
        without the draft's reads (a prompt's, a catch-up's), which are what starting to guess
        costs, not what guessing does, and which the formula prices (``Candidate.setup``)."""
        self.target_passes += 1
        for slot in self._leaving:  # they ended before this pass
            self.slots.pop(slot, None)
        self._leaving.clear()
        for profile in self._profiles():
            profile.observe_pass(n_tokens, seconds)
        self._close_cycle()
        self._keep_host()
        wall = None  # since the last target pass ended, less the draft's reads
        if ended is not None and self._last_end is not None:
            wall = ended - self._last_end - self._reading
        if verifies and wall is not None:
            host = wall - self._drafting - seconds
            self._pending_host = (len(self.slots), max(0.0, host))
        if verifies and len(self.slots) > 1:
            cycle = max(seconds, wall) if wall is not None else self._drafting + seconds
            self._cycle = _Cycle(cycle, len(self.slots), self._mode(), read=self._reading)
        self._drafting = self._reading = 0.0
        self._last_end = ended
        self._timing = None

    def _keep_host(self) -> None:
        pending, self._pending_host = self._pending_host, None
        if pending is not None:
            size, host = pending
            samples = self._host.setdefault(size, deque(maxlen=HOST_SAMPLES))
            samples.append(host)
            self._host_median[size] = statistics.median(samples)

    def _close_cycle(self) -> None:
        cycle, self._cycle = self._cycle, None
        if cycle is None or not cycle.tokens:
            return
        for kind, with_it in (("guessing", cycle.guessed), ("drafting", cycle.drafted)):
            measured = self._measured(kind, cycle.size, cycle.mode)
            if kind == "drafting" and cycle.guessed and not with_it:
                # Free guesses alone: what a draft model would have given is not what prompt
                # lookup gave where the text repeats. Its time counts towards a retry.
                measured.waited += cycle.seconds
                continue
            measured.add(with_it, cycle.tokens, cycle.seconds, cycle.read)
            verdict = measured.verdict()
            if verdict is not None and cycle.mode is not None:  # for the next process
                profile = self.costs.of(cycle.mode)
                profile.batch_rates.setdefault(kind, {})[cycle.size] = verdict
                evidence = profile.batch_evidence.setdefault(kind, {})
                evidence[cycle.size] = measured.guessed.seconds

    def guessing_loses(self) -> bool:
        """Whether, at the batch's size now, cycles with guesses measured fewer tokens per
        second than cycles without (then none guesses, but for a retry now and then)."""
        # Without guesses, before that was measured (a batch that guessed from its first
        # cycles): as the target's measured pass over one token a sequence gives it.
        return _loses(self._measured("guessing", len(self.slots), self._mode()), self.plain_rate)

    def drafting_loses(self) -> bool:
        """Whether, at the batch's size now, cycles where a source that costs (a draft model,
        a head) drafted measured fewer tokens per second than plain cycles (those with free
        guesses alone are left out): then none drafts with one, but for a retry now and then, as
        ``guessing_loses``. On a CPU a draft model's batched step can cost as much as the
        target's pass, while prompt lookup's guesses cost nothing."""
        return _loses(self._measured("drafting", len(self.slots), self._mode()), None)

    def read_pays(self, setup: int, budget: int) -> bool:
        """Whether a draft's read of ``setup`` tokens before its first guess (every sequence
        waits for it) pays for a sequence with ``budget`` tokens left, by what this batch size
        measured of cycles where a draft drafted against cycles where none did: its remaining
        tokens come out at 1/N of the batch's rate, so drafting saves the batch
        ``budget * N * (1/without - 1/drafted)`` seconds. True until both rates are trusted
        (the formula's price of the read decides alone)."""
        measured = self._measured("drafting", len(self.slots), self._mode())
        if not measured.trusted:
            return True
        if measured.retry_left:  # a retry of drafting reads what it must
            return True
        read = self.draft_pass(setup)
        if read is None:
            return True
        without, drafted = measured.plain.rate, measured.guessed.rate
        if without <= 0 or drafted <= without:
            return False
        return budget * len(self.slots) * (1 / without - 1 / drafted) > read

    def observe_draft(
        self, seconds: float, n_tokens: int, step: bool, source: str, sequences: int
    ) -> None:
        """A batched draft pass over ``n_tokens`` of ``sequences`` took ``seconds``; a ``step``
        (a guess for every sequence still drafting, not a prompt's or a catch-up's read) of
        one sequence also times a guess of ``source`` (the profile's cost of one guess, which
        a single stream and the next process price with: a step for several costs more)."""
        self._draft_passes_since_fit += 1  # made again when next asked (``refit_due``)
        self.draft_by_n.setdefault(n_tokens, Timing(COST_MEMORY)).add(seconds)
        if not step:  # a pass with a read in it: what the others' steps in it cost is let go too
            self._reading += seconds
            return
        self._drafting += seconds
        self.draft_steps += 1
        if sequences == 1:
            for profile in self._profiles():
                profile.observe_step(source, seconds)

    def claim_timing(self, slot: int) -> bool:
        """Whether ``slot`` may time a source's guesses this cycle: one sequence a cycle does,
        the first that asks. A guess's cost is the pair's, not a text's, so one sequence's
        steps time it for all; every sequence of a fresh batch timing at once has the draft
        read all their prompts (or catch up on all their texts) in one pass, on a CPU the cost
        of several of the target's."""
        if self._timing is None:
            self._timing = slot
        return self._timing == slot

    def draft_timed(self) -> bool:
        """Whether this batch timed the draft model's steps (twice: the first runs cold), so
        that its guesses are priced by the batched steps (``draft_seconds_by_k``) without a single
        sequence's guess ever timed."""
        return self.draft_steps >= 2


def _gives(slot: _Slot) -> float:
    """Tokens ``slot`` gives a cycle as it goes now: one plain, else what its cycles with
    guesses kept (its mean over all cycles would price a sequence that just stopped guessing
    by the cycles it guessed, and the batch would swing: the one that looks alone at such a
    batch sees no cost in the other's guesses that its tokens came from, and stops too)."""
    if slot.verify_tokens <= 1:
        return 1.0
    timing = slot.guessed_tokens if slot.guessed_tokens.weight else slot.tokens
    return timing.mean if timing.weight else 1.0


def _loses(measured: _Measured, before: Callable[[], float] | None) -> bool:
    """Whether the cycles ``measured`` with a kind of guess ran fewer tokens per second than
    the cycles without it (``before``: their rate until those are trusted; None: not known
    then), and no retry is due: a retry runs RETRY_FOR cycles once the cycles without it since
    the last run took 1 / RETRY_SHARE times what that run lost (weighed: ``_Measured.weight``)."""
    if measured.retry_left:
        return False
    if measured.guessed.cycles < TRUST_AFTER:
        return False
    if measured.plain.cycles >= TRUST_AFTER:
        without = measured.plain.rate
    elif before is not None:
        without = before()
    else:
        return False
    if measured.guessed.rate >= without:
        measured.weight, measured.retried = 1.0, False
        return False
    if measured.retried:  # the retry lost again: the next waits longer
        measured.weight = min(2.0 * measured.weight, RETRY_BACKOFF_MAX)
        measured.retried = False
    if measured.waited * RETRY_SHARE >= measured.lost(without):
        measured.retry_left, measured.retried = RETRY_FOR, True
        return False
    return True
