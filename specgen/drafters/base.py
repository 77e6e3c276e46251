"""The contract between the engine, a drafter and the lookahead policy.

Each cycle the engine asks the drafter which ``Candidate`` sources of guesses it has
(``candidates``), lets the policy turn one into a ``Plan`` (a candidate and K, or the target
alone), asks the drafter for that many guesses (``propose``, a ``Proposal``), verifies them, and
tells the drafter how many survived (``rollback_to``). Every guess comes with the distribution q
it was drawn from (sampling mode; greedy needs none): a draft model's warped logits, or a point
mass (``Dist.one_hot``) for an n-gram guess, which the accept/resample rule in ``specgen.core``
already handles exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from specgen.core.constraint import Constraint
from specgen.core.coupling import Draws, Picking
from specgen.core.penalties import Penalties
from specgen.core.sampling import Dist, Rows, SamplingParams
from specgen.structured.grammar import LogitBias

if TYPE_CHECKING:
    from specgen.structured.grammar import Grammar


class Model(Protocol):
    """What the engine and the model drafter need of a model (``backend.LlamaModel`` has it)."""

    n_vocab: int
    n_ctx: int
    n_past: int
    # Tokens a rollback may drop without a checkpoint: any number (the context) for an
    # attention model, llama.cpp's snapshots for a recurrent or hybrid one.
    rollback_window: int
    # Whether its rows are computed on an accelerator (a GPU, a worker), away from the host.
    rows_on_device: bool

    @property
    def rollback_anywhere(self) -> bool:
        """Whether the cache can be cut at any earlier position (attention models' can)."""

    def decode(self, tokens: list[int], n_logits: int = 1, picking: Picking | None = None) -> Rows:
        """Append ``tokens``; the last ``n_logits`` rows, whole or as their top-k (below).
        ``picking``: the rows may come with their Gumbel-max picks (``PickedRows``), computed
        with other sequences' where a scheduler decodes several together."""

    def sample_top_k(self, k: int, warped: SamplingParams | None = None) -> int:
        """Rows from the next decode on: their ``k`` likeliest tokens (``TopK``), or whole (0);
        returns the k in effect (0 where the model cannot). ``warped``: the model may run the
        rest of the warp with these parameters too (``TopK.warped``)."""

    def constrain(self, grammar: Grammar) -> Constraint:
        """A fresh grammar state for one generation on this model."""

    def keep_rollback_point(self, undo: int, one_decode: bool = True) -> None:
        """The decodes that follow may be rolled back to here by up to ``undo`` tokens."""

    def rollback(self, n_past: int) -> None: ...
    def reset(self) -> None: ...
    def piece(self, token: int) -> bytes: ...
    def is_eog(self, token: int) -> bool: ...


# Sources whose guesses all come from one pass of the head, whatever K (a DFlash block): a
# cycle's draft costs that pass, not K steps, and is timed and priced so.
BLOCK_SOURCES = frozenset({"dflash"})
# Heads that read the target's hidden states: in a batch each sequence's head drafts in turn
# (a context of its own), so their draft times add up where a draft model's batched steps do not.
HEAD_SOURCES = frozenset({"mtp", "eagle3", "dflash"})


def draft_cost(source: str | None, k: int, guess: float) -> float:
    """Seconds the draft of ``k`` guesses from ``source`` costs, at ``guess`` seconds a guess
    (a block source: a pass)."""
    if source in BLOCK_SOURCES:
        return guess if k else 0.0
    return k * guess


@dataclass(frozen=True)
class Candidate:
    """One source of guesses a drafter can use this cycle.

    ``source`` is what the stats count (``model``, ``ngram``); ``acceptance_key`` what acceptance
    is learned under (an n-gram match of 4 tokens predicts better than one of 1); ``limit`` the
    most guesses it can give; ``match_length`` the length of an n-gram match (0: not one).
    """

    source: str
    acceptance_key: str
    limit: int
    # The guesses this candidate would make, where they cost nothing to know (an n-gram match's
    # continuation): scored in hindsight against the tokens a cycle produced, a candidate not
    # taken is still learned about.
    preview: tuple[int, ...] = ()
    match_length: int = 0
    # Tokens the source reads before its first guess (a draft model's prompt, read once it is
    # first asked, and what it missed while others drafted or none did): in a batch, a read
    # every other sequence waits for.
    setup: int = 0


@dataclass(frozen=True)
class Plan:
    """The policy's decision for one cycle: ask ``candidate`` for ``lookahead`` guesses (0:
    none, the target alone); ``explore``: a cycle spent trying a source left alone."""

    candidate: Candidate | None
    lookahead: int
    explore: bool = False


TARGET_ALONE = Plan(None, 0)


@dataclass(frozen=True)
class NgramTail:
    """A model run whose guesses led into an n-gram match ends with the match's continuation:
    the last ``n`` guesses came from ``candidate``, at no cost."""

    candidate: Candidate
    n: int


def model_guesses(drafted: int, tail: NgramTail | None) -> int:
    """Of a cycle's drafted guesses, those the source itself made (paid for)."""
    return drafted - (tail.n if tail is not None else 0)


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
    ngram_tail: NgramTail | None = None


# Given the context and a model run's guesses so far, a match to finish the run with, or None.
FollowUp = Callable[[Sequence[int], Sequence[int]], Candidate | None]


class Drafter(Protocol):
    """A source of guesses for the engine (see the module docstring for the protocol)."""

    def begin(self, prompt: Sequence[int], reuse_prefix: bool = False) -> None:
        """A new generation; ``prompt`` is every token before the first cycle. With
        ``reuse_prefix`` a drafter may keep state for the part the last generation shared.
        Cheap: work on the prompt waits for the first ``propose`` (``Proposal.prompt_seconds``)."""

    def constrain(
        self,
        constraint: Constraint | None,
        bias: LogitBias | None = None,
        penalties: Penalties | None = None,
    ) -> None:
        """This generation's grammar state, logit bias and penalties (None: none): a drafter
        that samples biases, penalizes and masks its q as the target's p is, so it guesses only
        what the grammar allows and what the penalties leave likely. Called before ``begin``."""

    def candidates(self, context: Sequence[int]) -> list[Candidate]:
        """What this drafter can offer after ``context`` (all tokens so far), best first."""

    def propose(
        self,
        context: Sequence[int],
        candidate: Candidate,
        k: int,
        sampling: SamplingParams,
        rng: Draws,
    ) -> Proposal:
        """Up to ``k`` guesses continuing ``context``, from one of this cycle's candidates."""

    def rollback_to(self, n_accepted: int) -> None:
        """The last proposal's first ``n_accepted`` guesses survived; forget the rest."""

    def end(self, tokens: Sequence[int]) -> None:
        """The generation ended with these tokens, its prompt's and its own (a suffix cache
        keeps them for the next)."""


def common_prefix(a: Sequence[object], b: Sequence[object]) -> int:
    """How many items two sequences share from their start (tokens, a chat's messages)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def reuse_prefix_cache(
    model: Model, held: list[int], wanted: list[int], n_logits: int = 0
) -> tuple[int, Rows]:
    """Make the model's cache hold ``wanted``, keeping the prefix it shares with ``held`` (what
    the cache holds now; empty: start from nothing; a recurrent model always starts from
    nothing, since its state cannot go back that far). Returns how many tokens were reused and
    the logits of the last ``n_logits`` rows (those rows are always decoded again)."""
    keep = min(common_prefix(held, wanted), len(wanted) - n_logits)
    if not model.rollback_anywhere:
        keep = 0
    if keep:
        model.rollback(keep)
    else:
        model.reset()
    return keep, model.decode(wanted[keep:], n_logits)
