"""Everything specgen keeps on disk between runs: where it lives, under which key, and how.

One folder (``cache_root``: $SPECGEN_CACHE, else the user cache folder) holds what specgen builds
and remembers: fetched and converted models, the costs ``-k auto`` measured, what ``specgen
bench`` found, the CPU self-test's verdicts, vocabulary checks and sha256 checks already done.
Keys are short hashes: of texts (``text_key``) or of files as they are now (``file_key``: a
replaced file is a new key). A record is read whole or not at all (``read_json``: anything
unreadable is the default) and written whole or not at all (``write_json``: a reader never sees
half a file). A cache that cannot be written only means the work is done again next time, so
writes say whether they succeeded and never raise.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any


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
