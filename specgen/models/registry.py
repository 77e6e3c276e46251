"""models.toml: named draft/target pairs and model specs, and resolving a spec to a local file.

A model spec names where a GGUF comes from: a Hub file (``repo`` + ``file``), a local ``path``,
or a file inside packages of the Python package index (``pip`` + ``file``); ``quant`` derives a
converted copy, ``sha256`` verifies. The built-in models.toml ships inside the package; a user's
own file (``specgen models path``) adds pairs or overrides them by name.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from specgen.core.lookahead import DEFAULT_LOOKAHEAD, Lookahead, check_lookahead
from specgen.errors import UsageError, UserError

PAIR_ROLES = ("target", "draft")
# Pairs draft by n-grams beside their draft model (hybrid) unless models.toml says ngram = false.
HYBRID_BY_DEFAULT = True


def user_config_dir() -> Path:
    """The user's specgen folder: $SPECGEN_HOME, else the platform's app folder."""
    env = os.environ.get("SPECGEN_HOME")
    if env:
        return Path(env).expanduser()
    import typer

    return Path(typer.get_app_dir("specgen"))


def user_models_file() -> Path:
    return user_config_dir() / "models.toml"


@dataclass(frozen=True)
class ModelSpec:
    """Where one GGUF comes from, and what to do to it before use."""

    repo: str | None = None
    file: str | None = None
    revision: str | None = None
    path: str | None = None
    pip: tuple[str, ...] = ()
    quant: str | None = None
    sha256: str | None = None

    @property
    def kind(self) -> str:
        if self.path:
            return "path"
        return "pip" if self.pip else "hub"

    def label(self) -> str:
        """Short human-readable origin, e.g. ``org/repo:file.gguf`` or ``pip:pkg:file``."""
        if self.path:
            base = self.path
        elif self.pip:
            more = "+" if len(self.pip) > 1 else ""
            base = f"pip:{self.pip[0]}{more}:{Path(self.file or '').name}"
        else:
            rev = f"@{self.revision}" if self.revision else ""
            base = f"{self.repo}{rev}:{self.file}"
        return f"{base} -> {self.quant}" if self.quant else base

    @classmethod
    def from_mapping(cls, data: Any, where: str) -> ModelSpec:
        if not isinstance(data, dict):
            raise ValueError(f"{where} must be a table like {{ repo = ..., file = ... }}")
        known = {"repo", "file", "revision", "path", "pip", "quant", "sha256"}
        unknown = set(data) - known
        if unknown:
            raise ValueError(
                f"{where} has unknown key(s) {', '.join(sorted(unknown))} "
                f"(known: {', '.join(sorted(known))})"
            )
        kinds = [k for k in ("repo", "path", "pip") if k in data]
        if len(kinds) != 1:
            raise ValueError(f"{where} needs exactly one of repo, path or pip")
        if kinds[0] in ("repo", "pip") and not data.get("file"):
            raise ValueError(f"{where} needs a 'file' beside '{kinds[0]}'")
        pip = data.get("pip", ())
        if isinstance(pip, str):
            pip = (pip,)
        if "pip" in data and (
            not isinstance(pip, list | tuple)
            or not pip
            or not all(isinstance(p, str) and p for p in pip)
        ):
            raise ValueError(f"{where}: 'pip' must be a requirement or a list of them")
        for key in ("repo", "file", "revision", "path", "quant", "sha256"):
            if key in data and not isinstance(data[key], str):
                raise ValueError(f"{where}: '{key}' must be a string")
        sha = data.get("sha256")
        if sha is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", sha):
            raise ValueError(f"{where}: 'sha256' must be 64 hex digits")
        return cls(
            repo=data.get("repo"),
            file=data.get("file"),
            revision=data.get("revision"),
            path=data.get("path"),
            pip=tuple(pip),
            quant=data.get("quant"),
            sha256=sha,
        )


# The word that names prompt-lookup drafting where a draft model would go (``--draft ngram``,
# ``draft = "ngram"``); a file really named so is reachable as ``./ngram``.
NGRAM = "ngram"
# The word that names the target's own MTP head as the drafter (``--draft mtp``, ``draft =
# "mtp"``); a file really named so is reachable as ``./mtp``.
MTP = "mtp"
# The kinds of head file that draft from the target's hidden states: ``--draft eagle3:FILE``,
# ``draft = { head = "eagle3", ... }`` (a file of that architecture is one without saying so).
HEADS = ("eagle3", "dflash")


def head_prefix(text: str) -> tuple[str | None, str]:
    """``eagle3:FILE`` -> ("eagle3", FILE); anything else -> (None, text)."""
    kind, sep, rest = text.partition(":")
    if sep and kind.lower() in HEADS and rest:
        return kind.lower(), rest
    return None, text


@dataclass(frozen=True)
class PairSpec:
    """A known-good draft/target pair. ``draft`` is None where the pair drafts by n-grams alone
    or by the target's own MTP head (``mtp``); ``ngram`` adds prompt lookup beside a draft model
    or head (hybrid drafting)."""

    name: str
    target: ModelSpec
    draft: ModelSpec | None
    lookahead: Lookahead = DEFAULT_LOOKAHEAD
    chat: bool | None = None  # None: chat when the target's GGUF has a chat template
    description: str = ""
    license: str = ""
    source: str = "built-in"
    ngram: bool = False
    workers: tuple[str, ...] = ()  # `specgen worker`s for the target's layers (host:port)
    mtp: bool = False
    head: str | None = None  # the draft is an EAGLE3 or DFlash head (``HEADS``)

    def member(self, role: str) -> ModelSpec:
        spec = self.target if role == "target" else self.draft
        if spec is None:
            how = "its target's MTP head" if self.mtp else "n-grams"
            raise UserError(f"pair {self.name!r} has no draft model (it drafts by {how})")
        return spec

    def members(self) -> list[tuple[str, ModelSpec]]:
        """(role, spec) for each model file the pair needs."""
        return [
            (role, spec)
            for role, spec in (("target", self.target), ("draft", self.draft))
            if spec is not None
        ]


@dataclass
class Registry:
    pairs: dict[str, PairSpec] = field(default_factory=dict)
    default: str | None = None

    @classmethod
    def load(cls, user_file: Path | None = None) -> Registry:
        """The built-in pairs, then the user's file on top (missing user file: fine)."""
        registry = cls()
        builtin = (
            resources.files("specgen.models").joinpath("models.toml").read_text(encoding="utf-8")
        )
        registry._merge(builtin, "built-in models.toml")
        path = user_file or user_models_file()
        if path.is_file():
            registry._merge(path.read_text(encoding="utf-8"), str(path))
        return registry

    def _merge(self, text: str, source: str) -> None:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise UserError(f"{source}: {err}; fix the file (TOML syntax)") from err
        try:
            unknown = set(data) - {"default", "pairs"}
            if unknown:
                raise ValueError(
                    f"unknown top-level key(s) {', '.join(sorted(unknown))} (known: default, pairs)"
                )
            pairs = data.get("pairs", {})
            if not isinstance(pairs, dict):
                raise ValueError("'pairs' must be a table of [pairs.NAME] sections")
            for name, table in pairs.items():
                self.pairs[name] = _pair(name, table, source)
            if "default" in data:
                if not isinstance(data["default"], str):
                    raise ValueError("'default' must be the name of a pair")
                self.default = data["default"]
        except ValueError as err:
            line = _line_of(text, err)
            raise UserError(f"{source}{f', line {line}' if line else ''}: {err}") from err
        if self.default is not None and self.default not in self.pairs:
            raise UserError(f"{source}: default pair {self.default!r} is not defined")

    def pair(self, name: str | None = None) -> PairSpec:
        name = name or self.default
        if name is None:
            raise UserError("no pair named and no default pair in models.toml")
        if name not in self.pairs:
            close = difflib.get_close_matches(name, self.pairs, n=3, cutoff=0.5)
            hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
            raise UsageError(f"unknown pair {name!r}: {hint}see `specgen models list`")
        return self.pairs[name]

    def spec(self, text: str) -> ModelSpec:
        """A command-line model spec: a path, ``org/repo:file``, or a pair member ``PAIR:draft``."""
        if ":" in text:
            head, tail = text.rsplit(":", 1)
            if tail in PAIR_ROLES and head in self.pairs:
                return self.pairs[head].member(tail)
            if head in self.pairs:
                raise UsageError(f"{text!r}: use {head}:target or {head}:draft")
            if "/" in head and not Path(text).exists() and not head.startswith((".", "/", "~")):
                repo, _, revision = head.partition("@")
                return ModelSpec(repo=repo, file=tail, revision=revision or None)
        if text in self.pairs:
            raise UsageError(f"{text!r} is a pair: use {text}:target or {text}:draft")
        return ModelSpec(path=text)


def _pair(name: str, table: Any, source: str) -> PairSpec:
    where = f"pair {name!r}"
    if not isinstance(table, dict):
        raise ValueError(f"{where} must be a table")
    known = {"target", "draft", "lookahead", "chat", "description", "license", "ngram", "rpc"}
    unknown = set(table) - known
    if unknown:
        raise ValueError(f"{where} has unknown key(s) {', '.join(sorted(unknown))}")
    for role in PAIR_ROLES:
        if role not in table:
            raise ValueError(f"{where} has no {role}")
    lookahead = check_lookahead(table.get("lookahead", DEFAULT_LOOKAHEAD), f"{where}: 'lookahead'")
    for key in ("chat", "ngram"):
        if key in table and not isinstance(table[key], bool):
            raise ValueError(f"{where}: '{key}' must be true or false")
    by_ngram, by_mtp = table["draft"] == NGRAM, table["draft"] == MTP
    draft, head = table["draft"], None
    if isinstance(draft, dict) and "head" in draft:
        head = draft["head"]
        if head not in HEADS:
            raise ValueError(f"{where}: the draft's 'head' must be one of {', '.join(HEADS)}")
        draft = {k: v for k, v in draft.items() if k != "head"}
    return PairSpec(
        name=name,
        target=ModelSpec.from_mapping(table["target"], f"{where} target"),
        draft=None if by_ngram or by_mtp else ModelSpec.from_mapping(draft, f"{where} draft"),
        mtp=by_mtp,
        head=head,
        lookahead=lookahead,
        chat=table.get("chat"),
        description=str(table.get("description", "")),
        license=str(table.get("license", "")),
        source=source,
        ngram=by_ngram or table.get("ngram", HYBRID_BY_DEFAULT),
        workers=_parse_workers(table.get("rpc", ()), where),
    )


def _parse_workers(value: Any, where: str) -> tuple[str, ...]:
    """A pair's ``rpc``: "host:port,host:port" or a list of "host:port"."""
    from specgen.host.rpc import parse_endpoints

    if isinstance(value, str):
        value = [value] if value else []
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where}: 'rpc' must be \"host:port\" or a list of them")
    try:
        return tuple(str(e) for e in parse_endpoints(",".join(value))) if value else ()
    except UsageError as err:
        raise ValueError(f"{where}: 'rpc': {err}") from None


def _line_of(text: str, err: ValueError) -> int | None:
    """The line of the pair section an error is about (tomllib keeps no positions)."""
    match = re.search(r"pair '([^']+)'", str(err))
    if not match:
        return None
    name = re.escape(match.group(1))
    pattern = re.compile(rf'^\s*\[\s*pairs\s*\.\s*(?:"{name}"|{name}|\'{name}\')')
    for number, line in enumerate(text.splitlines(), start=1):
        if pattern.match(line):
            return number
    return None


# -- from a spec to a file on disk ------------------------------------------------------------


def _verify(path: Path, sha256: str | None, label: str) -> None:
    """Check a file against its sha256 once; a stamp remembers files already checked."""
    if not sha256:
        return
    from specgen.host import store

    real = path.resolve()
    stamp = store.path("verified", f"{sha256.lower()}-{real.stat().st_size}", suffix="")
    if store.read_text(stamp) == str(real):
        return
    if store.sha256_of(real) != sha256.lower():
        raise UserError(
            f"{label} does not match the sha256 in models.toml: the download is "
            f"corrupt or the file changed upstream; delete {real} and pull again, "
            f"or fix the sha256"
        )
    store.write_text(stamp, str(real))  # a read-only cache: verify again next time


def cached(spec: ModelSpec) -> Path | None:
    """The ready-to-load file if it is already on disk; never downloads or converts."""
    from specgen.models import fetch, hub

    if spec.kind == "path":
        base: Path | None = Path(spec.path or "").expanduser()
        base = base if base and base.is_file() else None
    elif spec.kind == "pip":
        base = fetch.pip_file_path(spec.pip, spec.file or "")
        base = base if base.is_file() else None
    else:
        base = hub.cached_file(spec.repo or "", spec.file or "", spec.revision)
    if base is None or not spec.quant:
        return base
    derived = fetch.derived_path(base, spec.quant)
    return derived if derived.is_file() else None


def resolve(spec: ModelSpec, progress: bool = True) -> Path:
    """A local GGUF for the spec: downloaded, fetched, verified and converted as needed."""
    from rich.console import Console

    from specgen.models import fetch, hub

    console = Console(stderr=True)
    if spec.kind == "path":
        base = Path(spec.path or "").expanduser()
        if not base.is_file():
            word = spec.path or ""
            if "/" not in word and not word.endswith(".gguf"):  # a name, not a path
                raise UserError(
                    f"model file not found: {word} (a model is a .gguf path, org/repo:file or "
                    f"PAIR:draft; the drafters named by a word are {NGRAM!r}, prompt lookup, and "
                    f"{MTP!r}, the target's own head; an EAGLE3 or DFlash head is "
                    f"eagle3:FILE or dflash:FILE)"
                )
            raise UserError(f"model file not found: {base} (give the path of a .gguf file)")
    elif spec.kind == "pip":
        wanted = fetch.pip_file_path(spec.pip, spec.file or "")
        message = f"fetching {wanted.name} from the package index ({', '.join(spec.pip)})"
        if wanted.is_file() or not progress:
            base = fetch.fetch_from_pip(spec.pip, spec.file or "", spec.sha256)
        elif console.is_terminal:
            with console.status(message):
                base = fetch.fetch_from_pip(spec.pip, spec.file or "", spec.sha256)
            console.print(f"fetched {wanted.name} from the package index", highlight=False)
        else:
            console.print(message, highlight=False, soft_wrap=True)
            base = fetch.fetch_from_pip(spec.pip, spec.file or "", spec.sha256)
    else:
        base = hub.download(spec.repo or "", spec.file or "", spec.revision, progress, console)
        _verify(base, spec.sha256, spec.label())
    if spec.kind == "path":
        _verify(base, spec.sha256, spec.label())
    if not spec.quant:
        return base
    if fetch.derived_path(base, spec.quant).is_file() or not progress:
        return fetch.derive(base, spec.quant)
    message = f"converting {base.name} to {spec.quant} (once; cached)"
    if not console.is_terminal:
        console.print(message, highlight=False, soft_wrap=True)
        return fetch.derive(base, spec.quant)
    with console.status(message):
        return fetch.derive(base, spec.quant)


@dataclass(frozen=True)
class FoundHeader:
    """A model's GGUF header, with where it came from (``note``: said on stderr)."""

    header: Any
    name: str
    size: int | None
    note: str = ""


def read_header(spec: ModelSpec) -> FoundHeader:
    """The GGUF header of a spec's file: from disk when it is there; for a Hub file not yet
    downloaded, from ranged reads of its first megabytes (nothing is downloaded). A converted
    copy (``quant``) has the same vocabulary as its source, so the source's header serves."""
    from specgen.models import gguf, hub

    local = cached(spec)
    if local is None and spec.kind == "hub":
        header, size, fetched = hub.remote_header(spec.repo or "", spec.file or "", spec.revision)
        total = f" of {size / 1e9:.2f} GB" if size else ""
        note = (
            f"read the header of {spec.label()} only ({fetched / 1e6:.1f} MB{total}); "
            f"nothing downloaded"
        )
        return FoundHeader(header, Path(spec.file or "").name, size, note)
    path = local or resolve(spec)
    try:
        header = gguf.read_local(str(path), tensors=True)
    except gguf.GGUFError as err:
        raise UserError(f"{path}: {err}") from err
    return FoundHeader(header, path.name, path.stat().st_size)
