"""Step 3's rule: the verdict on a cycle's guesses from the target's rows, under the logit
bias, the penalties and the grammar's mask where there are any, and the guesses a grammar cuts
before the verify pass reads them. Pure: no model, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from specgen.core.constraint import Constraint, shaped
from specgen.core.coupling import Draws, Keyed, PickedRows, Picking, verify_gumbel
from specgen.core.penalties import Penalties
from specgen.core.sampling import Dist, Row, Rows, SamplingParams, best, warp
from specgen.core.speculative import Verdict, verify, verify_greedy
from specgen.drafters import NgramTail, Proposal
from specgen.structured.grammar import LogitBias


def verdict_on(
    proposal: Proposal,
    rows: Rows,
    sampling: SamplingParams,
    draws: Draws,
    constraint: Constraint | None = None,
    bias: LogitBias | None = None,
    read: list[Row] | None = None,
    penalties: Penalties | None = None,
    history: Sequence[int] = (),
) -> Verdict:
    """The verdict on a proposal; into ``read`` (where given) the rows the rule read, as it
    read them (biased, penalized and masked), one per position it reached. ``draws``: keyed
    noise from the first guess's position for the Gumbel-max rule (``core.coupling``), or the
    random generator for the min(1, p/q) rule. ``history``: the context before the first row
    (what the penalties count, with the guesses before each row)."""
    if constraint is None and bias is None and penalties is None:
        if read is not None:
            read.extend(rows[: len(proposal.tokens) + 1])
        if sampling.greedy:
            return verify_greedy(proposal.tokens, lambda i: best(rows[i]))
        # Each row warped as reached: none past a rejection.
        p: Callable[[int], Dist] = lambda i: warp(rows[i], sampling)  # noqa: E731
        if isinstance(draws, Keyed):
            if isinstance(rows, PickedRows) and rows.picking == Picking(
                sampling, draws.seed, draws.position
            ):  # picked with the pass's other sequences' rows (``core.coupling.pick_block``)
                return verify_greedy(proposal.tokens, rows.picks.__getitem__)
            return verify_gumbel(proposal.tokens, p, draws.seed, draws.position)
        return verify(proposal.tokens, proposal.q, p, draws)
    # The bias first, then the penalties of the context and the guesses before the row, then
    # the grammar's mask, whose state for each row is the one after the guesses before it: the
    # rule asks for rows in order (0, 1, ...), each once, so the state follows the kept guesses
    # and ends after the token drawn.
    guesses = proposal.tokens

    def row(i: int) -> Row:
        if constraint is not None and i > 0:
            constraint.consume(guesses[i - 1])
        out = shaped(rows[i], bias, constraint, penalties, history, guesses[:i])
        if read is not None:
            read.append(out)
        return out

    grammar = constraint is not None
    if sampling.greedy:
        verdict = verify_greedy(guesses, lambda i: best(row(i)))
    elif isinstance(draws, Keyed):
        verdict = verify_gumbel(
            guesses, lambda i: warp(row(i), sampling, grammar), draws.seed, draws.position
        )
    else:
        verdict = verify(guesses, proposal.q, lambda i: warp(row(i), sampling, grammar), draws)
    if constraint is not None:
        constraint.consume(verdict.next_token)
    return verdict


def whole_row(row: Row) -> np.ndarray:
    assert isinstance(row, np.ndarray), "log-probabilities read whole rows (row_top_k)"
    return row


def cut_invalid(proposal: Proposal, constraint: Constraint) -> None:
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
