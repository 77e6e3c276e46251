"""What the other sequences of a batch cost and give a cycle: how ``-k auto`` prices one
sequence's K by the whole batch.

Several sequences share one target pass per cycle (``specgen.engine.streams``): the pass over N
tokens in all costs V(N), the draft model's steps are batched too (a cycle drafts for as long as
its longest drafter), and every sequence's kept tokens come out of the same pass. So a
sequence's K is worth what it adds to the batch's tokens per second, given what the others do:

    rate(K) = (E_others + E(K)) / (D(n_1) + ... + D(n_max(K, K_others)) + V(N_others + K + 1))

E(K) is this sequence's expected tokens per cycle at K (``core.speculative``), E_others the
others' tokens per cycle lately, N_others the tokens they put in the pass, K_others the most
guesses any of them drafted; the draft model's step j decodes one token for each sequence still
drafting (n_j of them; the first step also reads each one's last kept guess, so it counts two),
and D is the draft context's pass by its tokens, measured in this batch as V is (a draft
model's step over four sequences costs several of one: on a CPU a small draft's batched step
can cost as much as the target's). Each sequence, choosing the K
that maximises this with the others held, raises the batch's rate (a coordinate ascent); where
the target's batched pass grows with every token (a CPU, several streams), guesses that are
not nearly sure to survive cost more than they give and K falls, to 0 for all where plain
batching wins. V is the pair's own verify curve (``costs.PairProfile.verify``): a pass over N
tokens costs about the same whichever sequences they belong to, so the costs a single stream
measured price a batch from its first cycle, and every batched pass adds to them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specgen.lookahead.costs import (
    COST_MEMORY,
    CostBook,
    Fit,
    PairProfile,
    Timing,
    fit_passes,
    on_fit,
)

# Tokens a sequence puts in a cycle's first draft step: the drawn token, and the last kept guess
# where every guess survived (then the draft never decoded it). Counted as two, the most.
FIRST_STEP_TOKENS = 2


@dataclass
class _Slot:
    """One sequence's last cycles: tokens kept, tokens in the pass, guesses it paid for."""

    greedy: bool
    tokens: Timing = field(default_factory=lambda: Timing(COST_MEMORY))
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
    _draft_fit: Fit | None = field(default=None, init=False, repr=False)

    def join(self, slot: int, greedy: bool) -> None:
        self.slots[slot] = _Slot(greedy)

    def leave(self, slot: int) -> None:
        self.slots.pop(slot, None)

    def report(
        self, slot: int, kept: int, verify_tokens: int, paid: int, source: str | None
    ) -> None:
        """One cycle of ``slot``: ``kept`` tokens from a pass of ``verify_tokens``, ``paid``
        guesses drafted (by ``source``, at a cost)."""
        found = self.slots.get(slot)
        if found is None:
            return
        found.tokens.add(float(kept))
        found.verify_tokens, found.paid, found.source = verify_tokens, paid, source

    def others(self, slot: int, profile: PairProfile) -> Others:
        """What the sequences other than ``slot`` give and cost a cycle, their guesses priced
        by ``profile``."""
        rest = [s for key, s in self.slots.items() if key != slot]
        if not rest:
            return Others()
        drafts = [s.paid * (profile.guess(s.source) or 0.0) for s in rest if s.source is not None]
        return Others(
            sum(s.tokens.mean if s.tokens.weight else 1.0 for s in rest),
            sum(s.verify_tokens for s in rest),
            max(drafts, default=0.0),
            tuple(s.paid for s in rest if s.source == "model" and s.paid),
        )

    def draft_seconds(self, k: int, others: tuple[int, ...]) -> float | None:
        """Seconds of a cycle's draft-model steps where this sequence drafts ``k`` guesses and
        the others ``others``: a step per guess of the longest, each over the sequences still
        drafting (None until a draft pass was timed here)."""
        if not self.draft_by_n:
            return None
        if self._draft_fit is None:
            points = {n: t.mean for n, t in self.draft_by_n.items() if t.weight}
            if not points:
                return None
            self._draft_fit = fit_passes(points, self.draft_by_n)
        seconds = 0.0
        for step in range(1, max(k, *others, 0) + 1):
            drafting = sum(1 for n in others if n >= step) + (1 if k >= step else 0)
            tokens = drafting * (FIRST_STEP_TOKENS if step == 1 else 1)
            seconds += on_fit(self._draft_fit, tokens)
        return seconds

    @property
    def ready(self) -> bool:
        """Whether batched passes were timed here: the first two run cold."""
        return self.target_passes >= 2

    def _profiles(self) -> list[PairProfile]:
        modes = {s.greedy for s in self.slots.values()}
        return [self.costs.of(greedy) for greedy in sorted(modes)]

    def observe_target(self, seconds: float, n_tokens: int) -> None:
        """A batched target pass over ``n_tokens`` took ``seconds``: a point of the verify
        curve of every mode in the batch."""
        self.target_passes += 1
        for profile in self._profiles():
            profile.observe_pass(n_tokens, seconds)

    def observe_draft(self, seconds: float, n_tokens: int, step: bool, source: str) -> None:
        """A batched draft pass over ``n_tokens`` took ``seconds``; a ``step`` (a guess for
        every sequence still drafting, not a prompt's or a catch-up's read) also times a guess
        of ``source``."""
        self._draft_fit = None
        self.draft_by_n.setdefault(n_tokens, Timing(COST_MEMORY)).add(seconds)
        if step:
            for profile in self._profiles():
                profile.observe_step(source, seconds)
