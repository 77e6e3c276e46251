"""``benchmarks/server_duel.py``: what an A/B of two servers' rounds can tell, and how its
servers start."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.bench import benchmark

Paired = Callable[[list[float], list[float]], tuple[float, float, float]]


@pytest.fixture(scope="module")
def paired_ratio() -> Paired:
    found: Paired = benchmark("server_duel").paired_ratio
    return found


def test_rounds_that_drift_together_give_their_one_ratio_exactly(paired_ratio: Paired) -> None:
    """The machine's drift falls on both servers of a round: the same ratio every round is
    that ratio, with no spread, however far the figures themselves moved."""
    base = [60.0, 90.0, 75.0, 120.0]
    ratio, low, high = paired_ratio(base, [1.1 * b for b in base])
    assert ratio == pytest.approx(1.1) and low == pytest.approx(1.1) and high == pytest.approx(1.1)


def test_the_interval_is_students_on_the_logarithms_of_the_rounds_ratios(
    paired_ratio: Paired,
) -> None:
    ratios = [1.2, 0.9, 1.05]
    ratio, low, high = paired_ratio([1.0] * 3, ratios)
    logs = [math.log(r) for r in ratios]
    mean = sum(logs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
    half = 4.303 * sd / math.sqrt(3)  # t at 97.5%, 2 degrees of freedom
    assert ratio == pytest.approx(math.exp(mean))
    assert (low, high) == pytest.approx((math.exp(mean - half), math.exp(mean + half)))
    assert low < 1.0 < high  # these three rounds do not tell this ratio from noise


def test_one_round_has_no_interval(paired_ratio: Paired) -> None:
    ratio, low, high = paired_ratio([50.0], [55.0])
    assert ratio == pytest.approx(1.1)
    assert (low, high) == (0.0, math.inf)


def test_a_server_is_llama_server_by_its_tree_alone() -> None:
    """``NAME@llama-server=FLAGS`` is llama-server (its tokens counted less the end); a
    specgen worktree, or flags that mention it, are not."""
    is_llama = benchmark("server_duel").is_llama
    assert is_llama("llama@llama-server=")
    assert is_llama("spec@llama-server=-md d.gguf --spec-type draft-simple")
    assert not is_llama("main=")
    assert not is_llama("old@/tmp/worktree=-k 0")
    assert not is_llama("odd=--alias x@llama-server=y")


def test_a_cold_server_starts_from_the_given_cache_every_time(tmp_path: Path) -> None:
    """A server's cache is kept from one start to the next, copied from ``--cache`` at the
    first; ``--cold`` copies it again at every start, so what one start learned is gone."""
    duel = benchmark("server_duel")
    given = tmp_path / "given"
    given.mkdir()
    (given / "costs.json").write_text("{}")
    for cold in (False, True):
        scratch = tmp_path / f"scratch-{cold}"
        scratch.mkdir()
        args = argparse.Namespace(cache=given, cold=cold)
        cache = duel.server_cache("main", args, scratch)
        assert (cache / "costs.json").read_text() == "{}"
        (cache / "costs.json").write_text('{"learned": 1}')
        again = duel.server_cache("main", args, scratch)
        assert again == cache
        assert (again / "costs.json").read_text() == ("{}" if cold else '{"learned": 1}')
