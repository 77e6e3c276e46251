"""Where guesses come from: a draft model, prompt lookup (n-grams), or both.

The engine does not know. Each cycle it asks the drafter what it can offer (``offers``), lets
the lookahead policy pick an offer and a K, asks for that many guesses (``propose``), verifies
them, and says how many survived (``settle``) so the drafter can roll its state back. Every
guess comes with the distribution q it was drawn from (sampling mode; greedy needs none): a
draft model's warped logits, or a point mass (``Dist.one_hot``) for an n-gram guess, which the
accept/resample rule in ``specgen.core`` already handles exactly.

A drafter may look at the text so far (the context) when it decides what to offer: a choice
that depends only on the past keeps the output exact.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from specgen.core.sampling import Dist, SamplingParams, sample, warp
from specgen.lookahead import Offer

# N-gram lookup: the longest suffix of the text tried first, down to a single token.
NGRAM_MAX, NGRAM_MIN = 4, 1
# The longest continuation an n-gram offer reads out of the earlier text.
NGRAM_SPAN = 32
# A draft model that fell behind (speculation off, or n-grams drafting) reads at most this many
# of the tokens it missed, the latest.
CATCH_UP_WINDOW = 32
# With a fixed K, a hybrid trusts an n-gram match of at least this many tokens over the model.
HYBRID_MIN_MATCH = 3


class Model(Protocol):
    """What the engine and the model drafter need of a model (``backend.LlamaModel`` has it)."""

    n_vocab: int
    n_ctx: int
    n_past: int

    def decode(self, tokens: list[int], n_logits: int = 1) -> np.ndarray: ...
    def rollback(self, n_past: int) -> None: ...
    def reset(self) -> None: ...
    def piece(self, token: int) -> bytes: ...
    def is_eog(self, token: int) -> bool: ...


@dataclass
class Proposal:
    """Guesses for one cycle: ``q`` holds one distribution per guess when sampling."""

    tokens: list[int] = field(default_factory=list)
    q: list[Dist] = field(default_factory=list)
    # Seconds the drafter spent reading text it had not seen (what the target decoded alone
    # while speculation was off): a cost of having been off, not of these guesses.
    catch_up_seconds: float = 0.0
    # Seconds a draft model spent reading the prompt, which it does once first asked for
    # guesses: a generation that never drafts with it (speculation off) never pays for that.
    prompt_seconds: float = 0.0
    # A hybrid's model run that found its own guesses earlier in the text ends in prompt lookup:
    # (that match, n): the last n guesses came from it, at no cost.
    switch: tuple[Offer, int] | None = None


# Given the context and a model run's guesses so far, a match to finish the run with, or None.
FollowUp = Callable[[Sequence[int], Sequence[int]], Offer | None]


class Drafter(Protocol):
    """A source of guesses for the engine (see the module docstring for the protocol)."""

    def begin(self, prompt: Sequence[int], reuse_prefix: bool = False) -> None:
        """A new generation; ``prompt`` is every token before the first cycle. With
        ``reuse_prefix`` a drafter may keep state for the part the last generation shared.
        Cheap: work on the prompt waits for the first ``propose`` (``Proposal.prompt_seconds``)."""

    def offers(self, context: Sequence[int]) -> list[Offer]:
        """What this drafter can offer after ``context`` (all tokens so far), best first."""

    def propose(self, context: Sequence[int], offer: Offer, k: int, sampling: SamplingParams,
                rng: np.random.Generator) -> Proposal:
        """Up to ``k`` guesses continuing ``context``, from one of this cycle's offers."""

    def settle(self, n_accepted: int) -> None:
        """The last proposal's first ``n_accepted`` guesses survived; forget the rest."""


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def reuse_prefix_cache(model: Model, held: list[int], wanted: list[int], n_logits: int = 0
                       ) -> tuple[int, np.ndarray]:
    """Make the model's cache hold ``wanted``, keeping the prefix it shares with ``held`` (what
    the cache holds now; empty: start from nothing). Returns how many tokens were reused and
    the logits of the last ``n_logits`` rows (those rows are always decoded again)."""
    keep = min(common_prefix(held, wanted), len(wanted) - n_logits)
    if keep:
        model.rollback(keep)
    else:
        model.reset()
    return keep, model.decode(wanted[keep:], n_logits)


class ModelDrafter:
    """A small draft model with its own KV cache; it drafts by sampling from its q.

    ``p_min`` stops a cycle's drafting early when the draft is unsure of its next guess. It looks
    at q only, before drawing: a rule that looked at the drawn guess would keep guesses from a
    distribution other than q, and bias the output.
    """

    def __init__(self, model: Model, p_min: float = 0.0) -> None:
        if not 0.0 <= p_min < 1.0:
            raise ValueError("draft_p_min must be in [0, 1)")
        self.model = model
        self.p_min = p_min
        self._base = 0
        self._context: Sequence[int] = ()  # the engine's live context, as last seen
        # Context tokens the draft skipped when it caught up (its cache holds the context
        # minus those): its cache position i holds context token i + _skipped past the gap.
        self._skipped = 0
        # The prompt not yet read: (what the cache holds, what it should hold).
        self._unread: tuple[list[int], list[int]] | None = None

    def begin(self, prompt: Sequence[int], reuse_prefix: bool = False) -> None:
        # The engine holds the prompt's last token back to open cycle one; so does the draft.
        held = self._holds() if reuse_prefix else []
        self._unread = (held, list(prompt[:-1]))
        self._context, self._skipped = (), 0

    def _holds(self) -> list[int]:
        """The tokens the cache holds from its start ([] where unknown: it has a gap)."""
        if self._unread is not None:  # a generation that never drafted left it as it was
            return self._unread[0]
        return [] if self._skipped else list(self._context[: self.model.n_past])

    def offers(self, context: Sequence[int]) -> list[Offer]:
        room = self.model.n_ctx - (len(context) - self._skipped) + 1
        return [Offer("model", "model", room)] if room > 0 else []

    def propose(self, context: Sequence[int], offer: Offer, k: int, sampling: SamplingParams,
                rng: np.random.Generator, follow: FollowUp | None = None) -> Proposal:
        """Up to ``k`` guesses; after each, ``follow`` may finish the run with free guesses."""
        model, out = self.model, Proposal()
        if self._unread is not None:
            started = time.perf_counter()
            reuse_prefix_cache(model, *self._unread)
            self._unread = None
            out.prompt_seconds = time.perf_counter() - started
        self._base = len(context)
        self._context = context
        # Catch up on what was accepted since this draft last ran (one batch), then one token a
        # step: the last guess is never decoded, since nothing would read its logits. Usually
        # that is the last cycle's drawn token (and its last kept guess); anything more is text
        # the target decoded alone or took from n-grams, read in a batch of its own and timed
        # apart. Of a long stretch only the last CATCH_UP_WINDOW tokens are read: reading costs
        # the draft about what verifying it cost the target, and the draft's guesses need not
        # come from the whole text to be exact, only from the q they report.
        feed = list(context[model.n_past + self._skipped :])
        if len(feed) > 2:
            skip = max(0, len(feed) - 1 - CATCH_UP_WINDOW)
            self._skipped += skip
            started = time.perf_counter()
            model.decode(feed[skip:-1], 0)
            out.catch_up_seconds = time.perf_counter() - started
            feed = feed[-1:]
        for i in range(k):
            logits = model.decode(feed, 1)[0]
            if sampling.greedy:
                if self.p_min and _top_probability(logits) < self.p_min:
                    break
                guess = int(np.argmax(logits))
            else:
                dist = warp(logits, sampling)
                if self.p_min and float(dist.probs.max()) < self.p_min:
                    break
                guess = sample(dist, rng)
                out.q.append(dist)
            out.tokens.append(guess)
            # A guess past the end of generation would never be printed: stop drafting there.
            if model.is_eog(guess) or i == k - 1:
                break
            # The rest from a match is a point mass that depends only on the text before it,
            # as every guess's q may: still exact.
            match = follow(context, out.tokens) if follow is not None else None
            if match is not None:
                extra = list(match.preview[: k - len(out.tokens)])
                out.tokens += extra
                out.q += [] if sampling.greedy else [Dist.one_hot(t) for t in extra]
                out.switch = (match, len(extra))
                break
            feed = [guess]
        return out

    def settle(self, n_accepted: int) -> None:
        # The context grows by the kept guesses and one drawn token, which the draft has not
        # seen: keep the kept guesses it already holds, drop the rest.
        self.model.rollback(min(self.model.n_past, self._base - self._skipped + n_accepted))


class NgramDrafter:
    """Prompt lookup: find the text's last few tokens earlier on, guess what followed them.

    The longest suffix (NGRAM_MAX tokens, down to NGRAM_MIN) that occurred before wins; of its
    occurrences, the most recent. A guess is certain (q is a point mass), so in sampling mode it
    survives with probability p(guess), and a rejection draws from p without it: still exact.
    The index of n-grams grows with the text and costs microseconds per cycle.
    """

    def __init__(self) -> None:
        self.begin(())

    def begin(self, prompt: Sequence[int], reuse_prefix: bool = False) -> None:
        self._index: dict[tuple[int, ...], int] = {}
        self._indexed = 0

    def _extend_index(self, context: Sequence[int]) -> None:
        # Every n-gram that ends before the context's last token, mapped to its latest end.
        for end in range(self._indexed, len(context) - 1):
            for n in range(NGRAM_MIN, NGRAM_MAX + 1):
                if end + 1 >= n:
                    self._index[tuple(context[end + 1 - n : end + 1])] = end
        self._indexed = max(self._indexed, len(context) - 1)

    def lookup(self, context: Sequence[int], guesses: Sequence[int] = ()) -> tuple[int, int]:
        """(match length, end of the earlier occurrence) of the longest suffix seen before.

        ``guesses`` (not yet verified) extend the suffix looked for, never the index."""
        self._extend_index(context)
        tail = [*context[-NGRAM_MAX:], *guesses]
        for n in range(min(NGRAM_MAX, len(context) + len(guesses) - 1), NGRAM_MIN - 1, -1):
            end = self._index.get(tuple(tail[-n:]))
            if end is not None:
                return n, end
        return 0, -1

    def offers(self, context: Sequence[int], guesses: Sequence[int] = ()) -> list[Offer]:
        n, end = self.lookup(context, guesses)
        if not n:
            return []
        # What followed the earlier occurrence, up to the end of the text (and its guesses)...
        follows = (*context[end + 1 : end + 1 + NGRAM_SPAN], *guesses)[:NGRAM_SPAN]
        # ...and on from there as the text did after it: a text that repeats itself every P
        # tokens (the match lies P back) is guessed to go on doing so.
        period = len(context) + len(guesses) - 1 - end
        preview = tuple(follows[i % period] for i in range(NGRAM_SPAN)) \
            if period < NGRAM_SPAN else follows
        return [Offer("ngram", f"ngram{n}", len(preview), preview)]

    def propose(self, context: Sequence[int], offer: Offer, k: int, sampling: SamplingParams,
                rng: np.random.Generator) -> Proposal:
        tokens = list(offer.preview[:k])
        q = [] if sampling.greedy else [Dist.one_hot(t) for t in tokens]
        return Proposal(tokens, q)

    def settle(self, n_accepted: int) -> None:
        """The index follows the context itself; nothing to roll back."""


class HybridDrafter:
    """A draft model and prompt lookup together: each cycle takes whichever the policy prefers.

    Offers are ordered for a fixed K: a long n-gram match first (free guesses), else the model.
    The adaptive policy compares them by expected tokens per second instead. A model run whose
    guesses lead into a long n-gram match stops there and takes the match's continuation: the
    text has come back to something it said before, and those guesses cost nothing.
    """

    def __init__(self, model: ModelDrafter, ngram: NgramDrafter | None = None) -> None:
        self.model = model
        self.ngram = ngram or NgramDrafter()
        self._last: ModelDrafter | NgramDrafter = self.model

    def begin(self, prompt: Sequence[int], reuse_prefix: bool = False) -> None:
        self.model.begin(prompt, reuse_prefix)
        self.ngram.begin(prompt)

    def offers(self, context: Sequence[int]) -> list[Offer]:
        ngram, model = self.ngram.offers(context), self.model.offers(context)
        strong = [o for o in ngram if _is_strong(o)]
        weak = [o for o in ngram if o not in strong]
        return strong + model + weak

    def propose(self, context: Sequence[int], offer: Offer, k: int, sampling: SamplingParams,
                rng: np.random.Generator) -> Proposal:
        if offer.source == "ngram":
            self._last = self.ngram
            return self.ngram.propose(context, offer, k, sampling, rng)
        self._last = self.model
        return self.model.propose(context, offer, k, sampling, rng, follow=self._strong_match)

    def _strong_match(self, context: Sequence[int], guesses: Sequence[int]) -> Offer | None:
        """A long n-gram match that the model's guesses so far have led into: the model's run
        ends there and the match's continuation (free) fills the rest of the cycle."""
        return next((o for o in self.ngram.offers(context, guesses) if _is_strong(o)), None)

    def settle(self, n_accepted: int) -> None:
        self._last.settle(n_accepted)


def _is_strong(offer: Offer) -> bool:
    """An n-gram match long enough for a hybrid to take over the model (``ngram3`` and up)."""
    return int(offer.key.removeprefix("ngram")) >= HYBRID_MIN_MATCH


def _top_probability(logits: np.ndarray) -> float:
    """softmax(logits).max(), without building the softmax."""
    shifted = logits - logits.max()
    return float(1.0 / np.exp(shifted, dtype=np.float64).sum())
