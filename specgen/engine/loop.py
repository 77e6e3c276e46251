"""The speculative loop: ask a drafter for guesses, verify them in one target pass, keep the rest.

It drives any object with the ``Model`` shape, so tests run it on fakes as well as on llama.cpp
models from ``specgen.backend``, and does no I/O.

The prompt's own target pass gives the first token, before the drafter reads the prompt (time to
first token is the target's alone). Cache invariant, at the start of every cycle: the target's
KV cache holds every token except the last one (``last``). The target decodes
``[last, x_1..x_K]`` in ONE batch with logits on all K+1 rows, keeps the guesses that survive the
accept rule, and is cut back to the accepted prefix; the drafter is told how many survived and
rolls its own state back. Each cycle runs four named steps (``_Generation``): the guesses, the
verify pass, the book-keeping, the text.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field

import numpy as np

from specgen.core.constraint import Constraint, shaped
from specgen.core.coupling import Draws, Keyed, Picking, draw
from specgen.core.lookahead import DEFAULT_LOOKAHEAD, Lookahead, effective_lookahead
from specgen.core.penalties import Penalties, penalties_of
from specgen.core.sampling import (
    Dist,
    Row,
    SamplingParams,
    Uniforms,
    best,
    row_top_k,
    warp,
)
from specgen.core.speculative import Verdict
from specgen.drafters import (
    Candidate,
    Drafter,
    Model,
    Plan,
    Proposal,
    model_guesses,
    reuse_prefix_cache,
)
from specgen.engine.emit import Emitter
from specgen.engine.events import (
    CycleDone,
    Event,
    Finished,
    GenerationConfig,
    TextChunk,
    TokenLogprob,
    token_logprob,
)
from specgen.engine.verify import cut_invalid, verdict_on, whole_row
from specgen.errors import PromptTooLong
from specgen.lookahead import BatchLoad, CostBook, LookaheadPolicy, PairProfile, policy_for
from specgen.stats import Clock, Stats, StopReason
from specgen.structured.grammar import LogitBias


class SpeculativeEngine:
    """Generates with a target model, sped up by a drafter's guesses when one is given.

    Args:
        target: the model whose output this is.
        drafter: who guesses (None: the target alone).
        lookahead: K for every generation that does not ask for another (the loaded pair's).
        costs: what ``-k auto`` measures (seconds per guess, the verify pass by length), facts
            of the machine, the models and the mode (greedy or sampled). The engine keeps them
            from one generation to the next; a caller that keeps them between processes passes
            them in (``specgen.session.pair``).
        clock: times the cycles (a test passes a fake clock that its fake models advance).
        busy: seconds spent in the models' decodes so far (``backend.decode_seconds``): a
            cycle's time less what it spent there is the loop's own host work.
        load: where the engine generates as sequence ``slot`` of a batch (``engine.streams``),
            what the batch's other sequences cost and give, so ``-k auto`` prices K by the
            whole batch (``lookahead.batch``).

    The random generator comes from each generation's seed (``Stats.seed``).
    """

    def __init__(
        self,
        target: Model,
        drafter: Drafter | None = None,
        *,
        lookahead: Lookahead = DEFAULT_LOOKAHEAD,
        costs: CostBook | None = None,
        clock: Clock = time.perf_counter,
        busy: Clock | None = None,
        load: BatchLoad | None = None,
        slot: int = 0,
    ) -> None:
        self.target = target
        self.drafter = drafter
        self.lookahead = lookahead
        self.costs = costs if costs is not None else CostBook()
        self.clock = clock
        self.busy = busy
        self.load, self.slot = load, slot
        # What the target's cache holds between generations (for ``reuse_prefix``): the last
        # context, trusted only when that generation stopped between two cycles.
        self._context: list[int] = []
        self._clean = False

    @property
    def held(self) -> list[int]:
        """The tokens the caches hold from the last generation, where known ([] otherwise):
        what a next generation that shares their start may keep (``reuse_prefix``)."""
        return list(self._context) if self._clean else []

    def lookahead_for(self, config: GenerationConfig) -> Lookahead:
        """The K a generation runs at: the config's, else the engine's; 0 where nothing drafts."""
        asked = self.lookahead if config.lookahead is None else config.lookahead
        return effective_lookahead(asked, self.drafter is not None)

    def new_stats(self, config: GenerationConfig) -> Stats:
        """The statistics of one generation with ``config``, before it starts (a live view
        watches them): its K, its seed (drawn here where the config has none), the clock."""
        seed = config.seed if config.seed is not None else _random_seed()
        return Stats(
            lookahead=self.lookahead_for(config),
            seed=seed,
            speculative=self.drafter is not None,
            clock=self.clock,
            coupling=config.rule(),
        )

    def generate(
        self,
        prompt: Sequence[int],
        config: GenerationConfig,
        stats: Stats | None = None,
        reuse_prefix: bool = False,
    ) -> Generator[Event, None, None]:
        """Yield text as it is accepted, a ``CycleDone`` per cycle, then ``Finished``.

        ``stats``: this engine's ``new_stats(config)``, to watch the counters live (the view
        does). A run starts from empty caches, so results never depend on an earlier run, unless
        ``reuse_prefix``: then the part of the prompt that the last generation's text shares (a
        chat that goes on) is kept in the caches instead of decoded again
        (``Stats.n_prompt_cached``).
        """
        assert len(prompt) > 0, "the prompt must hold at least one token"
        run = _Generation(self, prompt, config, stats or self.new_stats(config))
        load = self.load
        if load is not None:
            load.join(self.slot, config.sampling.greedy)
        try:
            yield from run.prompt_pass(reuse_prefix)
            if self.drafter is not None:
                self.drafter.begin(run.tokens, reuse_prefix)
            while run.emit.reason is None:
                if self.target.n_past + 1 > self.target.n_ctx:
                    run.emit.reason = "context_full"
                    break
                yield from run.cycle()
            yield run.finish(run.emit.reason)
        finally:
            if load is not None:  # ended, failed or abandoned: no longer in the batch
                load.leave(self.slot)


@dataclass
class _Guesses:
    """Step 2's result: what was guessed this cycle, and from where."""

    plan: Plan
    proposal: Proposal
    candidates: list[Candidate] = field(default_factory=list)
    forced: bool = False  # the grammar's forced tokens, not the policy's choice
    asked: bool = False  # the drafter made guesses (and may hold them in its cache)


class _Generation:
    """One generation's state (the tokens, the policy, the grammar, the random generator, the
    statistics) and its steps: the prompt's pass, then cycles of guesses, verify, book-keeping."""

    def __init__(
        self,
        engine: SpeculativeEngine,
        prompt: Sequence[int],
        config: GenerationConfig,
        stats: Stats,
    ) -> None:
        self.engine, self.config, self.stats = engine, config, stats
        self.target, self.drafter = engine.target, engine.drafter
        self.sampling: SamplingParams = config.sampling
        self.clock = engine.clock
        self.lookahead = stats.lookahead
        self.profile: PairProfile = engine.costs.of(self.sampling.greedy)
        self.policy: LookaheadPolicy = policy_for(
            self.lookahead,
            self.drafter is not None,
            self.profile,
            self.target.rollback_window,
            engine.load,
            engine.slot,
        )
        self.rng = Uniforms(np.random.default_rng(stats.seed))
        self.keyed = stats.coupling == "gumbel"  # tokens keyed on (seed, position)
        self.emit = Emitter(self.target, config)
        self.tokens = list(prompt)
        self.n_prompt = len(prompt)
        self.constraint: Constraint | None = (
            self.target.constrain(config.grammar) if config.grammar is not None else None
        )
        bias = config.logit_bias
        self.bias: LogitBias | None = bias if bias is not None and bias.ids else None
        self.penalties: Penalties | None = penalties_of(config.penalties)
        if self.drafter is not None:
            self.drafter.constrain(self.constraint, self.bias, self.penalties)
        # Rows whole where something reads the whole vocabulary, else their top-k (on the
        # backend where the model can). Under the Gumbel-max rule p is the host's warp of
        # either (a seed writes the same tokens whichever way rows are read); under the
        # min(1, p/q) rule the backend warps too, as a draft's q is warped (``TopK.warped``):
        # the same distribution up to float rounding, and no row warped on the host.
        whole = (
            self.constraint is not None
            or self.bias is not None
            or self.penalties is not None
            or config.logprobs is not None
        )
        stats.row_top_k = self.target.sample_top_k(
            row_top_k(self.sampling, whole, self.target.rows_on_device),
            None if self.keyed or whole else self.sampling,
        )
        if engine.busy is not None:
            stats.host_seconds = 0.0

    def draws(self) -> Draws:
        """What the next pass draws its tokens with: the noise keyed on (seed, position) from
        the index, in the generated text, of the token it gives; or the random generator."""
        if self.keyed:
            return Keyed(self.stats.seed, len(self.tokens) - self.n_prompt)
        return self.rng

    def picking(self, draws: Draws) -> Picking | None:
        """How a verify pass's rows may be picked with the other sequences' of its pass
        (``PickedRows``): under the Gumbel-max rule, where nothing but the warp shapes a row."""
        plain = self.constraint is None and self.bias is None and self.penalties is None
        if isinstance(draws, Keyed) and plain:
            return Picking(self.sampling, draws.seed, draws.position)
        return None

    # -- 1. the prompt ---------------------------------------------------------------------
    def prompt_pass(self, reuse_prefix: bool) -> Generator[Event, None, None]:
        """One target pass over all of the prompt gives the first token at once; a draft model
        reads it only once asked for guesses (time to first token is the target's)."""
        engine, target, stats, clock = self.engine, self.target, self.stats, self.clock
        started = clock()
        if len(self.tokens) > target.n_ctx:
            raise PromptTooLong(
                f"the prompt ({len(self.tokens)} tokens) does not fit the context "
                f"({target.n_ctx} tokens); raise --ctx-size"
            )
        held = engine._context[: target.n_past] if reuse_prefix and engine._clean else []
        engine._context, engine._clean = self.tokens, False
        stats.n_prompt_cached, rows = reuse_prefix_cache(target, held, self.tokens, 1)
        row = shaped(rows[0], self.bias, self.constraint, self.penalties, self.tokens)
        if self.sampling.greedy:
            first = best(row)
        else:
            first = draw(warp(row, self.sampling, self.constraint is not None), self.draws())
        if self.constraint is not None:
            self.constraint.consume(first)
        top = self.config.logprobs
        logprobs = () if top is None else (token_logprob(whole_row(row), first, top, target.piece),)
        self.tokens.append(first)
        engine._clean = True  # the cache holds every token of the context but the last
        self.policy.begin()
        stats.n_prompt = self.n_prompt
        stats.prompt_seconds = clock() - started
        stats.gen_started = clock()
        yield CycleDone(0, 0, (first,), logprobs)
        text = self.emit.tokens([first], stats)
        if text:
            yield TextChunk(text)

    # -- a cycle ---------------------------------------------------------------------------
    def cycle(self) -> Generator[Event, None, None]:
        """Guesses, one verify pass, the book-keeping, then the new tokens' text."""
        clock, busy = self.clock, self.engine.busy
        t0 = clock()
        busy_at_start = busy() if busy is not None else 0.0
        guessed = self.guesses()
        t1 = clock()
        verdict, logprobs = self.verify(guessed)
        t2 = clock()
        new = self.book(guessed, verdict, t1 - t0, t2 - t1)
        text = self.emit.tokens(new, self.stats)
        if busy is not None and self.stats.host_seconds is not None:
            # The cycle's time up to here, less the models' decodes: the loop's own work (in a
            # batch, the scheduler's and the other sequences' too, which this one waits for).
            cycle = clock() - t0
            host = max(0.0, cycle - (busy() - busy_at_start))
            self.stats.host_seconds += host
            if self.engine.load is None:  # the pair's single-stream share (``doctor``)
                self.profile.observe_host(host, cycle)
        yield CycleDone(len(guessed.proposal.tokens), verdict.n_accepted, tuple(new), logprobs)
        if text:
            yield TextChunk(text)

    # -- 2. the guesses --------------------------------------------------------------------
    def guesses(self) -> _Guesses:
        """The policy picks a candidate and K within the token budget and the context; where
        the grammar allows one way on, its forced tokens are the guesses."""
        target, drafter, stats = self.target, self.drafter, self.stats
        left, room = self.config.max_tokens - stats.n_generated, target.n_ctx - target.n_past
        budget = min(left, room) - 1
        if self.engine.load is not None:  # where the context bounds it, its end is unknown
            self.engine.load.note_left(self.engine.slot, left if left <= room else None)
        # (-k 0 is the target alone: no guesses at all, forced ones included.)
        forces = self.lookahead != 0 and budget > 0
        constraint = self.constraint
        forced = constraint.forced()[:budget] if constraint is not None and forces else []
        if forced:
            # Free guesses the target keeps (p = 1 under the mask), verified all the same, so a
            # tokenization the target would not choose is rejected rather than forced on it.
            plan = Plan(Candidate("grammar", "grammar", len(forced)), len(forced))
            one_hot = [] if self.sampling.greedy else [Dist.one_hot(t) for t in forced]
            return _Guesses(plan, Proposal(forced, one_hot), forced=True)
        candidates = drafter.candidates(self.tokens) if drafter is not None and budget > 0 else []
        plan = self.policy.plan(candidates, budget)
        if self.engine.load is not None:
            source = plan.candidate.source if plan.candidate else None
            self.engine.load.planned(self.engine.slot, plan.lookahead, source)
        proposal = (
            drafter.propose(
                self.tokens, plan.candidate, plan.lookahead, self.sampling, self.draws()
            )
            if drafter is not None and plan.candidate and plan.lookahead
            else Proposal()
        )
        # The drafter made guesses (and may hold them in its cache) even where the grammar
        # then cuts every one: it is told how many survived all the same.
        asked = bool(proposal.tokens)
        if constraint is not None and proposal.tokens:
            cut_invalid(proposal, constraint)
        return _Guesses(plan, proposal, candidates, asked=asked)

    # -- 3. one target pass over [last, guesses...], K+1 rows of logits ----------------------
    def verify(self, guessed: _Guesses) -> tuple[Verdict, tuple[TokenLogprob, ...]]:
        """The verdict on the guesses, the target and the drafter cut back to what it keeps,
        and the kept tokens' log-probabilities where asked for."""
        target, proposal = self.target, guessed.proposal
        guesses = proposal.tokens
        self.engine._clean = False
        base = target.n_past
        target.keep_rollback_point(len(guesses))
        draws = self.draws()
        rows = target.decode([self.tokens[-1], *guesses], len(guesses) + 1, self.picking(draws))
        top = self.config.logprobs
        read: list[Row] | None = [] if top is not None else None
        verdict = verdict_on(
            proposal,
            rows,
            self.sampling,
            draws,
            self.constraint,
            self.bias,
            read,
            self.penalties,
            self.tokens,
        )
        logprobs: tuple[TokenLogprob, ...] = ()
        if read is not None and top is not None:  # before the rollback, which may decode
            kept = [*guesses[: verdict.n_accepted], verdict.next_token]
            logprobs = tuple(
                token_logprob(whole_row(read[i]), t, top, target.piece) for i, t in enumerate(kept)
            )
        target.rollback(base + 1 + verdict.n_accepted)
        if self.drafter is not None and guessed.asked:
            self.drafter.rollback_to(verdict.n_accepted)
        return verdict, logprobs

    # -- 4. book-keeping ---------------------------------------------------------------------
    def book(
        self, guessed: _Guesses, verdict: Verdict, draft_seconds: float, verify_seconds: float
    ) -> list[int]:
        """The times and counts kept, the policy told what the cycle gave; the new tokens.
        The drafter's reading of the prompt counts as prompt time, as the target's does."""
        stats, proposal, plan = self.stats, guessed.proposal, guessed.plan
        guesses = proposal.tokens
        assert stats.gen_started is not None, "the prompt's pass starts the generation clock"
        stats.prompt_seconds += proposal.prompt_seconds
        stats.gen_started += proposal.prompt_seconds
        drafting = draft_seconds - proposal.prompt_seconds
        stats.draft_seconds += drafting
        stats.catch_up_seconds += proposal.catch_up_seconds
        stats.target_seconds += verify_seconds
        new = [*guesses[: verdict.n_accepted], verdict.next_token]
        tail = proposal.ngram_tail
        if not guessed.forced:  # the policy chose this cycle's source and learns from it
            self.policy.observe(
                plan,
                len(guesses),
                verdict.n_accepted,
                drafting - proposal.catch_up_seconds,
                verify_seconds,
                candidates=guessed.candidates,
                produced=new,
                ngram_tail=tail,
            )
        source = plan.candidate.source if plan.candidate and guesses else None
        paid = model_guesses(len(guesses), tail)
        if self.engine.load is not None:
            self.engine.load.report(self.engine.slot, len(new), len(guesses) + 1, paid, source)
        stats.record_cycle(
            source,
            plan.lookahead,
            len(guesses),
            verdict.n_accepted,
            plan.explore,
            paid,
            tail.candidate.source if tail else None,
        )
        self.tokens.extend(new)
        self.engine._clean = True  # the cache holds every token of the context but the last
        return new

    def finish(self, reason: StopReason) -> Finished:
        self.stats.finish(reason)
        if self.drafter is not None:
            self.drafter.end(self.tokens)
        return Finished(reason, self.stats)


def _random_seed() -> int:
    """A seed from the operating system's entropy, in the range a user can pass back."""
    entropy = np.random.SeedSequence().entropy
    assert isinstance(entropy, int), "SeedSequence() draws one integer of entropy"
    return entropy % 2**32
