"""What specgen keeps on disk: read whole or as the default, written whole or not at all."""

from __future__ import annotations

import os
from pathlib import Path

from specgen.host import store


def test_a_record_is_read_or_the_default(tmp_path: Path) -> None:
    record = tmp_path / "kind" / "key.json"
    assert store.read_json(record, {"nothing": True}) == {"nothing": True}  # missing
    record.parent.mkdir()
    record.write_text("{half a reco")
    assert store.read_json(record, []) == []  # not JSON: as if missing
    record.write_bytes(b"\xff\xfe not text")
    assert store.read_json(record) is None and store.read_text(record) is None
    assert store.write_json(record, {"a": [1, 2.5]})
    assert store.read_json(record) == {"a": [1, 2.5]}


def test_a_write_replaces_the_record_whole_and_leaves_nothing_beside_it(tmp_path: Path) -> None:
    record = store.path("costs", "abc")
    assert record == Path(os.environ["SPECGEN_CACHE"]) / "costs" / "abc.json"
    assert store.write_json(record, {"first": 1})
    assert store.write_json(record, {"second": 2}, indent=1, sort_keys=True)
    assert record.read_text() == '{\n "second": 2\n}'
    assert [p.name for p in record.parent.iterdir()] == ["abc.json"]


def test_a_cache_that_cannot_be_written_is_not_an_error() -> None:
    # /proc takes no new folders, whoever asks (root ignores file modes)
    assert store.write_text(Path("/proc/specgen-cannot-be-here/stamp"), "x") is False
    assert store.write_json(Path("/proc/specgen-cannot-be-here.json"), {}) is False


def test_keys_name_texts_and_files_as_they_are_now(tmp_path: Path) -> None:
    assert store.text_key("a", "b") == store.text_key("a", "b") != store.text_key("a\0b", "")
    assert len(store.text_key("x")) == 16
    model = tmp_path / "m.gguf"
    model.write_bytes(b"one")
    before = store.file_key(model)
    assert store.file_key(model) == before
    model.write_bytes(b"other bytes")  # the same path, another file
    assert store.file_key(model) != before
