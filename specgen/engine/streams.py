"""Many generations at once: each on its own sequence of one shared target context (and draft
context), every model pass decoding all of them together.

Each generation runs the ordinary speculative loop (``engine.loop``), unchanged, in a greenlet
of its own (a coroutine with its own stack). When it asks a model to decode, the model hands the
request here (``Context.gather``) and the generation parks; once every live generation has
parked, ``Streams`` decodes what they asked of one context in ONE batch and resumes them with
their rows. So each cycle the draft model decodes every drafting sequence's guess in one batch
per step, then one target pass verifies every sequence's ``[last, guesses]``; each sequence keeps
what its own accept rule keeps and rolls its own cache back. Under the Gumbel-max rule the
verifies' rows come picked, all of a pass's in one block (``core.coupling.PickedRows``), and
each sequence's rule compares its guesses with them. A draft context's requests go
first: a sequence that finished drafting waits for the others' drafts, and all verify in one
pass. A long prompt is cut into chunks of ``prompt_chunk`` tokens, one per pass, so a request
that joins does not stall the streams already running; a pass holds at most ``n_batch`` tokens.

The scheduler never sees a request: it runs tasks (``add``), each a function that generates on
its own sequence, and sees only decodes. It is not thread-safe: one thread runs it, and
everything it runs (``step``); the tasks' callers hand work in between steps. A task's error
ends the task (its own code reports it); one in a decode is raised in every task of that batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import numpy as np
from greenlet import GreenletExit, getcurrent, greenlet

from specgen.core.coupling import PickedRows, Picking
from specgen.core.sampling import Rows
from specgen.lookahead import BatchLoad
from specgen.lookahead.batch import FIRST_STEP_TOKENS
from specgen.stats import Clock

# Tokens of a prompt per pass, beside the other sequences' verify.
PROMPT_CHUNK = 256
# A context's cache is compacted (``Compacting``) at most so often that the compactions take
# this share of its passes' time.
COMPACT_SHARE = 0.05
# ... and once the cells freed since the last are this share of the cells held.
COMPACT_FREED = 0.1
TOO_LARGE_WAIT = 20.0  # seconds of passes before a cache too large to compact is asked again
# What a request for no tokens gives (made once: a numpy call after a decode costs).
_NO_ROWS: Rows = np.empty((0, 0), dtype=np.float32)


# Given a sequence (a model), its tokens, the rows it wants and how they may be picked, those
# rows once decoded.
Gather = Callable[[Any, list[int], int, Picking | None], Rows]
Item = tuple[Any, list[int], int]  # a sequence, its tokens, the rows it wants


class Context(Protocol):
    """A model context several sequences share (``backend.LlamaModel``, or a test fake)."""

    n_batch: int

    def gather(self, gather: Gather | None) -> None:
        """Every sequence's decode goes to ``gather`` from now on (None: at once)."""

    def decode_together(
        self, items: Sequence[Item], pickings: Sequence[Picking | None] | None = None
    ) -> list[Rows]:
        """One batch: each item's (sequence, tokens, rows wanted), at most ``n_batch`` tokens;
        ``pickings``, each item's, where its rows may come with their picks (``PickedRows``),
        computed for all of them at once."""


class Compacting(Protocol):
    """A context whose cache can be laid out again, each sequence's cells together
    (``backend.LlamaModel.compact``)."""

    compacts: bool  # whether it pays on this context (several sequences, attention on a CPU)
    freed: int  # cells rollbacks freed since the last compaction
    cells: int  # cells the sequences hold

    def compact(self) -> float | None:
        """Lay the cache out again; the seconds it took (None: too large to, not done)."""


@dataclass
class _Layout:
    """One context's compactions: seconds of its passes since the last, and what that took."""

    seconds: float = 0.0
    cost: float = 0.0


@dataclass
class _Parked:
    task: greenlet
    context: Context
    sequence: Any
    tokens: list[int]
    n_logits: int
    picking: Picking | None = None


@dataclass
class BatchStats:
    """What the scheduler did: passes per context, the sequences and tokens in each target
    pass, and its own host time (outside the models' decodes) per target pass."""

    target_passes: int = 0
    draft_passes: int = 0
    sequences: dict[int, int] = field(default_factory=dict)  # sequences in a pass -> passes
    guesses: dict[int, int] = field(default_factory=dict)  # sequences in a pass -> guesses
    tokens: int = 0  # in the target's passes
    picked: int = 0  # rows of the target's passes picked together (``PickedRows``)
    decode_seconds: float = 0.0
    host_seconds: float = 0.0
    compactions: int = 0  # of the contexts' caches (``Compacting``)
    compact_seconds: float = 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "target_passes": self.target_passes,
            "draft_passes": self.draft_passes,
            "sequences_per_pass": dict(sorted(self.sequences.items())),
            "tokens_per_pass": self.tokens / self.target_passes if self.target_passes else 0.0,
            "rows_picked_together": self.picked,
            "host_ms_per_pass": 1e3 * self.host_seconds / max(1, self.target_passes),
            "compactions": self.compactions,
            "compact_ms": 1e3 * self.compact_seconds,
        }


class Streams:
    """Runs generations side by side on sequences of ``target`` (and the ``drafts``'
    contexts), one batched decode per context per pass.

    ``load``: what ``-k auto`` prices a batch with; every target pass and draft step is timed
    into it. ``source``: what the drafts' steps are counted as (the draft model's guesses).
    """

    def __init__(
        self,
        target: Context,
        drafts: Sequence[Context] = (),
        *,
        load: BatchLoad | None = None,
        source: str = "model",
        clock: Clock = time.perf_counter,
        prompt_chunk: int = PROMPT_CHUNK,
    ) -> None:
        self.target, self.drafts = target, list(drafts)
        self.load, self.source, self.clock = load, source, clock
        self.prompt_chunk = prompt_chunk
        self.stats = BatchStats()
        self._ready: list[tuple[greenlet, object]] = []  # to resume, with what to resume with
        self._parked: list[_Parked] = []
        self._live: set[greenlet] = set()
        self._home: greenlet | None = None
        self._layouts: dict[int, _Layout] = {}  # by id(context)
        for context in (target, *self.drafts):
            context.gather(self._gatherer(context))

    def close(self) -> None:
        """Every task ended; the contexts decode at once again."""
        for task in list(self._live):
            task.throw(GreenletExit)
        self._live.clear()
        for context in (self.target, *self.drafts):
            context.gather(None)

    @property
    def busy(self) -> int:
        """Tasks running."""
        return len(self._live)

    def add(self, task: Callable[[], None]) -> None:
        """Start ``task`` at the next step, on its own greenlet."""
        runner = greenlet(task)
        self._live.add(runner)
        self._ready.append((runner, _START))

    def step(self) -> bool:
        """Resume every task that can go on, then decode one batch; False once none is live."""
        started = self.clock()
        self._home = getcurrent()
        ready, self._ready = self._ready, []
        for task, value in ready:
            self._resume(task, value)
        if not self._parked:
            self.stats.host_seconds += self.clock() - started
            return bool(self._live)
        context, batch = self._next_batch()
        try:
            compacting = self._compact(context)  # its own time, not the host's
            decoding = self.clock()
            self.stats.host_seconds += decoding - started - compacting
            items = [(p.sequence, p.tokens, p.n_logits) for p in batch]
            pickings = [p.picking for p in batch]
            rows = context.decode_together(items, pickings if any(pickings) else None)
        except Exception as err:  # the batch's tasks each see it where they decoded
            self._ready.extend((p.task, _Raise(err)) for p in batch)
            return True
        ended = self.clock()
        seconds = ended - decoding
        self.stats.decode_seconds += seconds
        self._layouts.setdefault(id(context), _Layout()).seconds += seconds
        self._count(context, batch, seconds, ended)
        if context is self.target:
            self.stats.picked += sum(len(r) for r in rows if isinstance(r, PickedRows))
        # Whole rows are views of the context's buffer, valid until its next decode: every
        # task reads its own before the next step decodes again.
        self._ready.extend((p.task, r) for p, r in zip(batch, rows, strict=True))
        return True

    def run(self) -> None:
        """Step until every task has ended."""
        while self.step():
            pass

    # -- inside a task --------------------------------------------------------------------
    def _gatherer(self, context: Context) -> Gather:
        def gather(
            sequence: Any, tokens: list[int], n_logits: int, picking: Picking | None = None
        ) -> Rows:
            home = self._home
            if home is None or getcurrent() is home:
                # Not in a task (loading, a test's own decode): decode it alone, at once.
                return context.decode_together([(sequence, tokens, n_logits)], [picking])[0]
            chunk = self.prompt_chunk
            rows = _NO_ROWS
            for start in range(0, len(tokens), chunk):
                piece = tokens[start : start + chunk]
                wanted = min(len(piece), max(0, n_logits - (len(tokens) - start - len(piece))))
                # A verify's [last, guesses] (one piece): its rows may be picked with others'.
                at = picking if len(piece) == len(tokens) else None
                self._parked.append(_Parked(getcurrent(), context, sequence, piece, wanted, at))
                rows = self._park(home)
            return rows

        return gather

    def _park(self, home: greenlet) -> Rows:
        value = home.switch()
        if isinstance(value, _Raise):
            raise value.error
        return value

    # -- between tasks -----------------------------------------------------------------------
    def _resume(self, task: greenlet, value: object) -> None:
        try:
            if value is _START:
                task.switch()
            else:
                task.switch(value)
        finally:
            if task.dead:
                self._live.discard(task)

    def _compact(self, context: Context) -> float:
        """Lay ``context``'s cache out again, each sequence's cells together, where rollbacks
        have scattered them and the compactions so far cost at most COMPACT_SHARE of its passes'
        time since the last one.

        A rollback frees cells that the next pass fills with whichever sequence comes first in
        it, and on a CPU attention reads a cache whose sequences interleave irregularly slower:
        measured with seven sequences after some cycles of guesses, the passes without any ran
        1.25x as long, and compacted every 32 passes 1.0x (``benchmarks/kv_layout.py``). A
        compaction copies every sequence's cells out and back, so it costs as the cache grows;
        its cost sets when the next one is due, so that they never take more than COMPACT_SHARE
        of the passes. Returns the seconds it took (0: none was due). An error in it reaches
        the batch's tasks as a decode's does."""
        # Not ``isinstance``: a runtime protocol reads every member, ``cells`` (llama.cpp calls)
        # too, on every pass of every context.
        if not getattr(context, "compacts", False):
            return 0.0
        compacting = cast(Compacting, context)
        layout = self._layouts.setdefault(id(context), _Layout())
        if layout.cost > COMPACT_SHARE * layout.seconds:
            return 0.0
        freed = compacting.freed
        if not freed or freed < COMPACT_FREED * compacting.cells:
            return 0.0
        done = compacting.compact()
        layout.seconds = 0.0
        if done is None:  # too large to copy now: asked again after a while
            layout.cost = COMPACT_SHARE * TOO_LARGE_WAIT
            return 0.0
        layout.cost = done
        self.stats.compactions += 1
        self.stats.compact_seconds += done
        return done

    def _next_batch(self) -> tuple[Context, list[_Parked]]:
        """The requests of one context, the drafts' first, the shortest first within
        ``n_batch`` tokens (the rest wait for the next pass), in their sequences' order.

        llama.cpp puts a batch's tokens in the shared cache's free cells in the batch's order,
        and on a CPU its attention reads each token's own cells by skipping the others': where
        every pass interleaves the sequences the same way, the skipping is regular and cheap.
        In the order the tasks parked (a drafting sequence parks later) or by length, the
        interleave changes from pass to pass and stays in the cache: measured with seven
        sequences, every later pass ran 15-20% slower (``benchmarks/kv_layout.py``)."""
        parked = self._parked
        context = next((c for c in self.drafts if any(p.context is c for p in parked)), None)
        if context is None:
            context = self.target
        mine = sorted((p for p in parked if p.context is context), key=lambda p: len(p.tokens))
        batch: list[_Parked] = []
        room = context.n_batch
        for request in mine:
            if len(request.tokens) <= room or not batch:
                batch.append(request)
                room -= len(request.tokens)
        taken = {id(p) for p in batch}
        self._parked = [p for p in parked if id(p) not in taken]
        batch.sort(key=_place)
        return context, batch

    def _count(self, context: Context, batch: list[_Parked], seconds: float, ended: float) -> None:
        stats, load = self.stats, self.load
        if context is self.target:
            n = sum(len(p.tokens) for p in batch)
            stats.target_passes += 1
            stats.tokens += n
            size = len(batch)
            stats.sequences[size] = stats.sequences.get(size, 0) + 1
            # A verify reads a row per token ([last, guesses]); a prompt's chunk one at most.
            guessed = sum(len(p.tokens) - 1 for p in batch if p.n_logits == len(p.tokens))
            stats.guesses[size] = stats.guesses.get(size, 0) + guessed
            if load is not None:
                verifies = all(p.n_logits == len(p.tokens) for p in batch)
                load.observe_target(seconds, n, verifies, ended=ended)
        else:
            stats.draft_passes += 1
            if load is not None:
                n = sum(len(p.tokens) for p in batch)
                # A step: one guess each (the first also reads a sequence's last kept guess).
                step = all(len(p.tokens) <= FIRST_STEP_TOKENS for p in batch)
                load.observe_draft(seconds, n, step, self.source, len(batch))


def _place(request: _Parked) -> int:
    """Where a request goes in its batch: by its sequence's id (``LlamaModel.seq``)."""
    return int(getattr(request.sequence, "seq", 0))


@dataclass(frozen=True)
class _Raise:
    error: Exception


_START = object()  # what a task is resumed with the first time: nothing
