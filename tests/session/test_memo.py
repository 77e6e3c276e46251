"""The bench memo: one file per models and machine settings, found by ``run`` for its own
settings and by ``doctor`` whatever the threads bench ran with."""

from __future__ import annotations

from tests.conftest import FakePair


def test_doctor_finds_what_bench_found_at_any_threads(fake_pair: FakePair) -> None:
    from specgen.models.registry import Registry
    from specgen.session.choice import choose
    from specgen.session.memo import Finding, found_for, memo_path, recall, remember

    registry = Registry.load()
    choice = choose(registry, None, str(fake_pair.target), str(fake_pair.draft))
    other = choose(registry, None, str(fake_pair.draft), str(fake_pair.draft))
    one_thread = memo_path(choice, 1, -1)
    assert one_thread != memo_path(choice, 2, -1)  # run finds only its own settings' verdict
    remember(one_thread, [Finding(0.0, 4, 1.5, 0.2)], "2026-12-03")
    assert recall(memo_path(choice, 2, -1), 0.0) is None
    assert recall(one_thread, 0.0) is not None
    found = found_for(choice)
    assert found["greedy"]["variant"] == 4 and found["greedy"]["speedup"] == 1.5
    assert found_for(other) == {}  # another pair's models see none of it


def test_the_streams_bench_found_best_are_kept_beside_the_verdicts(fake_pair: FakePair) -> None:
    """``bench --streams`` keeps its best count in the same memo: a later sweep's verdicts
    keep it, the modes' verdicts never show it, and a memo without one recalls nothing."""
    from specgen.models.registry import Registry
    from specgen.session.choice import choose
    from specgen.session.memo import (
        Finding,
        found_here,
        memo_path,
        recall,
        recall_parallel,
        remember,
        remember_streams,
    )

    choice = choose(Registry.load(), None, str(fake_pair.target), str(fake_pair.draft))
    path = memo_path(choice, 2, -1)
    assert recall_parallel(path) is None
    remember_streams(path, 4, 81.5, "2026-12-04")
    remember(path, [Finding(0.8, "auto", 1.7, 0.2)], "2026-12-04")
    parallel, note = recall_parallel(path) or (0, "")
    assert parallel == 4 and "bench --streams" in note and "81.5 tok/s" in note
    assert set(found_here(path)) == {"sampled"} and recall(path, 0.8) is not None
    remember_streams(path, 2, 60.0, "2026-12-05")  # measured again: the newer count
    assert recall_parallel(path) == (2, recall_parallel(path)[1])  # type: ignore[index]
    assert recall(path, 0.8) is not None
