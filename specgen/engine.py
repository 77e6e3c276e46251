"""The speculative loop: draft K guesses, verify them in one target pass, keep what survives.

The engine yields events (text pieces, cycle results, the end) and does no I/O: the CLI prints,
the benchmark measures. It drives any object with the ``Model`` shape, so tests can run it on
fakes as well as on llama.cpp models from ``specgen.backend``.

Cache invariant, at the start of every cycle: the target's KV cache holds every token except the
last one (``last``); the draft's holds a prefix of that. The target decodes ``[last, x_1..x_K]``
in ONE batch with logits on all K+1 rows; both caches are then cut back to the accepted prefix.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from specgen.compat import MAX_SIZE_DIFFERENCE
from specgen.core.sampling import Dist, SamplingParams, sample, warp
from specgen.core.speculative import DEFAULT_LOOKAHEAD, Verdict, verify, verify_greedy
from specgen.core.text import StopMatcher, StreamDecoder


class PromptTooLong(ValueError):
    """The prompt alone fills the context window."""


class Model(Protocol):
    """What the engine needs of a model (``specgen.backend.LlamaModel`` has it)."""

    n_vocab: int
    n_ctx: int
    n_past: int

    def decode(self, tokens: list[int], n_logits: int = 1) -> np.ndarray: ...
    def rollback(self, n_past: int) -> None: ...
    def reset(self) -> None: ...
    def piece(self, token: int) -> bytes: ...
    def is_eog(self, token: int) -> bool: ...


@dataclass(frozen=True)
class GenerationConfig:
    """One generation's knobs. ``lookahead=0`` is the target alone, through the same loop."""

    lookahead: int = DEFAULT_LOOKAHEAD
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int | None = None
    # Stop drafting when the draft's own probability for its next guess is below this: such
    # guesses are mostly rejected, and their draft steps wasted. 0 drafts all K. The choice
    # depends on the draft alone, so the output still follows the target exactly.
    draft_p_min: float = 0.0

    def __post_init__(self) -> None:
        if self.lookahead < 0:
            raise ValueError("lookahead (K) must be >= 0")
        if not 0.0 <= self.draft_p_min < 1.0:
            raise ValueError("draft_p_min must be in [0, 1)")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")


@dataclass
class Stats:
    """Counters and clocks of one generation, updated live while it runs."""

    lookahead: int
    seed: int
    n_prompt: int = 0
    prompt_seconds: float = 0.0
    n_generated: int = 0
    n_cycles: int = 0
    n_drafted: int = 0
    n_accepted: int = 0
    n_rejected: int = 0
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    gen_started: float | None = None
    gen_seconds: float = 0.0
    reached_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    stop_reason: str | None = None

    @property
    def accept_rate(self) -> float | None:
        """Share of drafted tokens that were kept (llama.cpp's "accept" figure)."""
        return self.n_accepted / self.n_drafted if self.n_drafted else None

    @property
    def alpha(self) -> float | None:
        """The seed's alpha: the chance that a guess the target looks at survives.

        Guesses after a rejection are drafted but never judged, so they are left out here.
        """
        judged = self.n_accepted + self.n_rejected
        return self.n_accepted / judged if judged else None

    @property
    def tokens_per_cycle(self) -> float | None:
        return self.n_generated / self.n_cycles if self.n_cycles else None

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
            "target_seconds": round(self.target_seconds, 6),
            "stop_reason": self.stop_reason,
        }


@dataclass(frozen=True)
class TextChunk:
    text: str


@dataclass(frozen=True)
class CycleDone:
    drafted: int
    accepted: int
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class Finished:
    reason: str  # "eog", "max_tokens", "stop", "context_full"
    stats: Stats


Event = TextChunk | CycleDone | Finished


class SpeculativeEngine:
    """Generates with a target model, sped up by a draft model when one is given."""

    def __init__(self, target: Model, draft: Model | None = None) -> None:
        if draft is not None and draft.n_vocab > target.n_vocab + MAX_SIZE_DIFFERENCE:
            raise ValueError("the draft's vocabulary is far larger than the target's")
        self.target = target
        self.draft = draft

    def generate(
        self, prompt: Sequence[int], config: GenerationConfig, stats: Stats | None = None
    ) -> Iterator[Event]:
        """Yield text as it is accepted, a ``CycleDone`` per cycle, then ``Finished``.

        Pass ``stats`` to watch the counters live (the view does); every run starts from empty
        caches, so results never depend on an earlier run.
        """
        assert len(prompt) > 0, "the prompt must hold at least one token"
        lookahead = config.lookahead if self.draft is not None else 0
        seed = config.seed if config.seed is not None else int(np.random.SeedSequence().entropy
                                                                % 2**32)
        if stats is None:
            stats = Stats(lookahead=lookahead, seed=seed)
        stats.lookahead, stats.seed = lookahead, seed
        stats.reached_at = [0] * lookahead
        stats.accepted_at = [0] * lookahead
        rng = np.random.default_rng(seed)
        sampling = config.sampling
        decoder, stopper = StreamDecoder(), StopMatcher(config.stop)
        tokens = list(prompt)

        # 1. Prompt: both caches take every prompt token but the last, which opens cycle one.
        started = time.perf_counter()
        self.target.reset()
        n_ctx = min(m.n_ctx for m in (self.target, self.draft) if m is not None)
        if len(tokens) > n_ctx:
            raise PromptTooLong(f"the prompt ({len(tokens)} tokens) does not fit the context "
                                f"({n_ctx} tokens); raise --ctx-size")
        self.target.decode(tokens[:-1], 0)
        if self.draft is not None:
            self.draft.reset()
            self.draft.decode(tokens[:-1], 0)
        stats.n_prompt = len(tokens)
        stats.prompt_seconds = time.perf_counter() - started
        stats.gen_started = time.perf_counter()

        reason = None
        while reason is None:
            # 2. How many guesses fit: the context, the token budget, the draft's own context.
            k = min(lookahead, config.max_tokens - stats.n_generated - 1,
                    self.target.n_ctx - self.target.n_past - 1)
            if self.target.n_past + 1 > self.target.n_ctx:
                reason = "context_full"
                break
            guesses, q = self._draft(tokens, max(k, 0), sampling, config.draft_p_min, rng,
                                     stats)

            # 3. One target pass over [last, guesses...], K+1 rows of logits.
            t0 = time.perf_counter()
            base = self.target.n_past
            rows = self.target.decode([tokens[-1], *guesses], len(guesses) + 1)
            verdict = self._verify(guesses, q, rows, sampling, rng)
            self.target.rollback(base + 1 + verdict.n_accepted)
            if self.draft is not None:
                self.draft.rollback(min(self.draft.n_past, base + 1 + verdict.n_accepted))
            stats.target_seconds += time.perf_counter() - t0

            # 4. Book-keeping, then emit the new tokens up to a stop condition.
            new = [*guesses[: verdict.n_accepted], verdict.next_token]
            stats.n_cycles += 1
            stats.n_drafted += len(guesses)
            stats.n_accepted += verdict.n_accepted
            stats.n_rejected += verdict.n_accepted < len(guesses)
            for i in range(min(verdict.n_accepted + 1, len(guesses))):
                stats.reached_at[i] += 1
                stats.accepted_at[i] += i < verdict.n_accepted
            yield CycleDone(len(guesses), verdict.n_accepted, tuple(new))
            tokens.extend(new)
            text: list[str] = []
            for token in new:
                if self.target.is_eog(token):
                    reason = "eog"
                    break
                stats.n_generated += 1
                piece, stopped = stopper.feed(decoder.feed(self.target.piece(token)))
                text.append(piece)
                if stopped:
                    reason = "stop"
                    break
                if stats.n_generated >= config.max_tokens:
                    reason = "max_tokens"
                    break
            if reason != "stop" and reason is not None:
                text.append(stopper.feed(decoder.flush())[0] + stopper.flush())
            if "".join(text):
                yield TextChunk("".join(text))

        stats.finish(reason)
        yield Finished(reason, stats)

    def _draft(
        self, tokens: list[int], k: int, sampling: SamplingParams, p_min: float,
        rng: np.random.Generator, stats: Stats,
    ) -> tuple[list[int], list[Dist]]:
        """The draft's K guesses and the q each was drawn from (empty when K is 0)."""
        draft = self.draft
        if draft is None or k <= 0:
            return [], []
        t0 = time.perf_counter()
        k = min(k, draft.n_ctx - len(tokens) + 1)
        guesses: list[int] = []
        q: list[Dist] = []
        feed = tokens[draft.n_past :]
        for i in range(k):
            logits = draft.decode(feed, 1)[0]
            if sampling.greedy:
                guess = int(np.argmax(logits))
                if p_min and _top_probability(logits) < p_min:
                    break
            else:
                dist = warp(logits, sampling)
                # Decide from q alone, before drawing: a rule that looked at the drawn guess
                # would keep guesses from a distribution other than q, and bias the output.
                if p_min and float(dist.probs.max()) < p_min:
                    break
                guess = sample(dist, rng)
                q.append(dist)
            guesses.append(guess)
            # A guess past the end of generation would never be printed: stop drafting there.
            if draft.is_eog(guess) or i == k - 1:
                break
            feed = [guess]
        stats.draft_seconds += time.perf_counter() - t0
        return guesses, q

    @staticmethod
    def _verify(
        guesses: list[int], q: list[Dist], rows: np.ndarray, sampling: SamplingParams,
        rng: np.random.Generator,
    ) -> Verdict:
        if sampling.greedy:
            return verify_greedy(guesses, lambda i: int(np.argmax(rows[i])))
        return verify(guesses, q, lambda i: warp(rows[i], sampling), rng)


def _top_probability(logits: np.ndarray) -> float:
    """softmax(logits).max(), without building the softmax."""
    shifted = logits - logits.max()
    return float(1.0 / np.exp(shifted, dtype=np.float64).sum())
