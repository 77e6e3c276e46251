"""Prompt lookup: find the text's last few tokens earlier on, guess what followed them."""

from __future__ import annotations

from collections.abc import Sequence

from specgen.core.coupling import Draws
from specgen.core.sampling import Dist, SamplingParams
from specgen.drafters.base import Candidate, Proposal
from specgen.drafters.suffix import SuffixCache

# N-gram lookup: the longest suffix of the text tried first, down to a single token.
NGRAM_MAX, NGRAM_MIN = 4, 1
# The longest continuation an n-gram candidate reads out of the earlier text.
NGRAM_SPAN = 32


class NgramDrafter:
    """Prompt lookup: find the text's last few tokens earlier on, guess what followed them.

    The longest suffix (NGRAM_MAX tokens, down to NGRAM_MIN) that occurred before wins; of its
    occurrences, the most recent. A guess is certain (q is a point mass), so in sampling mode it
    survives with probability p(guess), and a rejection draws from p without it: still exact.
    The index of n-grams grows with the text and costs microseconds per cycle.

    With a ``cache`` (``specgen.drafters.suffix``), what earlier generations read and wrote is
    looked up too (a ``cache`` candidate beside the text's own), and each generation that ends
    is added to it.
    """

    def __init__(self, cache: SuffixCache | None = None) -> None:
        self.cache = cache
        self.begin(())

    def constrain(self, constraint: object, bias: object = None, penalties: object = None) -> None:
        """A match's guesses are point masses: the engine cuts those the grammar refuses."""

    def begin(self, prompt: Sequence[int], reuse_prefix: bool = False) -> None:
        self._index: dict[tuple[int, ...], int] = {}
        self._indexed = 0

    def _extend_index(self, context: Sequence[int]) -> None:
        # Every n-gram that ends before the context's last token, mapped to its latest end (a
        # later end overwrites an earlier one). Built a length at a time, so a long prompt is
        # indexed at C speed: each generation indexes its whole prompt.
        stop = len(context) - 1
        for n in range(NGRAM_MIN, NGRAM_MAX + 1):
            first = max(self._indexed, n - 1)  # the first end not indexed yet with n tokens
            if first >= stop:
                continue
            ends = range(first, stop)
            starts = [context[first + 1 - n + j : stop + 1 - n + j] for j in range(n)]
            self._index.update(zip(zip(*starts), ends))
        self._indexed = max(self._indexed, stop)

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

    def end(self, tokens: Sequence[int]) -> None:
        """A generation ended with these tokens (prompt and output): the cache keeps them."""
        if self.cache is not None:
            self.cache.add(tokens)

    def candidates(self, context: Sequence[int], guesses: Sequence[int] = ()) -> list[Candidate]:
        """The text's own match, and the cache's where it has one; the longer match first."""
        own = self._own(context, guesses)
        cached = self.cache.candidate(context, guesses) if self.cache is not None else None
        if cached is None:
            return own
        if own and own[0].match_length >= cached.match_length:
            return [*own, cached]
        return [cached, *own]

    def _own(self, context: Sequence[int], guesses: Sequence[int]) -> list[Candidate]:
        n, end = self.lookup(context, guesses)
        if not n:
            return []
        # What followed the earlier occurrence, up to the end of the text (and its guesses)...
        follows = (*context[end + 1 : end + 1 + NGRAM_SPAN], *guesses)[:NGRAM_SPAN]
        # ...and on from there as the text did after it: a text that repeats itself every P
        # tokens (the match lies P back) is guessed to go on doing so.
        period = len(context) + len(guesses) - 1 - end
        preview = (
            tuple(follows[i % period] for i in range(NGRAM_SPAN))
            if period < NGRAM_SPAN
            else follows
        )
        return [Candidate("ngram", f"ngram{n}", len(preview), preview, match_length=n)]

    def propose(
        self,
        context: Sequence[int],
        candidate: Candidate,
        k: int,
        sampling: SamplingParams,
        rng: Draws,
    ) -> Proposal:
        tokens = list(candidate.preview[:k])
        q = [] if sampling.greedy else [Dist.one_hot(t) for t in tokens]
        return Proposal(tokens, q)

    def rollback_to(self, n_accepted: int) -> None:
        """The index follows the context itself; nothing to roll back."""
