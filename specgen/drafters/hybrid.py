"""A draft model (or a head) and prompt lookup together: each cycle takes whichever the
policy prefers."""

from __future__ import annotations

from collections.abc import Sequence

from specgen.core.constraint import Constraint
from specgen.core.coupling import Draws
from specgen.core.penalties import Penalties
from specgen.core.sampling import SamplingParams
from specgen.drafters.base import Candidate, Proposal
from specgen.drafters.head import HeadDrafter
from specgen.drafters.model import ModelDrafter
from specgen.drafters.ngram import NgramDrafter
from specgen.structured.grammar import LogitBias

# With a fixed K, a hybrid trusts an n-gram match of at least this many tokens over the model.
HYBRID_MIN_MATCH = 3
# The sources whose guesses are looked up (point masses, free): the text's own, the cache's.
LOOKUP_SOURCES = ("ngram", "cache")


class HybridDrafter:
    """A draft model and prompt lookup together: each cycle takes whichever the policy prefers.

    Candidates are ordered for a fixed K: a long n-gram match first (free guesses), else the
    model. The adaptive policy compares them by expected tokens per second instead. A model run
    whose guesses lead into a long n-gram match stops there and takes the match's continuation:
    the text has come back to something it said before, and those guesses cost nothing.
    """

    def __init__(
        self, model: ModelDrafter | HeadDrafter, ngram: NgramDrafter | None = None
    ) -> None:
        self.model = model
        self.ngram = ngram or NgramDrafter()
        self._last: ModelDrafter | HeadDrafter | NgramDrafter = self.model

    def constrain(
        self,
        constraint: Constraint | None,
        bias: LogitBias | None = None,
        penalties: Penalties | None = None,
    ) -> None:
        self.model.constrain(constraint, bias, penalties)

    def begin(self, prompt: Sequence[int], reuse_prefix: bool = False) -> None:
        self.model.begin(prompt, reuse_prefix)
        self.ngram.begin(prompt)

    def candidates(self, context: Sequence[int]) -> list[Candidate]:
        ngram, model = self.ngram.candidates(context), self.model.candidates(context)
        strong = [c for c in ngram if _is_strong(c)]
        weak = [c for c in ngram if c not in strong]
        return strong + model + weak

    def propose(
        self,
        context: Sequence[int],
        candidate: Candidate,
        k: int,
        sampling: SamplingParams,
        rng: Draws,
    ) -> Proposal:
        if candidate.source in LOOKUP_SOURCES:
            self._last = self.ngram
            return self.ngram.propose(context, candidate, k, sampling, rng)
        self._last = self.model
        return self.model.propose(context, candidate, k, sampling, rng, follow=self._strong_match)

    def _strong_match(self, context: Sequence[int], guesses: Sequence[int]) -> Candidate | None:
        """A long n-gram match that the model's guesses so far have led into: the model's run
        ends there and the match's continuation (free) fills the rest of the cycle."""
        return next((c for c in self.ngram.candidates(context, guesses) if _is_strong(c)), None)

    def rollback_to(self, n_accepted: int) -> None:
        self._last.rollback_to(n_accepted)

    def end(self, tokens: Sequence[int]) -> None:
        self.model.end(tokens)
        self.ngram.end(tokens)


def _is_strong(candidate: Candidate) -> bool:
    """An n-gram match long enough for a hybrid to take over the model."""
    return candidate.match_length >= HYBRID_MIN_MATCH
