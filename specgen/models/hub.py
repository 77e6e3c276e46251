"""Downloads from the Hugging Face Hub through ``huggingface_hub``.

Files land in the standard Hugging Face cache (shared with every other tool: a model another tool
already fetched is not fetched again). This module adds what a model runner needs on top: globs
and split GGUFs, Rich progress bars on stderr, offline mode, and one-line messages for the Hub's
errors. ``HF_TOKEN``, ``HF_ENDPOINT``, ``HF_HOME`` and ``HF_HUB_OFFLINE`` are honoured as
huggingface_hub honours them.
"""

from __future__ import annotations

import errno
import fnmatch
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import huggingface_hub
from huggingface_hub import constants as hf_constants
from huggingface_hub import errors as hf_errors
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from specgen.errors import UserError

# The format of hub-sizes.json (``store.write_versioned``): a size, or when asking failed, by
# ``repo@revision:file``. Another number is set aside and the sizes asked again.
HUB_SIZES_VERSION = 1
_SPLIT = re.compile(r"^(?P<stem>.*)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")
_RemoteEntryNotFound = getattr(hf_errors, "RemoteEntryNotFoundError", hf_errors.EntryNotFoundError)


def offline() -> bool:
    return bool(hf_constants.HF_HUB_OFFLINE)


def _is_glob(name: str) -> bool:
    return any(c in name for c in "*?[")


def split_parts(name: str) -> list[str]:
    """All parts of a split GGUF named by any of its parts (a plain name: just itself)."""
    match = _SPLIT.match(name)
    if not match:
        return [name]
    count = int(match["count"])
    return [f"{match['stem']}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


@contextmanager
def hub_errors(repo: str, name: str) -> Iterator[None]:
    """Turn the Hub's exceptions into one line that says what to do next."""
    try:
        yield
    except hf_errors.GatedRepoError as err:
        raise UserError(
            f"{repo} is gated: accept its license at https://huggingface.co/{repo}, "
            f"then set HF_TOKEN to a read token"
        ) from err
    except hf_errors.RepositoryNotFoundError as err:
        raise UserError(
            f"repository {repo} not found on the Hub (check the name; a private "
            f"repository needs HF_TOKEN)"
        ) from err
    except hf_errors.RevisionNotFoundError as err:
        raise UserError(
            f"revision not found in {repo}: check the 'revision' of this model"
        ) from err
    except hf_errors.LocalEntryNotFoundError as err:
        if offline():
            raise UserError(
                f"{repo}:{name} is not in the cache and offline mode is on "
                f"(HF_HUB_OFFLINE=1); unset it and run `specgen models pull` "
                f"once with a network"
            ) from err
        raise UserError(
            f"could not reach the Hub for {repo}:{name}, and it is not cached: "
            f"check the network (or HF_ENDPOINT)"
        ) from err
    except _RemoteEntryNotFound as err:
        raise UserError(
            f"no file {name} in {repo}: check the file name (names are case-sensitive)"
        ) from err
    except _network_errors() as err:
        raise UserError(
            f"could not reach the Hub for {repo}:{name} ({type(err).__name__}), and "
            f"it is not cached: check the network (or HF_ENDPOINT)"
        ) from err
    except hf_errors.HfHubHTTPError as err:
        raise UserError(f"the Hub refused {repo}:{name}: {str(err).splitlines()[0]}") from err
    except OSError as err:  # a broken connection after retries, a full disk
        if err.errno == errno.ENOSPC:
            raise UserError(
                f"the disk is full while downloading {repo}:{name}: free some "
                f"space in {hf_constants.HF_HUB_CACHE} (or set HF_HOME elsewhere) "
                f"and run again; the download resumes where it stopped"
            ) from err
        raise UserError(
            f"downloading {repo}:{name} failed: {err}; run the command again to resume"
        ) from err


def _network_errors() -> tuple[type[BaseException], ...]:
    """The HTTP library's transport errors (no connection, timeouts), whichever library this
    huggingface_hub uses (httpx, its vendored httpx2; requests' are OSErrors already)."""
    found = []
    for module in ("httpx2", "httpx"):
        loaded = sys.modules.get(module)
        if loaded is not None and hasattr(loaded, "TransportError"):
            found.append(loaded.TransportError)
    return tuple(found)


def resolve_names(repo: str, pattern: str, revision: str | None = None) -> list[str]:
    """The file names a pattern stands for: one file, or all parts of a split GGUF."""
    if _is_glob(pattern):
        with hub_errors(repo, pattern):
            names = _list_files(repo, revision)
        matches = sorted(n for n in names if fnmatch.fnmatch(n, pattern))
        firsts = sorted({split_parts(n)[0] for n in matches})
        if not firsts:
            raise UserError(f"no file in {repo} matches {pattern!r}")
        if len(firsts) > 1:
            raise UserError(
                f"{pattern!r} matches several models in {repo}: {', '.join(firsts[:5])}; name one"
            )
        pattern = firsts[0]
    return split_parts(pattern)


def _list_files(repo: str, revision: str | None) -> list[str]:
    if offline():
        return _cached_names(repo, revision)
    return huggingface_hub.list_repo_files(repo, revision=revision)


def _cached_names(repo: str, revision: str | None) -> list[str]:
    folder = Path(hf_constants.HF_HUB_CACHE) / f"models--{repo.replace('/', '--')}"
    ref = folder / "refs" / (revision or "main")
    commit = ref.read_text().strip() if ref.is_file() else (revision or "")
    snapshot = folder / "snapshots" / commit
    if not commit or not snapshot.is_dir():
        raise hf_errors.LocalEntryNotFoundError(f"{repo} is not cached")
    return [p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if not p.is_dir()]


def cached_file(repo: str, pattern: str, revision: str | None = None) -> Path | None:
    """The local path if every part is in the cache, else None; never touches the network."""
    try:
        names = split_parts(pattern) if not _is_glob(pattern) else None
        if names is None:
            cached = _cached_names(repo, revision)
            matches = sorted(n for n in cached if fnmatch.fnmatch(n, pattern))
            if not matches:
                return None
            names = split_parts(matches[0])
    except hf_errors.LocalEntryNotFoundError:
        return None
    paths = []
    for name in names:
        found = huggingface_hub.try_to_load_from_cache(repo, name, revision=revision)
        if not isinstance(found, str):
            return None
        paths.append(Path(found))
    return paths[0]


def download(
    repo: str,
    pattern: str,
    revision: str | None = None,
    progress: bool = True,
    console: Console | None = None,
) -> Path:
    """Fetch a model file (every part of a split GGUF) into the HF cache; the first part's path."""
    names = resolve_names(repo, pattern, revision)
    console = console or Console(stderr=True)
    show = progress and console.is_terminal
    paths = []
    with _progress(console, show) as bar_class:
        for name in names:
            bar_class.label = name
            # A cached file needs no download of ours; hf_hub_download still checks for a newer
            # revision when the Hub answers, and falls back to the cache when it does not.
            missing = not offline() and cached_file(repo, name, revision) is None
            if missing and not show:
                console.print(f"downloading {repo}:{name}", highlight=False, soft_wrap=True)
            with hub_errors(repo, name):
                if missing:
                    _fetch_blob(repo, name, revision, bar_class)
                paths.append(
                    Path(
                        huggingface_hub.hf_hub_download(
                            repo, name, revision=revision, tqdm_class=bar_class
                        )
                    )
                )
    return paths[0]


def _fetch_blob(repo: str, name: str, revision: str | None, bar_class: Any) -> None:
    """Download a file's blob into the HF cache, resuming a download that was cut off earlier.

    huggingface_hub 2.x writes each download to a file unique to its process and throws it away
    on failure, so a Ctrl-C or a crash restarts a multi-gigabyte download from zero. Here the
    partial file is ``blobs/<etag>.incomplete`` (the name older huggingface_hub versions resume
    from too) and a later run continues it with a Range request. ``hf_hub_download`` then finds
    the blob in place and only adds the snapshot link and the ref: the cache layout stays the
    standard one.
    """
    from filelock import FileLock
    from huggingface_hub.file_download import http_get, repo_folder_name
    from huggingface_hub.utils import build_hf_headers

    headers = build_hf_headers()
    url = huggingface_hub.hf_hub_url(repo, name, revision=revision)
    meta = huggingface_hub.get_hf_file_metadata(url, headers=headers)
    if not meta.etag:
        return  # let hf_hub_download deal with an odd server
    storage = Path(hf_constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo, repo_type="model")
    blob = storage / "blobs" / meta.etag
    if blob.exists():
        return
    blob.parent.mkdir(parents=True, exist_ok=True)
    partial = blob.with_name(f"{meta.etag}.incomplete")
    lock = Path(hf_constants.HF_HUB_CACHE) / ".locks" / storage.name / f"{meta.etag}.specgen.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(lock)):
        if blob.exists():
            return
        done = partial.stat().st_size if partial.exists() else 0
        if meta.size is not None and done > meta.size:
            partial.unlink()
            done = 0
        with partial.open("ab") as out:
            http_get(
                meta.location or url,
                out,
                resume_size=done,
                headers=headers,
                expected_size=meta.size,
                tqdm_class=bar_class,
            )
        partial.replace(blob)


@contextmanager
def _progress(console: Console, show: bool) -> Iterator[Any]:
    """A tqdm-shaped class for huggingface_hub, drawing on one Rich ``Progress`` (or silent)."""
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not show,
    )

    class Bar:
        label = ""  # the file being fetched; huggingface_hub's own desc is often the URL

        def __init__(
            self,
            *args: Any,
            total: int | None = None,
            initial: int = 0,
            desc: str = "",
            **kwargs: Any,
        ) -> None:
            self.task = progress.add_task(self.label or desc, total=total, completed=initial)

        def update(self, n: int = 1) -> None:
            progress.advance(self.task, n)

        def close(self) -> None:
            pass

        def __enter__(self) -> Bar:
            return self

        def __exit__(self, *exc: object) -> None:
            self.close()

    with progress:
        yield Bar


def remote_sizes(
    files: list[tuple[str, str, str | None]], timeout: float = 5.0
) -> dict[tuple[str, str, str | None], int]:
    """Download sizes of Hub files (all parts of a split GGUF added up), asked in parallel.

    Answers are remembered in the specgen cache, so a second listing asks nothing; files that
    cannot be reached (offline, no network, a glob) are left out, and asked again after a day.
    """
    import time
    from concurrent.futures import ThreadPoolExecutor

    from specgen.host import store

    memo_path = store.cache_root() / "hub-sizes.json"
    memo = store.read_versioned(memo_path, "Hub sizes", HUB_SIZES_VERSION) or {}
    key = {f: f"{f[0]}@{f[2] or 'main'}:{f[1]}" for f in files}
    now = time.time()
    memo = {
        k: v
        for k, v in memo.items()
        if isinstance(v, int) or (isinstance(v, dict) and now - v.get("failed_at", 0) < 86400)
    }
    wanted = [f for f in files if key[f] not in memo and not _is_glob(f[1])]

    def ask(spec: tuple[str, str, str | None]) -> tuple[tuple[str, str, str | None], int | None]:
        repo, name, revision = spec
        total = 0
        try:
            for part in split_parts(name):
                url = huggingface_hub.hf_hub_url(repo, part, revision=revision)
                size = huggingface_hub.get_hf_file_metadata(url, timeout=timeout).size
                if size is None:
                    return spec, None
                total += size
        except Exception:  # unreachable, gated, missing: the listing shows no size
            return spec, None
        return spec, total

    if wanted and not offline():
        with ThreadPoolExecutor(max_workers=8) as pool:
            for spec, size in pool.map(ask, wanted):
                memo[key[spec]] = size if size is not None else {"failed_at": now}
        store.write_versioned(memo_path, HUB_SIZES_VERSION, memo, indent=1, sort_keys=True)
    return {f: memo[key[f]] for f in files if isinstance(memo.get(key[f]), int)}


class _RangedReader:
    """``read(n)`` over a remote file, fetched in growing ranges through huggingface_hub's own
    HTTP session (so HF_TOKEN, HF_ENDPOINT and proxies apply as for a download)."""

    FIRST = 1 << 20

    def __init__(self, url: str, headers: dict[str, str], size: int | None) -> None:
        self.url, self.headers, self.size = url, headers, size
        self.buffer = b""
        self.position = 0
        self.fetched = 0
        self._next = self.FIRST

    def read(self, n: int) -> bytes:
        while len(self.buffer) - self.position < n and not self._at_end():
            self._fetch(max(self._next, n))
            self._next = min(self._next * 2, 16 << 20)
        data = self.buffer[self.position : self.position + n]
        self.position += len(data)
        return data

    def _at_end(self) -> bool:
        return self.size is not None and len(self.buffer) >= self.size

    def _fetch(self, length: int) -> None:
        from huggingface_hub.utils import get_session, hf_raise_for_status

        start = len(self.buffer)
        end = start + length - 1 if self.size is None else min(start + length, self.size) - 1
        response = get_session().get(
            self.url,
            headers={**self.headers, "Range": f"bytes={start}-{end}"},
            follow_redirects=True,
        )
        hf_raise_for_status(response)
        chunk = response.content
        if response.status_code == 200:  # the server ignored Range: it sent the whole file
            chunk = chunk[start:]
        if not chunk:
            self.size = len(self.buffer)
        self.buffer += chunk
        self.fetched += len(chunk)


def remote_header(
    repo: str, pattern: str, revision: str | None = None
) -> tuple[Any, int | None, int]:
    """A Hub GGUF's header read by ranged requests, with no download: (header, file size,
    bytes fetched). A split GGUF's header is in its first part."""
    from huggingface_hub.utils import build_hf_headers

    from specgen.models import gguf

    name = resolve_names(repo, pattern, revision)[0]
    with hub_errors(repo, name):
        headers = build_hf_headers()
        url = huggingface_hub.hf_hub_url(repo, name, revision=revision)
        meta = huggingface_hub.get_hf_file_metadata(url, headers=headers)
        reader = _RangedReader(meta.location or url, headers, meta.size)
        try:
            header = gguf.read_header(reader.read, tensors=True)
        except gguf.GGUFError as err:
            raise UserError(f"{repo}:{name}: {err}") from err
    return header, meta.size, reader.fetched
