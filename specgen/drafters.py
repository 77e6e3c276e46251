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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from specgen.core.sampling import Dist, SamplingParams, sample, warp
from specgen.lookahead import Offer

# N-gram lookup: the longest suffix of the text tried first, down to a single token.
NGRAM_MAX, NGRAM_MIN = 4, 1
# The longest continuation an n-gram offer reads out of the earlier text.
NGRAM_SPAN = 32
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


class Drafter(Protocol):
    """A source of guesses for the engine (see the module docstring for the protocol)."""

    def begin(self, prompt: Sequence[int], reuse_prefix: bool = False) -> None:
        """A new generation; ``prompt`` is every token before the first cycle. With
        ``reuse_prefix`` a drafter may keep state for the part the last generation shared."""

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

    def begin(self, prompt: Sequence[int], reuse_prefix: bool = False) -> None:
        # The engine holds the prompt's last token back to open cycle one; so does the draft.
        held = list(self._context[: self.model.n_past]) if reuse_prefix else []
        self._context = ()
        reuse_prefix_cache(self.model, held, list(prompt[:-1]))

    def offers(self, context: Sequence[int]) -> list[Offer]:
        room = self.model.n_ctx - len(context) + 1
        return [Offer("model", "model", room)] if room > 0 else []

    def propose(self, context: Sequence[int], offer: Offer, k: int, sampling: SamplingParams,
                rng: np.random.Generator) -> Proposal:
        model, out = self.model, Proposal()
        self._base = len(context)
        self._context = context
        # Catch up on what was accepted since this draft last ran (one batch), then one token a
        # step: the last guess is never decoded, since nothing would read its logits. Usually
        # that is the last cycle's drawn token (and its last kept guess); anything more is text
        # the target decoded alone, read in a batch of its own and timed apart.
        feed = list(context[model.n_past :])
        if len(feed) > 2:
            started = time.perf_counter()
            model.decode(feed[:-1], 0)
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
            feed = [guess]
        return out

    def settle(self, n_accepted: int) -> None:
        # The context grows by the kept guesses and one drawn token, which the draft has not
        # seen: keep the kept guesses it already holds, drop the rest.
        self.model.rollback(min(self.model.n_past, self._base + n_accepted))


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

    def lookup(self, context: Sequence[int]) -> tuple[int, int]:
        """(match length, end of the earlier occurrence) of the longest suffix seen before."""
        self._extend_index(context)
        for n in range(min(NGRAM_MAX, len(context) - 1), NGRAM_MIN - 1, -1):
            end = self._index.get(tuple(context[-n:]))
            if end is not None:
                return n, end
        return 0, -1

    def offers(self, context: Sequence[int]) -> list[Offer]:
        n, end = self.lookup(context)
        if not n:
            return []
        preview = tuple(context[end + 1 : end + 1 + NGRAM_SPAN])
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
    The adaptive policy compares them by expected tokens per second instead.
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
        strong = [o for o in ngram if int(o.key.removeprefix("ngram")) >= HYBRID_MIN_MATCH]
        weak = [o for o in ngram if o not in strong]
        return strong + model + weak

    def propose(self, context: Sequence[int], offer: Offer, k: int, sampling: SamplingParams,
                rng: np.random.Generator) -> Proposal:
        self._last = self.ngram if offer.source == "ngram" else self.model
        return self._last.propose(context, offer, k, sampling, rng)

    def settle(self, n_accepted: int) -> None:
        self._last.settle(n_accepted)


def _top_probability(logits: np.ndarray) -> float:
    """softmax(logits).max(), without building the softmax."""
    shifted = logits - logits.max()
    return float(1.0 / np.exp(shifted, dtype=np.float64).sum())
