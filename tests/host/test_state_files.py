"""Every file specgen keeps between runs carries its format's version: a file of this version
is read back as written; one of another version (older, newer, or none: written before files
had one) is set aside with one line, never read as this one and never a crash."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest

from specgen.drafters.suffix import MAGIC, VERSION, SuffixCache
from specgen.host import store
from specgen.lookahead.costs import COSTS_VERSION, CostBook
from specgen.models import selftest
from specgen.session.memo import MEMO_VERSION, Finding, found_here, recall, remember
from specgen.session.pair import PairOptions, load_pair
from tests.conftest import FakePair

# What another specgen may have left: a newer format, an older one, one from before files had
# a version, and values that only look like this version.
OTHER_VERSIONS = [
    {"schema": 99},
    {"schema": 0},
    {},
    {"schema": "1"},
    {"schema": 1.0},
    {"schema": True},
    {"schema": None},
]


def _said(capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The lines said on stderr since the last look (nothing goes to stdout)."""
    seen = capsys.readouterr()
    assert seen.out == ""
    return seen.err.splitlines()


def _set_aside(line: str, kind: str, file: Path, version: int) -> bool:
    """Whether ``line`` is the one a file of another version is set aside with."""
    return line.startswith(f"{file} is a {kind} file of another specgen version (") and (
        line.endswith(f"; this one reads {version}): not used, made anew")
    )


# -- the convention (``store``) -----------------------------------------------------------------
def test_a_record_is_written_with_its_version_and_read_back_without_it(tmp_path: Path) -> None:
    record = tmp_path / "kind" / "key.json"
    assert store.write_versioned(record, 3, {"a": [1, 2.5]})
    assert json.loads(record.read_text()) == {"schema": 3, "a": [1, 2.5]}
    assert store.read_versioned(record, "test", 3) == {"a": [1, 2.5]}
    with pytest.raises(AssertionError):  # the version's key is no record's own
        store.write_versioned(record, 3, {"schema": 2})


@pytest.mark.parametrize("other", OTHER_VERSIONS)
def test_a_record_of_another_version_is_set_aside_in_one_line(
    other: dict[str, object], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = tmp_path / "key.json"
    record.write_text(json.dumps({**other, "a": 1}))
    said: list[str] = []
    assert store.read_versioned(record, "test", 1, said.append) is None
    assert len(said) == 1 and _set_aside(said[0], "test", record, 1)
    assert _said(capsys) == []  # told to ``say``, not stderr
    for _ in range(2):  # by default on stderr, once in a process however often it is read
        assert store.read_versioned(record, "test", 1) is None
    assert _said(capsys) == said


def test_a_record_that_is_not_an_object_of_ours_is_set_aside_and_junk_is_as_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = tmp_path / "key.json"
    record.write_text("[1, 2]")
    assert store.read_versioned(record, "test", 1) is None
    (line,) = _said(capsys)
    assert "(no schema; this one reads 1)" in line
    record.write_text('{"schema": 99')  # cut short: not JSON, as if missing (as it always was)
    assert store.read_versioned(record, "test", 1) is None
    assert store.read_versioned(tmp_path / "none.json", "test", 1) is None
    assert _said(capsys) == []


# -- the costs ``-k auto`` remembers (``specgen.lookahead.costs``) ------------------------------
def _learned() -> CostBook:
    book = CostBook()
    for _ in range(3):
        book.greedy.observe("model", 4, 0.008, 0.015)
    book.sampled.observe(None, 0, 0.0, 0.011)
    return book


def test_the_costs_round_trip_with_their_version(tmp_path: Path) -> None:
    file = store.path("costs", "pair")
    assert store.write_versioned(file, COSTS_VERSION, _learned().snapshot())
    assert json.loads(file.read_text())["schema"] == COSTS_VERSION
    kept = store.read_versioned(file, "costs", COSTS_VERSION)
    assert kept is not None
    assert CostBook.restore(kept).snapshot() == _learned().snapshot()


@pytest.mark.parametrize("other", [{"schema": COSTS_VERSION + 1}, {}])
def test_costs_of_another_version_are_not_used(
    other: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    file = store.path("costs", "pair")
    file.parent.mkdir(parents=True)
    file.write_text(json.dumps({**other, **_learned().snapshot()}))
    assert store.read_versioned(file, "costs", COSTS_VERSION) is None
    (line,) = _said(capsys)
    assert _set_aside(line, "costs", file, COSTS_VERSION)


# -- what ``specgen bench`` found (``specgen.session.memo``) ------------------------------------
GREEDY_FOUND = Finding(temperature=0.0, variant=3, speedup=2.0, cost_ratio=0.1)


def test_the_bench_memo_round_trips_with_its_version(capsys: pytest.CaptureFixture[str]) -> None:
    file = store.path("bench", "pair")
    remember(file, [GREEDY_FOUND], "2026-12-01")
    remember(file, [Finding(temperature=0.8, variant="ngram")], "2026-12-02")  # kept beside
    written = json.loads(file.read_text())
    assert written["schema"] == MEMO_VERSION and set(written) == {"schema", "greedy", "sampled"}
    greedy = recall(file, 0.0)
    assert greedy is not None and greedy["variant"] == 3 and greedy["date"] == "2026-12-01"
    sampled = recall(file, 0.8)
    assert sampled is not None and sampled["variant"] == "ngram"
    assert set(found_here(file)) == {"greedy", "sampled"}  # what doctor shows
    assert _said(capsys) == []


@pytest.mark.parametrize("other", [{"schema": MEMO_VERSION + 1}, {"schema": 0}, {}])
def test_a_bench_memo_of_another_version_is_not_used_and_is_made_anew(
    other: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    file = store.path("bench", "pair")
    file.parent.mkdir(parents=True)
    file.write_text(json.dumps({**other, "greedy": {"variant": 5}, "sampled": {"variant": 2}}))
    assert recall(file, 0.0) is None and recall(file, 0.8) is None and found_here(file) == {}
    (line,) = _said(capsys)
    assert _set_aside(line, "bench memo", file, MEMO_VERSION)
    remember(file, [GREEDY_FOUND], "2026-12-01")  # overwritten: nothing of the old one kept
    assert json.loads(file.read_text())["schema"] == MEMO_VERSION
    assert recall(file, 0.8) is None
    greedy = recall(file, 0.0)
    assert greedy is not None and greedy["variant"] == 3
    assert _said(capsys) == []  # said once


# -- the CPU self-test's verdicts (``specgen.models.selftest``) ---------------------------------
PASSES = [sys.executable, "-c", "pass"]
DIES_OF_SIGILL = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGILL)"]


@pytest.fixture
def model_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A file with a GGUF header that says Q4_K_M (the self-test keys on quantization), with
    the self-test on."""
    monkeypatch.setenv("SPECGEN_SELFTEST", "1")
    name = b"general.file_type"
    path = tmp_path / "m.gguf"
    path.write_bytes(
        b"GGUF"
        + struct.pack("<IQQ", 3, 0, 1)
        + struct.pack("<Q", len(name))
        + name
        + struct.pack("<II", 4, 15)
    )
    return path


def _verdict_file(model: Path) -> Path:
    return selftest._stamp(list(selftest.quant_types([model])))


def test_a_cpu_verdict_round_trips_with_its_version(model_file: Path) -> None:
    assert selftest.ensure_cpu_works([model_file], command=PASSES).ok
    assert json.loads(_verdict_file(model_file).read_text())["schema"] == selftest.VERDICT_VERSION
    assert selftest.cached_verdict([model_file]) == selftest.CpuVerdict(True)
    assert selftest.ensure_cpu_works([model_file], command=DIES_OF_SIGILL).ok  # not asked again


@pytest.mark.parametrize("other", [{"schema": selftest.VERDICT_VERSION + 1}, {}])
def test_a_cpu_verdict_of_another_version_is_not_used_and_the_cpu_tested_again(
    other: dict[str, object], model_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = _verdict_file(model_file)
    file.parent.mkdir(parents=True)
    file.write_text(json.dumps({**other, "ok": False, "signal": "SIGILL", "detail": ""}))
    assert selftest.cached_verdict([model_file]) is None  # misread, it would stop the run
    (line,) = _said(capsys)
    assert _set_aside(line, "CPU self-test", file, selftest.VERDICT_VERSION)
    assert selftest.ensure_cpu_works([model_file], command=PASSES).ok  # tested again, kept
    assert json.loads(file.read_text())["schema"] == selftest.VERDICT_VERSION
    assert selftest.cached_verdict([model_file]) == selftest.CpuVerdict(True)


# -- the lookup cache (``specgen.drafters.suffix``, ``--lookup-cache FILE``) --------------------
def _lookups(file: Path) -> SuffixCache:
    cache = SuffixCache(vocabulary="vocab-a")
    cache.add(list(range(1, 13)))
    cache.save(file)
    return cache


def test_the_lookup_cache_round_trips_with_its_version(tmp_path: Path) -> None:
    file = tmp_path / "lookups.bin"
    _lookups(file)
    assert file.read_bytes().startswith(b"SPECGEN-SUFFIX-%d\n" % VERSION) and VERSION == 1
    again = SuffixCache(vocabulary="vocab-a")
    assert again.load(file) is None and again.tokens == 12


@pytest.mark.parametrize("other", [VERSION + 1, 0, 10])
def test_a_lookup_cache_of_another_version_is_left_alone_in_one_line(
    other: int, tmp_path: Path
) -> None:
    file = tmp_path / "lookups.bin"
    _lookups(file)
    file.write_bytes(file.read_bytes().replace(MAGIC, b"SPECGEN-SUFFIX-%d\n" % other, 1))
    fresh = SuffixCache(vocabulary="vocab-a")
    said = fresh.load(file)
    assert said == (
        f"{file} is a lookup cache of another specgen version (format {other}; this one reads "
        f"{VERSION}): left alone"
    )
    assert fresh.tokens == 0
    for unversioned in (b"SPECGEN-SUFFIX\n", b"SPECGEN-SUFFIX-", b""):  # no version: not ours
        file.write_bytes(unversioned)
        said = SuffixCache(vocabulary="vocab-a").load(file)
        assert said and "not a lookup cache specgen can read" in said


def test_a_pair_never_overwrites_a_lookup_cache_of_another_version(
    tmp_path: Path, fake_pair: FakePair
) -> None:
    file = tmp_path / "lookups.bin"
    _lookups(file)
    newer = file.read_bytes().replace(MAGIC, b"SPECGEN-SUFFIX-%d\n" % (VERSION + 1), 1)
    file.write_bytes(newer)
    pair = load_pair(fake_pair.target, fake_pair.draft, PairOptions(lookup_file=file), ngram=True)
    (note,) = pair.notes
    assert "lookup cache of another specgen version" in note
    assert pair.lookup is not None and pair.lookup.tokens == 0
    pair.lookup.add(list(range(10)))
    pair.remember_costs()
    assert file.read_bytes() == newer


# -- after remembered.py, pair.py, bench/runner.py, checks.py and hub.py write versioned files --
def test_a_pair_keeps_its_costs_with_their_version_and_sets_others_aside(
    fake_pair: FakePair,
) -> None:
    options = PairOptions(n_ctx=256, target_threads=2, draft_threads=2)
    first = load_pair(fake_pair.target, fake_pair.draft, options)
    assert first.costs_file is not None and first.notes == []
    first.costs.greedy.observe("model", 4, 0.008, 0.015)
    first.costs.greedy.observe("model", 4, 0.008, 0.015)
    first.remember_costs()
    written = json.loads(first.costs_file.read_text())
    assert written["schema"] == COSTS_VERSION and "greedy" in written
    again = load_pair(fake_pair.target, fake_pair.draft, options)
    assert again.notes == [] and again.costs.greedy.verify_by_n
    for other in ({"schema": COSTS_VERSION + 1}, {}):
        first.costs_file.write_text(json.dumps({**other, **first.costs.snapshot()}))
        aside = load_pair(fake_pair.target, fake_pair.draft, options)
        (note,) = aside.notes  # said the way a bad lookup cache is: run and serve show it
        assert _set_aside(note, "costs", first.costs_file, COSTS_VERSION)
        assert not aside.costs.greedy.verify_by_n


def test_rollback_facts_round_trip_with_their_version(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from specgen.session.remembered import (
        ROLLBACK_VERSION,
        remember_rollbacks,
        remembered_rollbacks,
        rollback_path,
    )

    target = tmp_path / "t.gguf"
    target.write_bytes(b"weights")
    remember_rollbacks(target, {"snapshots": 4, "checkpoint": 2})
    file = rollback_path(target)
    assert json.loads(file.read_text())["schema"] == ROLLBACK_VERSION
    assert remembered_rollbacks(target) == {"snapshots": 4, "checkpoint": 2}
    file.write_text(json.dumps({"snapshots": 4, "checkpoint": 2}))  # before files had one
    assert remembered_rollbacks(target) == {}
    (line,) = _said(capsys)
    assert _set_aside(line, "rollback", file, ROLLBACK_VERSION)


def test_hub_sizes_round_trip_with_their_version(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from specgen.models import hub

    monkeypatch.setattr(hub, "offline", lambda: True)  # nothing asked: only what is kept
    spec = ("org/repo", "m.gguf", None)
    file = store.cache_root() / "hub-sizes.json"
    assert store.write_versioned(file, hub.HUB_SIZES_VERSION, {"org/repo@main:m.gguf": 123})
    assert hub.remote_sizes([spec]) == {spec: 123}
    file.write_text(json.dumps({"org/repo@main:m.gguf": 123}))
    assert hub.remote_sizes([spec]) == {}
    (line,) = _said(capsys)
    assert _set_aside(line, "Hub sizes", file, hub.HUB_SIZES_VERSION)
