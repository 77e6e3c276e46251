"""Everything specgen keeps on disk between runs: where it lives, under which key, and how.

One folder (``cache_root``: $SPECGEN_CACHE, else the user cache folder) holds what specgen builds
and remembers: fetched and converted models, the costs ``-k auto`` measured, what ``specgen
bench`` found, the CPU self-test's verdicts, vocabulary checks and sha256 checks already done.
Keys are short hashes: of texts (``text_key``) or of files as they are now (``file_key``: a
replaced file is a new key). A record is read whole or not at all (``read_json``: anything
unreadable is the default) and written whole or not at all (``write_json``: a reader never sees
half a file). A cache that cannot be written only means the work is done again next time, so
writes say whether they succeeded and never raise.

Every JSON record carries its format's version, a top-level ``"schema"`` (``write_versioned``;
each format's number is a constant beside the code that owns it). A record of another version,
older, newer or none (written before records had one), is never read as this one: it is set
aside with one line (``read_versioned``) and made anew, as a record that is not JSON is.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

SCHEMA = "schema"  # the top-level key of a record's format version


def cache_root() -> Path:
    """Where specgen keeps what it builds: $SPECGEN_CACHE, else the user cache folder."""
    env = os.environ.get("SPECGEN_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "specgen"


def path(kind: str, key: str, suffix: str = ".json") -> Path:
    """The file of one record: ``cache_root()/kind/key`` + ``suffix``."""
    return cache_root() / kind / f"{key}{suffix}"


def newest(kind: str, prefix: str, suffix: str = ".json") -> Path | None:
    """The record of ``kind`` whose key starts with ``prefix`` written last (None: none): what
    was kept for some models whatever the settings that make up the rest of its key."""
    folder = cache_root() / kind
    kept = sorted(folder.glob(f"{prefix}*{suffix}"), key=lambda f: f.stat().st_mtime)
    return kept[-1] if kept else None


def text_key(*parts: str) -> str:
    """A short, stable key for a list of texts (cache folder and file names)."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def file_key(*paths: Path) -> str:
    """A short key that changes when any of these files is replaced (path, size, mtime)."""
    parts = []
    for one in paths:
        real = one.resolve()
        stat = real.stat()
        parts.append(f"{real}:{stat.st_size}:{stat.st_mtime_ns}")
    return text_key(*parts)


def sha256_of(file: Path) -> str:
    digest = hashlib.sha256()
    with file.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_text(file: Path) -> str | None:
    """The file's text, or None where it is missing or unreadable."""
    try:
        return file.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def read_json(file: Path, default: Any = None) -> Any:
    """The JSON value kept in ``file``, or ``default`` where it is missing or not JSON."""
    text = read_text(file)
    if text is None:
        return default
    try:
        return json.loads(text)
    except ValueError:
        return default


def write_text(file: Path, text: str) -> bool:
    """Keep ``text`` in ``file``: written whole to a file of its own, then renamed over it, so
    a reader never sees half. False where the cache cannot be written (nothing is raised)."""
    partial = file.with_name(f"{file.name}.{os.getpid()}.tmp")
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(text)
        partial.replace(file)
    except OSError:
        try:
            partial.unlink(missing_ok=True)
        except OSError:
            pass
        return False
    return True


def write_json(file: Path, value: Any, indent: int | None = None, sort_keys: bool = False) -> bool:
    """``write_text`` of a JSON value."""
    return write_text(file, json.dumps(value, indent=indent, sort_keys=sort_keys))


def write_versioned(
    file: Path,
    version: int,
    data: Mapping[str, Any],
    indent: int | None = None,
    sort_keys: bool = False,
) -> bool:
    """``write_json`` of a record of format ``version``: ``data`` with ``"schema": version``."""
    assert SCHEMA not in data, f"{SCHEMA!r} is the format's version, not a key of a record"
    return write_json(file, {SCHEMA: version, **data}, indent=indent, sort_keys=sort_keys)


def read_versioned(
    file: Path, kind: str, version: int, say: Callable[[str], None] | None = None
) -> dict[str, Any] | None:
    """The record ``write_versioned`` kept in ``file`` at this ``version`` (without its
    ``"schema"``); None where it is missing, not JSON, or of another version. Another version
    is said in one line, to ``say`` (default: stderr, once per file and version in a process),
    naming the ``kind`` of record."""
    found = read_json(file)
    if found is None:
        return None  # missing or not JSON: made anew, as it always was
    kept = found.get(SCHEMA) if isinstance(found, dict) else None
    if type(kept) is int and kept == version:  # not True, not 1.0
        return {key: value for key, value in found.items() if key != SCHEMA}
    mark = "no schema" if kept is None else f"schema {json.dumps(kept)}"
    (say or _say_once)(
        f"{file} is a {kind} file of another specgen version ({mark}; this one reads "
        f"{version}): not used, made anew"
    )
    return None


_said: set[str] = set()


def _say_once(line: str) -> None:
    """One line on stderr, said once in a process (a record may be read more than once)."""
    if line not in _said:
        _said.add(line)
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
