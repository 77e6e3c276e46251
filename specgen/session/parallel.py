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

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from specgen.drafters import common_prefix
from specgen.engine import SpeculativeEngine
from specgen.engine.streams import Streams
from specgen.lookahead import BatchLoad
from specgen.session.pair import Pair

Ends = Literal["together", "waves", "open"]
# A place freed is taken again when a request arrives within this many seconds of it (a
# client that sends its next request as soon as it has its answer).
REFILL_SECONDS = 0.5


def balance(load: BatchLoad, ends: Ends, waiting: bool, refilled: bool = False) -> None:
    """Tell ``load`` which of its sequences should end together (``waiting``: a generation
    waits for a slot), by ``ends``:

    - ``together``: all of them once nothing waits (``BatchLoad.closed``: the last of a file's
      prompts has started);
    - ``waves``: while nothing waits and a place that freed stayed free (``refilled`` false,
      ``Refills``), those that arrived together (``BatchLoad.waves``). A server's burst
      (parallel tool calls, a batch of requests) takes as long as its slowest request, so one
      ahead guessing ends nothing sooner for its sender and lengthens every pass the others
      share. A request that arrived alone guesses for its own latency; with requests waiting,
      or clients that send their next as soon as they have an answer, each one that ends
      sooner lets the next in sooner;
    - ``open``: never; every sequence guesses for itself.
    """
    load.closed = ends == "together" and not waiting
    load.waves = ends == "waves" and not waiting and not refilled


@dataclass
class Refills:
    """Whether the places that free up are taken again at once: a server's clients that each
    send their next request as soon as they have an answer keep the batch full, so one that
    ends sooner lets the next start sooner. A place counts as taken again when a request that
    came after the pass that freed it began arrives within ``REFILL_SECONDS`` of its end (one
    that waited in the queue before says nothing of its client); they are not once any place
    stays free that long. Until a place has freed, nothing says that a burst's sender waits
    for all of it: clients that started together and each send their next as soon as they
    have an answer look the same, and holding the first burst's leaders back costs them a
    whole request's lead. So a first burst counts as refilled until one of its places stays
    free."""

    # Each place freed and not taken yet, oldest first: when the pass that freed it began and
    # ended (seconds).
    free_places: deque[tuple[float, float]] = field(default_factory=deque)
    taken: bool = True

    def free(self, began: float, ended: float, places: int = 1) -> None:
        """``places`` freed in the pass from ``began`` to ``ended``."""
        self.free_places.extend([(began, ended)] * places)

    def arrive(self, at: float) -> None:
        """A request that arrived at ``at`` takes a place (the oldest freed)."""
        if not self.free_places:
            return
        began, ended = self.free_places.popleft()
        if at >= began:  # not one that waited for the place
            self.taken = at - ended <= REFILL_SECONDS

    def refilled(self, now: float) -> bool:
        """Whether places are taken again as they free up, as of ``now``."""
        if self.free_places and now - self.free_places[0][1] > REFILL_SECONDS:
            self.taken = False
            self.free_places.clear()
        return self.taken


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

    def start(
        self,
        work: Callable[[SpeculativeEngine], None],
        key: Sequence[Any] = (),
        arrived: float | None = None,
    ) -> bool:
        """Run ``work`` with a free slot's engine from the next step on (False: none free): the
        slot whose last request shares most of ``key``'s start. ``arrived``: when its request
        came, on the pair's clock (None: now; ``BatchLoad.arrive``). The slot is free again
        when ``work`` returns or raises; ``work`` handles its own errors."""
        slot = self.best_slot(key)
        if slot is None:
            return False
        self.free.remove(slot)
        self._keys[slot] = key
        self.load.arrive(slot, self.pair.clock() if arrived is None else arrived)
        engine = self.engines[slot]

        def task() -> None:
            try:
                work(engine)
            finally:
                self.free.append(slot)

        self.streams.add(task)
        return True

    def run(
        self, works: Iterable[Callable[[SpeculativeEngine], None]], at_once: int | None = None
    ) -> None:
        """Start each of ``works`` (in order, taken as slots free up) with at most ``at_once``
        running (None: every slot), and step until all have ended: all end together once the
        last has started (``balance``, ``together``)."""
        limit = self.size if at_once is None else at_once
        pending = iter(works)
        waiting = next(pending, None)  # one ahead: the batch knows when none is left to join
        while True:
            while waiting is not None and self.busy < limit:
                self.start(waiting)
                waiting = next(pending, None)
            balance(self.load, "together", waiting is not None)
            if not self.step() and waiting is None:
                return

    def step(self) -> bool:
        """One batched decode (``Streams.step``); False once no generation runs."""
        return self.streams.step()

    def close(self) -> None:
        """Every generation still running is ended; the contexts decode at once again."""
        self.streams.close()
        self.free = list(range(self.size))
