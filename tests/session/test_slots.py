"""``Slots.run``: works started as slots free up, and the batch told when none is left to join
(``BatchLoad.closed``: then ``-k auto`` balances the batch's end)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from specgen.lookahead import CostBook
from specgen.session.parallel import Slots


class _Context:
    """A context no work decodes on."""

    n_batch = 512

    def gather(self, gather: object) -> None:
        pass

    def decode_together(self, items: Sequence[Any]) -> list[Any]:
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
