"""A small draft model with its own KV cache: it drafts by sampling from its q."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from specgen.core.constraint import Constraint, shaped
from specgen.core.coupling import Draws, draw
from specgen.core.penalties import Penalties
from specgen.core.sampling import Dist, Row, SamplingParams, best, row_top_k, warp
from specgen.drafters.base import (
    Candidate,
    FollowUp,
    Model,
    NgramTail,
    Proposal,
    common_prefix,
    reuse_prefix_cache,
)
from specgen.stats import Clock
from specgen.structured.grammar import LogitBias

# A draft model that fell behind (speculation off, or n-grams drafting) reads at most this many
# of the tokens it missed, the latest.
CATCH_UP_WINDOW = 32


class ModelDrafter:
    """A small draft model with its own KV cache; it drafts by sampling from its q.

    ``p_min`` stops a cycle's drafting early when the draft is unsure of its next guess. It looks
    at q only, before drawing: a rule that looked at the drawn guess would keep guesses from a
    distribution other than q, and bias the output. ``clock`` times the draft's reading of text
    it had not seen (the prompt, or what it missed), which is not a cost of its guesses.
    """

    def __init__(self, model: Model, p_min: float = 0.0, clock: Clock = time.perf_counter) -> None:
        if not 0.0 <= p_min < 1.0:
            raise ValueError("draft_p_min must be in [0, 1)")
        self.model = model
        self.p_min = p_min
        self.clock = clock
        self._base = 0
        self._context: Sequence[int] = ()  # the engine's live context, as last seen
        # Context tokens the draft skipped when it caught up (its cache holds the context
        # minus those): its cache position i holds context token i + _skipped past the gap.
        self._skipped = 0
        # The prompt not yet read: (what the cache holds, what it should hold).
        self._unread: tuple[list[int], list[int]] | None = None
        self._constraint: Constraint | None = None
        self._bias: LogitBias | None = None
        self._penalties: Penalties | None = None

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

    def candidates(self, context: Sequence[int]) -> list[Candidate]:
        room = self.model.n_ctx - (len(context) - self._skipped) + 1
        if room <= 0:
            return []
        unread, cached = 0, self.model.n_past + self._skipped
        if self._unread is not None:
            held, prompt = self._unread
            kept = common_prefix(held, prompt) if self.model.rollback_anywhere else 0
            unread, cached = len(prompt) - kept, len(prompt)
        return [Candidate("model", "model", room, setup=unread + catch_up(len(context) - cached))]

    def propose(
        self,
        context: Sequence[int],
        candidate: Candidate,
        k: int,
        sampling: SamplingParams,
        rng: Draws,
        follow: FollowUp | None = None,
    ) -> Proposal:
        """Up to ``k`` guesses; after each, ``follow`` may finish the run with free guesses."""
        model, out = self.model, Proposal()
        model.sample_top_k(
            draft_top_k(
                sampling,
                self.p_min,
                self._constraint,
                self._bias or self._penalties,
                model.rows_on_device,
            ),
            # q is whatever the guesses are drawn from: the backend's warp will do.
            sampling,
        )
        if self._unread is not None:
            started = self.clock()
            reuse_prefix_cache(model, *self._unread)
            self._unread = None
            out.prompt_seconds = self.clock() - started
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
        if catch_up(len(feed)):
            skip = max(0, len(feed) - 1 - CATCH_UP_WINDOW)
            self._skipped += skip
            started = self.clock()
            model.decode(feed[skip:-1], 0)
            out.catch_up_seconds = self.clock() - started
            feed = feed[-1:]
        model.keep_rollback_point(k, one_decode=False)
        first = feed

        def logits_after(guess: int | None) -> Row:
            return model.decode(first if guess is None else [guess], 1)[0]

        draw_guesses(
            out, logits_after, k, sampling, rng, self.p_min, model.is_eog, context, follow,
            self._constraint, self._bias, self._penalties,
        )  # fmt: skip
        return out

    def constrain(
        self,
        constraint: Constraint | None,
        bias: LogitBias | None = None,
        penalties: Penalties | None = None,
    ) -> None:
        self._constraint, self._bias, self._penalties = constraint, bias, penalties

    def rollback_to(self, n_accepted: int) -> None:
        # The context grows by the kept guesses and one drawn token, which the draft has not
        # seen: keep the kept guesses it already holds, drop the rest.
        self.model.rollback(min(self.model.n_past, self._base - self._skipped + n_accepted))

    def end(self, tokens: Sequence[int]) -> None:
        """The draft's cache keeps its text for the next generation's shared prefix."""


def catch_up(behind: int) -> int:
    """Tokens a draft reads in a batch of their own before its first step, ``behind`` tokens of
    the context past its cache: none where they are the last cycle's drawn token and kept
    guess (its first step reads those), else the latest ``CATCH_UP_WINDOW`` but the last."""
    return min(behind - 1, CATCH_UP_WINDOW) if behind > 2 else 0


def draft_top_k(
    sampling: SamplingParams,
    p_min: float,
    constraint: Constraint | None,
    shaping: object | None,
    on_device: bool,
) -> int:
    """How a draft's rows are read (``core.sampling.row_top_k``): whole where a mask, a bias or
    penalties (``shaping``: either), or ``p_min``'s softmax under greedy reads the vocabulary."""
    whole = constraint is not None or shaping is not None or (sampling.greedy and p_min > 0)
    return row_top_k(sampling, whole, on_device)


def draw_guesses(
    out: Proposal,
    logits_after: Callable[[int | None], Row],
    k: int,
    sampling: SamplingParams,
    rng: Draws,
    p_min: float,
    is_eog: Callable[[int], bool],
    context: Sequence[int],
    follow: FollowUp | None = None,
    constraint: Constraint | None = None,
    bias: LogitBias | None = None,
    penalties: Penalties | None = None,
) -> None:
    """Up to ``k`` guesses into ``out``, each drawn from the q of ``logits_after(the last guess)``
    (None: the first). The last guess is never fed back, since nothing would read its logits.

    ``p_min`` stops early when the draft is unsure of its next guess; it looks at q only, before
    drawing: a rule that looked at the drawn guess would keep guesses from a distribution other
    than q, and bias the output. After each guess ``follow`` may finish the run with free ones.
    Under a grammar (``constraint``) q is masked by its state along the guesses, as the
    target's p is, so the draft guesses only what the grammar allows; the state is rolled back
    after the run. ``penalties`` count the context and the guesses before each row, as the
    target's do.
    """
    guess: int | None = None
    consumed = 0
    try:
        for i in range(k):
            if constraint is not None and guess is not None:  # the state after the last guess
                constraint.consume(guess)
                consumed += 1
            logits = shaped(logits_after(guess), bias, constraint, penalties, context, out.tokens)
            guess = _draw(out, logits, sampling, rng, p_min, constraint is not None)
            if guess is None:
                break
            # A guess past the end of generation would never be printed: stop drafting there.
            if is_eog(guess) or i == k - 1:
                break
            # The rest from a match is a point mass that depends only on the text before it,
            # as every guess's q may: still exact.
            match = follow(context, out.tokens) if follow is not None else None
            if match is not None:
                extra = list(match.preview[: k - len(out.tokens)])
                out.tokens += extra
                out.q += [] if sampling.greedy else [Dist.one_hot(t) for t in extra]
                out.ngram_tail = NgramTail(match, len(extra))
                break
    finally:
        if constraint is not None:
            constraint.rollback(consumed)


def _draw(
    out: Proposal,
    logits: Row,
    sampling: SamplingParams,
    rng: Draws,
    p_min: float,
    masked_row: bool,
) -> int | None:
    """One guess from one row into ``out`` (None: ``p_min`` says stop before drawing)."""
    if sampling.greedy:
        if p_min and _top_probability(logits) < p_min:
            return None
        guess = best(logits)
    else:
        dist = warp(logits, sampling, masked_row)
        if p_min and dist.most() < p_min:
            return None
        guess = draw(dist, rng)
        out.q.append(dist)
    out.tokens.append(guess)
    return guess


def _top_probability(logits: Row) -> float:
    """softmax(logits).max(), without building the softmax (of a whole row)."""
    assert isinstance(logits, np.ndarray), "p_min under greedy reads whole rows (row_top_k)"
    shifted = logits - logits.max()
    return float(1.0 / np.exp(shifted, dtype=np.float64).sum())
