"""``Slots.run``: works started as slots free up, and the batch told when its sequences should
end together (then ``-k auto`` balances the batch's end): all once none is left to join
(``BatchLoad.closed``), or, as a server's, those started together while none waits
(``BatchLoad.waves``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from specgen.lookahead import CostBook
from specgen.session.parallel import REFILL_SECONDS, Refills, Slots, balance


class _Context:
    """A context no work decodes on."""

    n_batch = 512

    def gather(self, gather: object) -> None:
        pass

    def decode_together(self, items: Sequence[Any], pickings: object = None) -> list[Any]:
        raise AssertionError("nothing decodes here")


class _Pair:
    def __init__(self, parallel: int) -> None:
        self.parallel, self.costs = parallel, CostBook()
        self.target, self.draft, self.clock = _Context(), None, time.perf_counter

    def slot_engine(self, slot: int, load: object) -> str:
        return f"engine {slot}"


def test_the_batch_is_closed_once_the_last_work_has_started() -> None:
    slots = Slots(_Pair(2))  # type: ignore[arg-type]
    seen: list[tuple[int, bool]] = []

    def work(at: int) -> Callable[[Any], None]:
        return lambda engine: seen.append((at, slots.load.closed))

    slots.run(work(at) for at in range(5))
    assert sorted(seen) == [(0, False), (1, False), (2, False), (3, False), (4, True)]


def test_works_that_all_fit_start_closed() -> None:
    slots = Slots(_Pair(4))  # type: ignore[arg-type]
    seen: list[bool] = []
    slots.run(lambda engine: seen.append(slots.load.closed) for _ in range(3))
    assert seen == [True, True, True]


def test_every_start_is_stamped_with_when_its_request_came() -> None:
    """``Slots.start`` tells the batch when each generation arrived (a server's stamp, else
    the pair's clock now): the waves of ``BatchLoad.waves`` are made of these."""
    pair = _Pair(2)
    pair.clock = lambda: 42.0
    slots = Slots(pair)  # type: ignore[arg-type]
    assert slots.start(lambda engine: None, arrived=3.0)
    assert slots.start(lambda engine: None)
    assert slots.load._arrived == {0: 3.0, 1: 42.0}
    slots.close()


def test_places_taken_again_at_once_keep_a_servers_batch_open() -> None:
    """``Refills``: a first burst counts as refilled until one of its places stays free (its
    clients may each send their next at once); a place taken again by a request that came as
    soon as it freed (a client's next) keeps it so, until a place stays free for longer than
    ``REFILL_SECONDS``. A request that waited in the queue says nothing, and every place freed
    counts. ``balance`` leaves a server's batch open while they are refilled."""
    refills = Refills()
    assert refills.refilled(0.0), "nothing freed yet: nothing says its sender waits for all"
    refills.free(4.9, 5.0)
    assert refills.refilled(5.0 + REFILL_SECONDS / 2), "not yet: its client may be sending"
    assert not refills.refilled(5.0 + 2 * REFILL_SECONDS), "the first place freed stayed free"
    refills.free(9.9, 10.0)
    refills.arrive(10.05)
    assert refills.refilled(10.1) and refills.refilled(400.0), "taken again at once"
    refills.free(499.9, 500.0)
    assert refills.refilled(500.0 + REFILL_SECONDS / 2), "not yet: its client may be sending"
    assert not refills.refilled(500.0 + 2 * REFILL_SECONDS), "stayed free"
    refills.arrive(600.0)  # a request long after: nothing freed waits for it
    assert not refills.refilled(600.0)
    refills.free(699.9, 700.0)
    refills.arrive(700.0 + 2 * REFILL_SECONDS)
    assert not refills.refilled(701.0), "taken again, but not at once"
    # Two places free in one pass; one is taken at once, the other stays free.
    refills.free(799.9, 800.0, places=2)
    refills.arrive(800.05)
    assert refills.refilled(800.1)
    assert not refills.refilled(800.0 + 2 * REFILL_SECONDS), "the other place stayed free"
    # A request that waited in the queue (it came before the pass that freed its place).
    refills.free(899.9, 900.0)
    refills.arrive(850.0)
    assert not refills.refilled(900.1), "a queued request is no client's next"

    load = Slots(_Pair(2)).load  # type: ignore[arg-type]
    balance(load, "waves", waiting=False, refilled=False)
    assert load.waves and not load.closed
    balance(load, "waves", waiting=False, refilled=True)
    assert not load.waves
    balance(load, "waves", waiting=True, refilled=False)
    assert not load.waves
    balance(load, "together", waiting=False)
    assert load.closed and not load.waves
