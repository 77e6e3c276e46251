"""Several generations at once on one loaded pair: slots, each an engine on its own sequence of
the pair's contexts, driven side by side by ``engine.streams`` (one batched target pass per
cycle for all of them, the draft model's steps batched too).

``Slots`` is what batches, the API and the server use: ``start`` a generation on a free slot
(with the slot's engine), ``step`` until they end. Each slot keeps its engine from one
generation to the next (the costs ``-k auto`` learns are the pair's, shared by all), and the
request it last ran, so a chat that goes on is put on the slot whose caches hold its start
(``best_slot``: the engine then keeps that prefix, ``reuse_prefix``). One thread runs a
``Slots``: the generations run inside its ``step``. No terminal code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

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
        self._keys: dict[int, Sequence[Any]] = {}  # what each slot ran last

    @property
    def size(self) -> int:
        return len(self.engines)

    @property
    def busy(self) -> int:
        return self.size - len(self.free)

    def best_slot(self, key: Sequence[Any] = ()) -> int | None:
        """The free slot whose last request shares the longest start with ``key`` (a chat's
        messages, a prompt's text; None: none free)."""
        if not self.free:
            return None
        return max(self.free, key=lambda i: (common_prefix(self._keys.get(i, ()), key), -i))

    def start(self, work: Callable[[SpeculativeEngine], None], key: Sequence[Any] = ()) -> bool:
        """Run ``work`` with a free slot's engine from the next step on (False: none free): the
        slot whose last request shares most of ``key``'s start. The slot is free again when
        ``work`` returns or raises; ``work`` handles its own errors."""
        slot = self.best_slot(key)
        if slot is None:
            return False
        self.free.remove(slot)
        self._keys[slot] = key
        engine = self.engines[slot]

        def task() -> None:
            try:
                work(engine)
            finally:
                self.free.append(slot)

        self.streams.add(task)
        return True

    def run(
        self,
        works: Iterable[Callable[[SpeculativeEngine], None]],
        at_once: int | None = None,
        closes: bool = True,
    ) -> None:
        """Start each of ``works`` (in order, taken as slots free up) with at most ``at_once``
        running (None: every slot), and step until all have ended. Once the last has started
        the batch is closed (``BatchLoad.closed``: its sequences end together), unless
        ``closes`` is False: then it runs open to the end, as the server's batches do."""
        limit = self.size if at_once is None else at_once
        pending = iter(works)
        waiting = next(pending, None)  # one ahead: the batch knows when none is left to join
        while True:
            while waiting is not None and self.busy < limit:
                self.start(waiting)
                waiting = next(pending, None)
            self.load.closed = closes and waiting is None
            if not self.step() and waiting is None:
                return

    def step(self) -> bool:
        """One batched decode (``Streams.step``); False once no generation runs."""
        return self.streams.step()

    def close(self) -> None:
        """Every generation still running is ended; the contexts decode at once again."""
        self.streams.close()
        self.free = list(range(self.size))
