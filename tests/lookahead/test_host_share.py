"""The loop's own host cost, kept with the costs (measured on a real model, and reported by
doctor: tests/integration/test_loop_cost.py; what doctor advises from it: tests/test_checks.py)."""

from __future__ import annotations

import json

import pytest

from specgen.lookahead import CostBook


def test_the_host_share_is_kept_with_the_costs() -> None:
    book = CostBook()
    for host, cycle in ((0.004, 0.1), (0.002, 0.1), (0.002, 0.1)):  # the first runs cold
        book.sampled.observe_host(host, cycle)
    again = CostBook.restore(json.loads(json.dumps(book.snapshot())))
    assert again.sampled.host_share is not None
    assert again.sampled.host_share.mean == pytest.approx(0.02)
    assert again.greedy.host_share is None
