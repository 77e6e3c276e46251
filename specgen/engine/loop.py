"""The speculative loop: ask a drafter for guesses, verify them in one target pass, keep the rest.

The engine yields events (text pieces, cycle results, the end) and does no I/O: the CLI prints,
the benchmark measures. It knows nothing of where guesses come from (``specgen.drafters``) or
how many to ask for (``specgen.lookahead``); it drives any object with the ``Model`` shape, so
tests run it on fakes as well as on llama.cpp models from ``specgen.backend``.

The prompt's own target pass gives the first token, before the drafter reads the prompt (time to
first token is the target's alone). Cache invariant, at the start of every cycle: the target's
KV cache holds every token except the last one (``last``). The target decodes
``[last, x_1..x_K]`` in ONE batch with logits on all K+1 rows, keeps the guesses that survive the
accept rule, and is cut back to the accepted prefix;
the drafter is told how many survived and rolls its own state back.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field

import numpy as np

from specgen.core.constraint import Constraint, shaped
from specgen.core.sampling import (
    Dist,
    Row,
    Rows,
    SamplingParams,
    best,
    row_top_k,
    sample,
    top_ids,
    warp,
)
from specgen.core.speculative import Verdict, verify, verify_greedy
from specgen.core.text import StopMatcher, StreamDecoder
from specgen.drafters import (
    Candidate,
    Drafter,
    Model,
    NgramTail,
    Plan,
    Proposal,
    model_guesses,
    reuse_prefix_cache,
)
from specgen.errors import PromptTooLong
from specgen.lookahead import (
    DEFAULT_LOOKAHEAD,
    CostBook,
    Lookahead,
    check_lookahead,
    effective_lookahead,
    policy_for,
)
from specgen.stats import Clock, Stats, StopReason
from specgen.structured.grammar import Grammar, LogitBias

# New tokens per generation unless told otherwise (run, batches, the API, the server).
DEFAULT_MAX_TOKENS = 256


@dataclass(frozen=True)
class GenerationConfig:
    """One generation's knobs. ``lookahead=0`` is the target alone; ``"auto"`` adapts K."""

    lookahead: Lookahead = DEFAULT_LOOKAHEAD
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = DEFAULT_MAX_TOKENS
    stop: tuple[str, ...] = ()
    seed: int | None = None
    grammar: Grammar | None = None  # what the output must match (``specgen.structured.grammar``)
    logit_bias: LogitBias | None = None  # added to the target's logits and the draft's
    # Log-probabilities of each generated token (and of the ``logprobs`` likeliest there):
    # None for none; from the target's own rows, which the verify pass has computed anyway.
    logprobs: int | None = None
    # Special tokens printed as their text (a tool call's markers), which otherwise print as
    # nothing: (token, text) pairs.
    keep_text: tuple[tuple[int, bytes], ...] = ()

    def __post_init__(self) -> None:
        check_lookahead(self.lookahead)
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"logprobs must be from 0 to {MAX_TOP_LOGPROBS}")


# The most alternatives a token's log-probability comes with (OpenAI's top_logprobs bound).
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probability under the target (its logits after the logit bias
    and the grammar's mask, at temperature 1: the model's own distribution, as OpenAI and
    llama-server report it), with the likeliest tokens there and theirs."""

    token: int
    logprob: float
    piece: bytes = b""  # what the token prints
    top: tuple[tuple[int, float, bytes], ...] = ()  # (token, logprob, piece), likeliest first

    def as_dict(self) -> dict[str, object]:
        """As data: id, text (its bytes decoded, replacing what a token cuts mid-character),
        bytes and logprob, and ``top``, the likeliest tokens there, each the same."""

        def one(token: int, logprob: float, piece: bytes) -> dict[str, object]:
            text = piece.decode("utf-8", "replace")
            return {"id": token, "token": text, "bytes": list(piece), "logprob": logprob}

        return {**one(self.token, self.logprob, self.piece), "top": [one(*t) for t in self.top]}


def token_logprob(
    row: np.ndarray, token: int, top: int, piece: Callable[[int], bytes]
) -> TokenLogprob:
    """``token``'s log-probability in the softmax of ``row``, and the ``top`` likeliest."""
    values = np.asarray(row, dtype=np.float64)
    peak = float(values.max())
    normalizer = peak + float(np.log(np.exp(values - peak).sum()))
    best: tuple[tuple[int, float, bytes], ...] = ()
    if top:
        ids = top_ids(values, top) if top < len(values) else np.arange(len(values))
        ids = ids[np.argsort(-values[ids], kind="stable")]
        best = tuple((int(i), float(values[i] - normalizer), piece(int(i))) for i in ids)
    return TokenLogprob(token, float(values[token] - normalizer), piece(token), best)


@dataclass(frozen=True)
class TextChunk:
    text: str
    # The log-probabilities of the tokens this text came from, where asked for (the session
    # fills them in: the engine reports them with each cycle).
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class CycleDone:
    """The tokens one target pass added: a cycle's, or the first token (the prompt's pass,
    ``drafted == 0``)."""

    drafted: int
    accepted: int
    tokens: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token, where asked for


@dataclass(frozen=True)
class Finished:
    reason: StopReason
    stats: Stats


Event = TextChunk | CycleDone | Finished


class SpeculativeEngine:
    """Generates with a target model, sped up by a drafter's guesses when one is given.

    What varies is passed in. ``costs`` are what ``-k auto`` measures (seconds per guess, the
    verify pass by length), facts of the machine, the models and the mode (greedy or sampled):
    the engine keeps them from one generation to the next, and a caller that keeps them between
    processes passes them in (``specgen.session.pair``). ``clock`` times the cycles (a test passes
    a fake clock that its fake models advance); the random generator comes from each run's seed.
    """

    def __init__(
        self,
        target: Model,
        drafter: Drafter | None = None,
        *,
        costs: CostBook | None = None,
        clock: Clock = time.perf_counter,
        busy: Clock | None = None,
    ) -> None:
        self.target = target
        self.drafter = drafter
        self.costs = costs if costs is not None else CostBook()
        self.clock = clock
        # Seconds spent in the models' decodes so far (``backend.decode_seconds``): a cycle's
        # time less what it spent there is the loop's own host work.
        self.busy = busy
        # What the target's cache holds between generations (for ``reuse_prefix``): the last
        # context, trusted only when that generation stopped between two cycles.
        self._context: list[int] = []
        self._clean = False

    def generate(
        self,
        prompt: Sequence[int],
        config: GenerationConfig,
        stats: Stats | None = None,
        reuse_prefix: bool = False,
    ) -> Generator[Event, None, None]:
        """Yield text as it is accepted, a ``CycleDone`` per cycle, then ``Finished``.

        Pass ``stats`` to watch the counters live (the view does). A run starts from empty
        caches, so results never depend on an earlier run, unless ``reuse_prefix``: then the
        part of the prompt that the last generation's text shares (a chat that goes on) is kept
        in the caches instead of decoded again (``Stats.n_prompt_cached``).
        """
        assert len(prompt) > 0, "the prompt must hold at least one token"
        target, drafter, sampling, clock = self.target, self.drafter, config.sampling, self.clock
        drafts = drafter is not None
        profile = self.costs.of(sampling.greedy)
        policy = policy_for(config.lookahead, drafts, profile, target.rollback_window)
        lookahead = effective_lookahead(config.lookahead, drafts)
        seed = config.seed if config.seed is not None else _random_seed()
        if stats is None:
            stats = Stats(lookahead=lookahead, seed=seed)
        stats.lookahead, stats.seed, stats.speculative = lookahead, seed, drafts
        stats.clock = clock
        rng = np.random.default_rng(seed)
        emit = _Emitter(target, config)
        tokens = list(prompt)
        constraint = target.constrain(config.grammar) if config.grammar is not None else None
        bias = (
            config.logit_bias if config.logit_bias is not None and config.logit_bias.ids else None
        )
        if drafter is not None:
            drafter.constrain(constraint, bias)
        # Rows whole where something reads the whole vocabulary, else their top-k (on the
        # backend where the model can): the same p either way.
        whole = constraint is not None or bias is not None or config.logprobs is not None
        stats.row_top_k = target.sample_top_k(row_top_k(sampling, whole, target.rows_on_device))
        busy = self.busy
        if busy is not None:
            stats.host_seconds = 0.0

        # 1. Prompt: one target pass over all of it gives the first token at once; a draft model
        #    reads it only once asked for guesses (time to first token is the target's).
        started = clock()
        if len(tokens) > target.n_ctx:
            raise PromptTooLong(
                f"the prompt ({len(tokens)} tokens) does not fit the context "
                f"({target.n_ctx} tokens); raise --ctx-size"
            )
        held = self._context[: target.n_past] if reuse_prefix and self._clean else []
        self._context, self._clean = tokens, False
        stats.n_prompt_cached, rows = reuse_prefix_cache(target, held, tokens, 1)
        row = shaped(rows[0], bias, constraint)
        if sampling.greedy:
            first = best(row)
        else:
            first = sample(warp(row, sampling, constraint is not None), rng)
        if constraint is not None:
            constraint.consume(first)
        first_logprob = (
            ()
            if config.logprobs is None
            else (token_logprob(_whole(row), first, config.logprobs, target.piece),)
        )
        tokens.append(first)
        self._clean = True  # the cache holds every token of the context but the last
        policy.begin()
        stats.n_prompt = len(prompt)
        stats.prompt_seconds = clock() - started
        stats.gen_started = clock()
        yield CycleDone(0, 0, (first,), first_logprob)
        text = emit.tokens([first], stats)
        if text:
            yield TextChunk(text)

        if drafter is not None:
            drafter.begin(tokens, reuse_prefix)
        while emit.reason is None:
            if target.n_past + 1 > target.n_ctx:
                emit.reason = "context_full"
                break
            # 2. Guesses: the policy picks a candidate and K within the token budget and context.
            t0 = clock()
            busy_at_start = busy() if busy is not None else 0.0
            budget = min(
                config.max_tokens - stats.n_generated - 1, target.n_ctx - target.n_past - 1
            )
            # (-k 0 is the target alone: no guesses at all, forced ones included.)
            forces = lookahead != 0 and budget > 0
            forced = constraint.forced()[:budget] if constraint is not None and forces else []
            if forced:
                # The grammar allows one way on: free guesses the target keeps (p = 1 under the
                # mask), verified all the same, so a tokenization the target would not choose
                # is rejected rather than forced on it.
                candidates, plan = (
                    [],
                    Plan(Candidate("grammar", "grammar", len(forced)), len(forced)),
                )
                proposal = Proposal(
                    forced, [] if sampling.greedy else [Dist.one_hot(t) for t in forced]
                )
                asked = False
            else:
                candidates = (
                    drafter.candidates(tokens) if drafter is not None and budget > 0 else []
                )
                plan = policy.plan(candidates, budget)
                proposal = (
                    drafter.propose(tokens, plan.candidate, plan.lookahead, sampling, rng)
                    if drafter is not None and plan.candidate and plan.lookahead
                    else Proposal()
                )
                # The drafter made guesses (and may hold them in its cache) even where the
                # grammar then cuts every one: it is told how many survived all the same.
                asked = bool(proposal.tokens)
                if constraint is not None and proposal.tokens:
                    _cut_invalid(proposal, constraint)
            guesses = proposal.tokens
            t1 = clock()

            # 3. One target pass over [last, guesses...], K+1 rows of logits.
            self._clean = False
            base = target.n_past
            target.keep_rollback_point(len(guesses))
            rows = target.decode([tokens[-1], *guesses], len(guesses) + 1)
            top = config.logprobs
            read: list[Row] | None = [] if top is not None else None
            verdict = self._verify(proposal, rows, sampling, rng, constraint, bias, read)
            logprobs: tuple[TokenLogprob, ...] = ()
            if read is not None and top is not None:  # before the rollback, which may decode
                kept = [*guesses[: verdict.n_accepted], verdict.next_token]
                logprobs = tuple(
                    token_logprob(_whole(read[i]), t, top, target.piece) for i, t in enumerate(kept)
                )
            target.rollback(base + 1 + verdict.n_accepted)
            if drafter is not None and asked:
                drafter.rollback_to(verdict.n_accepted)
            t2 = clock()

            # 4. Book-keeping, then the new tokens up to a stop condition. The drafter's reading
            #    of the prompt counts as prompt time, as the target's does.
            stats.prompt_seconds += proposal.prompt_seconds
            stats.gen_started += proposal.prompt_seconds
            drafting = t1 - t0 - proposal.prompt_seconds
            stats.draft_seconds += drafting
            stats.catch_up_seconds += proposal.catch_up_seconds
            stats.target_seconds += t2 - t1
            new = [*guesses[: verdict.n_accepted], verdict.next_token]
            tail = proposal.ngram_tail
            if not forced:  # the policy chose this cycle's source and learns from it
                policy.observe(
                    plan,
                    len(guesses),
                    verdict.n_accepted,
                    drafting - proposal.catch_up_seconds,
                    t2 - t1,
                    candidates=candidates,
                    produced=new,
                    ngram_tail=tail,
                )
            stats.record_cycle(
                plan.candidate.source if plan.candidate and guesses else None,
                plan.lookahead,
                len(guesses),
                verdict.n_accepted,
                plan.explore,
                model_guesses(len(guesses), tail),
                tail.candidate.source if tail else None,
            )
            tokens.extend(new)
            self._clean = True  # the cache holds every token of the context but the last
            text = emit.tokens(new, stats)
            if busy is not None and stats.host_seconds is not None:
                # The cycle's time up to here, less the models' decodes: the loop's own work.
                cycle = clock() - t0
                host = max(0.0, cycle - (busy() - busy_at_start))
                stats.host_seconds += host
                profile.observe_host(host, cycle)
            yield CycleDone(len(guesses), verdict.n_accepted, tuple(new), logprobs)
            if text:
                yield TextChunk(text)

        stats.finish(emit.reason)
        if drafter is not None:
            drafter.end(tokens)
        yield Finished(emit.reason, stats)

    @staticmethod
    def _verify(
        proposal: Proposal,
        rows: Rows,
        sampling: SamplingParams,
        rng: np.random.Generator,
        constraint: Constraint | None = None,
        bias: LogitBias | None = None,
        read: list[Row] | None = None,
    ) -> Verdict:
        """The verdict on a proposal; into ``read`` (where given) the rows the rule read, as
        it read them (biased and masked), one per position it reached."""
        if constraint is None and bias is None:
            if read is not None:
                read.extend(rows[: len(proposal.tokens) + 1])
            if sampling.greedy:
                return verify_greedy(proposal.tokens, lambda i: best(rows[i]))
            return verify(proposal.tokens, proposal.q, lambda i: warp(rows[i], sampling), rng)
        # The bias first, then the grammar's mask, whose state for each row is the one after
        # the guesses before it: the rule asks for rows in order (0, 1, ...), each once, so the
        # state follows the kept guesses and ends after the token drawn.
        guesses = proposal.tokens

        def row(i: int) -> Row:
            if constraint is not None and i > 0:
                constraint.consume(guesses[i - 1])
            out = shaped(rows[i], bias, constraint)
            if read is not None:
                read.append(out)
            return out

        grammar = constraint is not None
        if sampling.greedy:
            verdict = verify_greedy(guesses, lambda i: best(row(i)))
        else:
            verdict = verify(guesses, proposal.q, lambda i: warp(row(i), sampling, grammar), rng)
        if constraint is not None:
            constraint.consume(verdict.next_token)
        return verdict


def _whole(row: Row) -> np.ndarray:
    assert isinstance(row, np.ndarray), "log-probabilities read whole rows (row_top_k)"
    return row


def _cut_invalid(proposal: Proposal, constraint: Constraint) -> None:
    """Drop a draft's guesses from its first one the grammar does not allow: the target would
    reject each of them, and the verify pass need not read them."""
    drafted = len(proposal.tokens)
    keep = constraint.valid_prefix(proposal.tokens)
    if keep == drafted:
        return
    del proposal.tokens[keep:]
    del proposal.q[keep:]
    tail = proposal.ngram_tail
    if tail is not None:  # the free guesses that finish a model run come last
        left = keep - (drafted - tail.n)
        proposal.ngram_tail = NgramTail(tail.candidate, left) if left > 0 else None


def _random_seed() -> int:
    """A seed from the operating system's entropy, in the range a user can pass back."""
    entropy = np.random.SeedSequence().entropy
    assert isinstance(entropy, int), "SeedSequence() draws one integer of entropy"
    return entropy % 2**32


class _Emitter:
    """Accepted tokens to printable text: UTF-8 held whole, stop strings and limits enforced."""

    def __init__(self, target: Model, config: GenerationConfig) -> None:
        self.target, self.max_tokens = target, config.max_tokens
        self.decoder, self.stopper = StreamDecoder(), StopMatcher(config.stop)
        self.reason: StopReason | None = None
        self.kept = dict(config.keep_text)

    def tokens(self, new: list[int], stats: Stats) -> str:
        text: list[str] = []
        for token in new:
            if self.target.is_eog(token):
                self.reason = "eog"
                break
            stats.n_generated += 1
            raw = self.kept.get(token)
            piece, stopped = self.stopper.feed(
                self.decoder.feed(self.target.piece(token) if raw is None else raw)
            )
            text.append(piece)
            if stopped:
                self.reason = "stop"
                break
            if stats.n_generated >= self.max_tokens:
                self.reason = "max_tokens"
                break
        if self.reason is not None and self.reason != "stop":
            text.append(self.stopper.feed(self.decoder.flush())[0] + self.stopper.flush())
        return "".join(text)
