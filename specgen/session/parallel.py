"""Several generations at once on one loaded pair: slots, each an engine on its own sequence of
the pair's contexts, driven side by side by ``engine.streams`` (one batched target pass per
cycle for all of them, the draft model's steps batched too).

``Slots`` is what batches, the API and the server use: ``start`` a generation on a free slot
(with the slot's engine), ``step`` until they end. Each slot keeps its engine from one
generation to the next (the costs ``-k auto`` learns are the pair's, shared by all), and the
text its last generation left in its caches, so a chat that goes on is put on the slot that
holds its start (``best_slot``). One thread runs a ``Slots``: the generations run inside its
``step``. No terminal code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from specgen.drafters import common_prefix
from specgen.engine import SpeculativeEngine
from specgen.engine.streams import Streams
from specgen.lookahead import BatchLoad
from specgen.session.pair import Pair


class Slots:
    """``pair.parallel`` slots generating side by side on the pair's contexts."""

    def __init__(self, pair: Pair) -> None:
        self.pair = pair
        self.load = BatchLoad(pair.costs)
        self.engines = [pair.slot_engine(i, self.load) for i in range(pair.parallel)]
        drafts = [pair.draft] if pair.draft is not None else []
        self.streams = Streams(pair.target, drafts, load=self.load, clock=pair.clock)
        self.free = list(range(pair.parallel))
        self._texts: dict[int, list[int]] = {}  # what each slot's caches held last

    @property
    def size(self) -> int:
        return len(self.engines)

    @property
    def busy(self) -> int:
        return self.size - len(self.free)

    def best_slot(self, tokens: Sequence[int] = ()) -> int | None:
        """The free slot whose caches share the longest start with ``tokens`` (None: none
        free)."""
        if not self.free:
            return None
        return max(self.free, key=lambda i: (common_prefix(self._texts.get(i, ()), tokens), -i))

    def start(self, work: Callable[[SpeculativeEngine], None], tokens: Sequence[int] = ()) -> bool:
        """Run ``work`` with a free slot's engine from the next step on (False: none free). The
        slot is free again when ``work`` returns or raises; ``work`` handles its own errors."""
        slot = self.best_slot(tokens)
        if slot is None:
            return False
        self.free.remove(slot)
        engine = self.engines[slot]

        def task() -> None:
            try:
                work(engine)
            finally:
                self._texts[slot] = engine.held
                self.free.append(slot)

        self.streams.add(task)
        return True

    def step(self) -> bool:
        """One batched decode (``Streams.step``); False once no generation runs."""
        return self.streams.step()

    def close(self) -> None:
        """Every generation still running is ended; the contexts decode at once again."""
        self.streams.close()
        self.free = list(range(self.size))
