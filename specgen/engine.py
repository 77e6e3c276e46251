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
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from specgen.core.sampling import SamplingParams, sample, warp
from specgen.core.speculative import (
    DEFAULT_LOOKAHEAD,
    MAX_LOOKAHEAD,
    Lookahead,
    Verdict,
    verify,
    verify_greedy,
)
from specgen.core.text import StopMatcher, StreamDecoder
from specgen.drafters import Drafter, Model, Proposal, reuse_prefix_cache
from specgen.errors import PromptTooLong
from specgen.lookahead import (
    AdaptiveLookahead,
    CostBook,
    FixedLookahead,
    LookaheadPolicy,
    Offer,
)

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

    def __post_init__(self) -> None:
        if self.lookahead != "auto" and not (
                isinstance(self.lookahead, int) and 0 <= self.lookahead <= MAX_LOOKAHEAD):
            raise ValueError(f"lookahead (K) must be 'auto' or from 0 to {MAX_LOOKAHEAD}")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")


@dataclass
class SourceStats:
    """What one source of guesses (``model``, ``ngram``) did in a generation: the cycles it
    opened, and its guesses (an n-gram match that finished a model run counts its guesses,
    not the cycle)."""

    cycles: int = 0
    drafted: int = 0
    accepted: int = 0


@dataclass
class Stats:
    """Counters and clocks of one generation, updated live while it runs.

    ``lookahead`` is what was asked for (a K, or ``"auto"``); ``current_lookahead`` the K of the
    latest cycle, and ``k_counts`` how many cycles ran at each K (0: the target alone).
    """

    lookahead: Lookahead
    seed: int
    speculative: bool = True
    n_prompt: int = 0
    n_prompt_cached: int = 0  # prompt tokens kept in the caches from the last generation
    prompt_seconds: float = 0.0
    n_generated: int = 0
    n_cycles: int = 0
    n_drafted: int = 0
    n_accepted: int = 0
    n_rejected: int = 0
    n_probes: int = 0
    draft_seconds: float = 0.0
    # Of draft_seconds, what a drafter spent reading text it had missed (the target decoded it
    # alone while speculation was off): a cost of having been off, not of its guesses.
    catch_up_seconds: float = 0.0
    target_seconds: float = 0.0
    gen_started: float | None = None
    gen_seconds: float = 0.0
    current_lookahead: int = 0
    reached_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    by_source: dict[str, SourceStats] = field(default_factory=dict)
    k_counts: dict[int, int] = field(default_factory=dict)
    stop_reason: str | None = None

    def record_cycle(self, source: str | None, lookahead: int, drafted: int, accepted: int,
                     probe: bool, switch: tuple[Offer, int] | None = None) -> None:
        """Count one verified cycle: ``drafted`` guesses, the first ``accepted`` kept; with
        ``switch``, the last of them came from that offer (a model run ended in a match)."""
        self.n_cycles += 1
        self.current_lookahead = lookahead
        self.k_counts[lookahead] = self.k_counts.get(lookahead, 0) + 1
        self.n_probes += probe
        self.n_drafted += drafted
        self.n_accepted += accepted
        self.n_rejected += accepted < drafted
        if source is not None:
            paid = drafted - (switch[1] if switch else 0)
            self._count(source, paid, min(accepted, paid), True)
            if switch:
                self._count(switch[0].source, switch[1], max(accepted - paid, 0), False)
        judged = min(accepted + 1, drafted)
        while len(self.reached_at) < judged:
            self.reached_at.append(0)
            self.accepted_at.append(0)
        for i in range(judged):
            self.reached_at[i] += 1
            self.accepted_at[i] += i < accepted

    def _count(self, source: str, drafted: int, accepted: int, cycle: bool) -> None:
        mine = self.by_source.setdefault(source, SourceStats())
        mine.cycles += cycle
        mine.drafted += drafted
        mine.accepted += accepted

    @property
    def accept_rate(self) -> float | None:
        """Share of drafted tokens that were kept (llama.cpp's "accept" figure)."""
        return self.n_accepted / self.n_drafted if self.n_drafted else None

    @property
    def alpha(self) -> float | None:
        """Alpha (Leviathan et al. 2023): the chance that a guess the target looks at survives.

        Guesses after a rejection are drafted but never judged, so they are left out here.
        """
        judged = self.n_accepted + self.n_rejected
        return self.n_accepted / judged if judged else None

    @property
    def n_cycle_tokens(self) -> int:
        """Tokens the cycles gave: all but the first, which the prompt's own pass gives."""
        return self.n_generated - 1 if self.n_cycles else 0

    @property
    def tokens_per_cycle(self) -> float | None:
        return self.n_cycle_tokens / self.n_cycles if self.n_cycles else None

    def finish(self, reason: str) -> None:
        """Stop the generation clock; ``reason`` says why generation ended."""
        if self.gen_started is not None:
            self.gen_seconds = time.perf_counter() - self.gen_started
        self.stop_reason = reason

    def elapsed(self) -> float:
        """Generation time so far (prompt processing excluded)."""
        if self.stop_reason is None and self.gen_started is not None:
            return time.perf_counter() - self.gen_started
        return self.gen_seconds

    @property
    def tokens_per_second(self) -> float | None:
        elapsed = self.elapsed()
        return self.n_generated / elapsed if elapsed > 0 and self.n_generated else None

    @property
    def prompt_tokens_per_second(self) -> float | None:
        return self.n_prompt / self.prompt_seconds if self.prompt_seconds > 0 else None

    def position_accept_rates(self) -> list[float]:
        """How often the 1st, 2nd, ... guess survived, among cycles that got that far."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.reached_at)]

    def as_dict(self) -> dict[str, object]:
        return {
            "lookahead": self.lookahead,
            "seed": self.seed,
            "prompt_tokens": self.n_prompt,
            "prompt_tokens_cached": self.n_prompt_cached,
            "prompt_seconds": round(self.prompt_seconds, 6),
            "prompt_tokens_per_second": self.prompt_tokens_per_second,
            "generated_tokens": self.n_generated,
            "generation_seconds": round(self.elapsed(), 6),
            "tokens_per_second": self.tokens_per_second,
            "cycles": self.n_cycles,
            "drafted": self.n_drafted,
            "accepted": self.n_accepted,
            "accept_rate": self.accept_rate,
            "alpha": self.alpha,
            "tokens_per_cycle": self.tokens_per_cycle,
            "position_accept_rates": self.position_accept_rates(),
            "draft_seconds": round(self.draft_seconds, 6),
            "catch_up_seconds": round(self.catch_up_seconds, 6),
            "target_seconds": round(self.target_seconds, 6),
            "stop_reason": self.stop_reason,
            "drafters": {name: asdict(src) for name, src in self.by_source.items()},
            "lookahead_history": self.lookahead_summary(),
        }

    def lookahead_summary(self) -> dict[str, object]:
        """The K's the cycles ran at: mean, range, cycles with the target alone, probes."""
        cycles = sum(self.k_counts.values())
        return {
            "mean": (sum(k * n for k, n in self.k_counts.items()) / cycles) if cycles else None,
            "min": min(self.k_counts, default=None),
            "max": max(self.k_counts, default=None),
            "target_alone_cycles": self.k_counts.get(0, 0),
            "probes": self.n_probes,
            "cycles_by_k": {str(k): n for k, n in sorted(self.k_counts.items())},
        }


@dataclass(frozen=True)
class TextChunk:
    text: str


@dataclass(frozen=True)
class CycleDone:
    """The tokens one target pass added: a cycle's, or the first token (the prompt's pass,
    ``drafted == 0``)."""

    drafted: int
    accepted: int
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class Finished:
    reason: str  # "eog", "max_tokens", "stop", "context_full"
    stats: Stats


Event = TextChunk | CycleDone | Finished


class SpeculativeEngine:
    """Generates with a target model, sped up by a drafter's guesses when one is given.

    The costs ``-k auto`` measures (seconds per guess, the verify pass by length) belong to the
    machine, the models and the mode (greedy or sampled), so the engine keeps them from one
    generation to the next.
    """

    def __init__(self, target: Model, drafter: Drafter | None = None) -> None:
        self.target = target
        self.drafter = drafter
        self.costs = CostBook()
        # What the target's cache holds between generations (for ``reuse_prefix``): the last
        # context, trusted only when that generation stopped between two cycles.
        self._context: list[int] = []
        self._clean = False

    def policy(self, lookahead: Lookahead, greedy: bool) -> LookaheadPolicy:
        if self.drafter is None:
            return FixedLookahead(0)
        if lookahead == "auto":
            return AdaptiveLookahead(self.costs.of(greedy))
        return FixedLookahead(lookahead)

    def generate(
        self, prompt: Sequence[int], config: GenerationConfig, stats: Stats | None = None,
        reuse_prefix: bool = False,
    ) -> Iterator[Event]:
        """Yield text as it is accepted, a ``CycleDone`` per cycle, then ``Finished``.

        Pass ``stats`` to watch the counters live (the view does). A run starts from empty
        caches, so results never depend on an earlier run, unless ``reuse_prefix``: then the
        part of the prompt that the last generation's text shares (a chat that goes on) is kept
        in the caches instead of decoded again (``Stats.n_prompt_cached``).
        """
        assert len(prompt) > 0, "the prompt must hold at least one token"
        target, drafter, sampling = self.target, self.drafter, config.sampling
        policy = self.policy(config.lookahead, sampling.greedy)
        lookahead = config.lookahead if drafter is not None else 0
        seed = config.seed if config.seed is not None else int(np.random.SeedSequence().entropy
                                                                % 2**32)
        if stats is None:
            stats = Stats(lookahead=lookahead, seed=seed)
        stats.lookahead, stats.seed, stats.speculative = lookahead, seed, drafter is not None
        rng = np.random.default_rng(seed)
        emit = _Emitter(target, config)
        tokens = list(prompt)

        # 1. Prompt: one target pass over all of it gives the first token at once; a draft model
        #    reads it only once asked for guesses (time to first token is the target's).
        started = time.perf_counter()
        if len(tokens) > target.n_ctx:
            raise PromptTooLong(f"the prompt ({len(tokens)} tokens) does not fit the context "
                                f"({target.n_ctx} tokens); raise --ctx-size")
        held = self._context[: target.n_past] if reuse_prefix and self._clean else []
        self._context, self._clean = tokens, False
        stats.n_prompt_cached, rows = reuse_prefix_cache(target, held, tokens, 1)
        first = (int(np.argmax(rows[0])) if sampling.greedy
                 else sample(warp(rows[0], sampling), rng))
        tokens.append(first)
        self._clean = True  # the cache holds every token of the context but the last
        policy.begin()
        stats.n_prompt = len(prompt)
        stats.prompt_seconds = time.perf_counter() - started
        stats.gen_started = time.perf_counter()
        yield CycleDone(0, 0, (first,))
        text = emit.tokens([first], stats)
        if text:
            yield TextChunk(text)

        if drafter is not None:
            drafter.begin(tokens, reuse_prefix)
        while emit.reason is None:
            if target.n_past + 1 > target.n_ctx:
                emit.reason = "context_full"
                break
            # 2. Guesses: the policy picks an offer and K within the token budget and context.
            t0 = time.perf_counter()
            room = min(config.max_tokens - stats.n_generated - 1, target.n_ctx - target.n_past - 1)
            offers = drafter.offers(tokens) if drafter is not None and room > 0 else []
            plan = policy.plan(offers, room)
            proposal = (drafter.propose(tokens, plan.offer, plan.lookahead, sampling, rng)
                        if drafter is not None and plan.offer and plan.lookahead else Proposal())
            guesses = proposal.tokens
            t1 = time.perf_counter()

            # 3. One target pass over [last, guesses...], K+1 rows of logits.
            self._clean = False
            base = target.n_past
            rows = target.decode([tokens[-1], *guesses], len(guesses) + 1)
            verdict = self._verify(proposal, rows, sampling, rng)
            target.rollback(base + 1 + verdict.n_accepted)
            if drafter is not None and guesses:
                drafter.settle(verdict.n_accepted)
            t2 = time.perf_counter()

            # 4. Book-keeping, then the new tokens up to a stop condition. The drafter's reading
            #    of the prompt counts as prompt time, as the target's does.
            stats.prompt_seconds += proposal.prompt_seconds
            stats.gen_started += proposal.prompt_seconds
            drafting = t1 - t0 - proposal.prompt_seconds
            stats.draft_seconds += drafting
            stats.catch_up_seconds += proposal.catch_up_seconds
            stats.target_seconds += t2 - t1
            new = [*guesses[: verdict.n_accepted], verdict.next_token]
            policy.observe(plan, len(guesses), verdict.n_accepted,
                           drafting - proposal.catch_up_seconds, t2 - t1, offers, new,
                           proposal.switch)
            stats.record_cycle(plan.offer.source if plan.offer and guesses else None,
                               plan.lookahead, len(guesses), verdict.n_accepted, plan.probe,
                               proposal.switch)
            tokens.extend(new)
            self._clean = True  # the cache holds every token of the context but the last
            yield CycleDone(len(guesses), verdict.n_accepted, tuple(new))
            text = emit.tokens(new, stats)
            if text:
                yield TextChunk(text)

        stats.finish(emit.reason)
        yield Finished(emit.reason, stats)

    @staticmethod
    def _verify(proposal: Proposal, rows: np.ndarray, sampling: SamplingParams,
                rng: np.random.Generator) -> Verdict:
        if sampling.greedy:
            return verify_greedy(proposal.tokens, lambda i: int(np.argmax(rows[i])))
        return verify(proposal.tokens, proposal.q, lambda i: warp(rows[i], sampling), rng)


class _Emitter:
    """Accepted tokens to printable text: UTF-8 held whole, stop strings and limits enforced."""

    def __init__(self, target: Model, config: GenerationConfig) -> None:
        self.target, self.max_tokens = target, config.max_tokens
        self.decoder, self.stopper = StreamDecoder(), StopMatcher(config.stop)
        self.reason: str | None = None

    def tokens(self, new: list[int], stats: Stats) -> str:
        text: list[str] = []
        for token in new:
            if self.target.is_eog(token):
                self.reason = "eog"
                break
            stats.n_generated += 1
            piece, stopped = self.stopper.feed(self.decoder.feed(self.target.piece(token)))
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
