"""``specgen models``: list, pull, inspect and check the named draft/target pairs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from specgen.cli.options import DraftOpt, TargetOpt
from specgen.cli.output import out, size
from specgen.errors import UserError
from specgen.models.gguf import Header
from specgen.models.registry import ModelSpec

app = typer.Typer(help="List, download, inspect and check model pairs.", no_args_is_help=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _size(path: Path | None) -> str:
    if path is None:
        return "-"
    return size(sum(p.stat().st_size for p in _parts(path)))


def _parts(path: Path) -> list[Path]:
    from specgen.models.hub import split_parts

    return [path.with_name(n) for n in split_parts(path.name)]


@app.command("list")
def list_pairs(
    json_out: JsonOpt = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show full specs, licenses and descriptions.")
    ] = False,
) -> None:
    """The known pairs, and which of their files are already downloaded."""
    from specgen.models.hub import remote_sizes
    from specgen.models.registry import Registry, cached, user_models_file

    registry = Registry.load()
    rows = []
    for pair in registry.pairs.values():
        files = {role: cached(spec) for role, spec in pair.members()}
        rows.append((pair, files))
    remote = remote_sizes(
        [
            (spec.repo, spec.file, spec.revision)
            for pair, files in rows
            for role, spec in pair.members()
            if spec.kind == "hub" and files[role] is None and spec.repo and spec.file
        ]
    )

    def size_of(spec: ModelSpec, path: Path | None) -> int | None:
        if path is not None:
            return sum(p.stat().st_size for p in _parts(path))
        if spec.repo and spec.file:
            return remote.get((spec.repo, spec.file, spec.revision))
        return None

    if json_out:
        out.json(
            [
                {
                    "name": pair.name,
                    "default": pair.name == registry.default,
                    "description": pair.description,
                    "license": pair.license,
                    "chat": pair.chat,
                    "lookahead": pair.lookahead,
                    "source": pair.source,
                    **{
                        role: {
                            "spec": spec.label(),
                            "cached": str(files[role]) if files[role] else None,
                            "size_bytes": size_of(spec, files[role]),
                        }
                        for role, spec in pair.members()
                    },
                    "ngram": pair.ngram,
                }
                for pair, files in rows
            ],
            indent=2,
        )
        return
    # What tells pairs apart, whole at 80 columns: the models' sizes and quantizations, how the
    # pair drafts, what it downloads and whether it is here. File names, long and alike, are
    # for `models list -v` and `models info`.
    table = Table(box=None, pad_edge=False)
    for column in ["PAIR", "TARGET", "DRAFT", "SIZE", "K", "DOWNLOADED"]:
        table.add_column(column, no_wrap=True)
    blocks: list[str] = []  # -v: a block a pair, each spec whole on its own line
    for pair, files in rows:
        sizes = [size_of(spec, files[r]) for r, spec in pair.members()]
        total = size(sum(s for s in sizes if s is not None)) if None not in sizes else "-"
        have = [files[r] is not None for r, _ in pair.members()]
        state = "[green]yes[/]" if all(have) else "partly" if any(have) else "no"
        name = pair.name + (" *" if pair.name == registry.default else "")
        models = [model_summary(spec) for _, spec in pair.members()]
        if pair.head is not None and len(models) > 1:
            models[1] = f"{pair.head}:{models[1]}"
        if pair.draft is None:
            models.append("MTP head" if pair.mtp else "n-grams")
        table.add_row(name, *models, total, str(pair.lookahead), state)
        if verbose:
            members = [
                f"  {role:<7} {pair.head + ':' if pair.head and role == 'draft' else ''}"
                f"{spec.label()}"
                for role, spec in pair.members()
            ]
            if pair.draft is None:
                members.append(f"  {'draft':<7} {'MTP head' if pair.mtp else 'n-grams'}")
            blocks.append(
                "\n".join(
                    [
                        f"[bold]{name}[/]  K={pair.lookahead}  {total}  downloaded: {state}",
                        *(escape(m) for m in members),
                        f"  [dim]{escape(pair.description or '')} "
                        f"({escape(pair.license or '-')})[/]",
                    ]
                )
            )
    if verbose:
        out.out.print("\n\n".join(blocks), soft_wrap=True, highlight=False)
    else:
        out.out.print(table)
    out.note(
        "* default pair. `specgen models list -v` shows the files, `specgen models info "
        f"PAIR:target` one file's details. Add your own pairs in {user_models_file()}"
    )


# A model's parameter count in its file name: 7B, 0.5b, 135M, E2B, 35B-A3B.
_PARAMETERS = re.compile(
    r"(?<![A-Za-z0-9.])(E?\d+(?:\.\d+)?[BbMm](?:-A\d+(?:\.\d+)?[Bb])?)(?![A-Za-z0-9])"
)
# Its quantization: Q4_K_M, UD-Q4_K_XL, IQ4_XS, Q8_0, F16, BF16, MXFP4.
_QUANT = re.compile(
    r"(?<![A-Za-z0-9])((?:UD-)?I?Q\d(?:_[A-Z0-9]+)*|BF16|F16|F32|MXFP4)(?![A-Za-z0-9])", re.I
)


def model_summary(spec: ModelSpec) -> str:
    """A model in a few characters, from its file name: ``7B Q4_K_M``, ``135M Q4_1>F32``."""
    name = _short(spec).split(" -> ")[0]
    stem = name.removesuffix(".gguf")
    found = _PARAMETERS.findall(stem)
    quant = _QUANT.findall(stem)
    parts = [found[0].upper() if found else stem[:14]]
    if quant:
        parts.append(quant[-1].upper())
    text = " ".join(parts)
    return f"{text}>{spec.quant}" if spec.quant else text


def _short(spec: ModelSpec) -> str:
    from specgen.models.fetch import pip_file_path

    name = (
        pip_file_path(spec.pip, spec.file or "") if spec.pip else Path(spec.path or spec.file or "")
    ).name
    return f"{name} -> {spec.quant}" if spec.quant else name


@app.command()
def pull(
    pair: Annotated[
        str | None,
        typer.Argument(
            metavar="PAIR", help="Pair name (default: the default pair).", show_default=False
        ),
    ] = None,
) -> None:
    """Download both models of a pair (resumable; HF_TOKEN for gated repos); print their paths."""
    from specgen.models.registry import Registry, resolve

    spec = Registry.load().pair(pair)
    for role, member in spec.members():
        path = resolve(member)
        out.err.print(f"[green]ready[/] {role}", highlight=False)
        out.text(f"{path}\n")


@app.command()
def info(
    spec: Annotated[
        str,
        typer.Argument(
            metavar="SPEC", help="A GGUF path, org/repo:file.gguf, or PAIR:target / PAIR:draft."
        ),
    ],
    json_out: JsonOpt = False,
) -> None:
    """A GGUF's metadata: architecture, size, quantization, context, vocabulary, chat template.

    A Hub file that is not downloaded is described from its header alone (a ranged read)."""
    from specgen.lookahead import snapshots_for
    from specgen.models.arch import head_layout, layout
    from specgen.models.gguf import facts
    from specgen.models.registry import Registry, head_prefix, read_header

    found = read_header(Registry.load().spec(head_prefix(spec)[1]))
    details = facts(found.header, found.name, found.size)
    head = head_layout(found.header)
    if head is not None:  # a head reads its target's layers: no layout of its own to tell
        details["head"] = head.describe()
        details["head_layers"] = list(head.layers)
        details["head_block_size"] = head.block_size or None
    else:
        shape = layout(found.header)
        details.update(shape.as_dict(snapshots_for("auto", shape.mtp_layers > 0)))
    if found.note:
        out.note(found.note)
    if json_out:
        out.json(details, indent=2)
        return
    table = Table(show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in details.items():
        if isinstance(value, dict):
            value = f"{value['id']} {value['text']!r}" + (
                "" if value["added"] else " (not added to prompts)"
            )
        elif key.endswith("_bytes"):
            value = size(value) if isinstance(value, int) else None
        elif isinstance(value, bool):
            value = "yes" if value else "no"
        label = key.removesuffix("_bytes")  # "size", not "size bytes 0.54 GB": units are shown
        table.add_row(label.replace("_", " "), "-" if value is None else str(value))
    out.out.print(table)


@app.command()
def check(
    pair: Annotated[
        str | None,
        typer.Argument(
            metavar="PAIR", help="Pair name (default: the default pair).", show_default=False
        ),
    ] = None,
    target: TargetOpt = None,
    draft: DraftOpt = None,
) -> None:
    """Does the draft fit the target? llama.cpp's vocabulary rule; exit 1 when it does not.

    Hub files that are not downloaded are checked from their headers alone (ranged reads)."""
    from specgen.models import compat
    from specgen.models.arch import HEAD_NAMES, head_layout, head_problem, layout
    from specgen.models.gguf import HeaderVocabulary
    from specgen.models.registry import Registry, read_header
    from specgen.session.choice import choose
    from specgen.session.fit import unfit

    choice = choose(Registry.load(), pair, target, draft)
    if choice.draft is None:
        if choice.mtp:
            found_target = read_header(choice.target)
            if found_target.note:
                out.note(found_target.note)
            head = layout(found_target.header)
            if head.mtp_layers == 0:
                raise UserError(f"{found_target.name} has no MTP layers to draft with")
            out.text(
                f"ok: {found_target.name} drafts with its own MTP head "
                f"({_layout_line(found_target.header, mtp=True)}); no vocabulary to check\n"
            )
            return
        raise UserError(
            "nothing to check: name a pair with a draft model, or both --target and --draft"
        )
    found = [read_header(spec) for spec in (choice.target, choice.draft)]
    for one in found:
        if one.note:
            out.note(one.note)
    target_vocab, draft_vocab = (HeaderVocabulary(f.header, f.name) for f in found)
    verdict = compat.check(target_vocab, draft_vocab)
    name = choice.pair.name if choice.pair else "these models"
    as_head = head_layout(found[1].header)
    if as_head is not None or choice.head is not None:
        if as_head is None or (choice.head is not None and as_head.kind != choice.head):
            what = HEAD_NAMES[choice.head or "eagle3"]
            raise UserError(f"{name}: {found[1].name} is not {what}")
        problem = head_problem(as_head, found[0].header) or (None if verdict else verdict.reason)
        if problem:
            raise UserError(
                f"{name}: head {found[1].name} cannot draft for {found[0].name}: {problem}"
            )
        out.text(f"ok {name}: {found[1].name} is {as_head.describe()} of {found[0].name}\n")
        return
    if not verdict:
        archs = [str(f.header.get("general.architecture") or "") for f in found]
        step = compat.advice(verdict, archs[0], archs[1], target_vocab, draft_vocab)
        raise UserError(f"{name}: {unfit(verdict, found[0].name, found[1].name, step)}")
    for role, one in zip(("target", "draft"), found):
        out.note(f"{role} {one.name}: {_layout_line(one.header, role)}")
    moe = layout(found[0].header)
    if moe.few_active_experts:
        out.warning(
            f"{found[0].name} is a mixture of experts running {moe.experts_used} of "
            f"{moe.experts} experts a token: its steps are already cheap, so a separate draft "
            f"model rarely pays (measured: none to -50%); try --draft ngram"
            + (", or its MTP head (--draft mtp)" if moe.mtp_layers else "")
        )
    out.text(
        f"ok {name}: draft {found[1].name} fits target {found[0].name} "
        f"({compat.VOCAB_TYPES.get(target_vocab.vocab_type)}, "
        f"{target_vocab.n_vocab} / {draft_vocab.n_vocab} tokens)\n"
    )


def _layout_line(header: Header, role: str = "target", mtp: bool = False) -> str:
    """What a model is and how it rolls back with ``-k auto``: ``hybrid: 48 recurrent + 16
    attention layers, 1 MTP head; rolls back by llama.cpp snapshots up to K=4 ... (1.2 GB of
    state)``. A draft keeps no snapshots: its rollbacks span decodes."""
    from specgen.lookahead import snapshots_for
    from specgen.models.arch import layout

    found = layout(header)
    window = snapshots_for("auto", mtp) if role == "target" else 0
    text = found.describe()
    if found.kind != "attention":
        text += f"; rolls back by {found.rollback(window)}"
        state = found.snapshot_bytes(window)
        if state:
            text += f" ({size(state)} of state with -k auto)"
    return text


@app.command()
def path() -> None:
    """Where your own models.toml and specgen's caches live."""
    from specgen.host.store import cache_root
    from specgen.models.registry import user_models_file

    try:
        from huggingface_hub import constants

        hub_cache = constants.HF_HUB_CACHE
    except ImportError:  # pragma: no cover
        hub_cache = "-"
    table = Table(show_header=False, box=None)
    table.add_row("your models.toml", str(user_models_file()))
    table.add_row("Hugging Face cache", str(hub_cache))
    table.add_row("specgen cache", str(cache_root()))
    out.out.print(table)


YesOpt = Annotated[
    bool, typer.Option("--yes", "-y", help="Delete without asking (what a script needs).")
]


@app.command("rm")
def remove(
    names: Annotated[
        list[str],
        typer.Argument(
            metavar="PAIR|PAIR:target|PAIR:draft|MODEL...",
            help="What to delete: a pair's downloaded files (both models), one member, or a "
            "model spec (org/repo:file.gguf). Your own files (paths) are never deleted, only "
            "specgen's conversions of them.",
            show_default=False,
        ),
    ],
    yes: YesOpt = False,
) -> None:
    """Delete downloaded models and their conversions, after saying what that frees."""
    from specgen.models.registry import Registry

    registry = Registry.load()
    found: dict[Path, int] = {}
    for name in names:
        specs = (
            [spec for _, spec in registry.pair(name).members()]
            if name in registry.pairs
            else [registry.spec(name)]
        )
        for spec in specs:
            found.update(_files_of(spec))
    _delete(found, "nothing of these is downloaded or converted here", yes)


@app.command()
def clean(
    everything: Annotated[
        bool,
        typer.Option(
            "--all", help="Also every model downloaded from the package index or the Hub."
        ),
    ] = False,
    yes: YesOpt = False,
) -> None:
    """Free disk space: cut-short downloads and F32 conversions (remade on next use); --all:
    the downloads too.

    What goes is listed with its size, and asked before anything is deleted."""
    from huggingface_hub import constants

    from specgen.host.store import cache_root

    root, hub = cache_root(), Path(constants.HF_HUB_CACHE)
    found: dict[Path, int] = {}
    for folder, patterns in (
        (root, ["**/*.partial"]),
        (hub, ["**/*.incomplete"]),
        (root / "derived", ["**/*.gguf"]),
        *([(root / "pip", ["**/*.gguf"]), (hub, ["models--*/blobs/*"])] if everything else []),
    ):
        for pattern in patterns:
            for file in folder.glob(pattern) if folder.is_dir() else ():
                if file.is_file() and not file.is_symlink():
                    found[file] = file.stat().st_size
    if everything:  # the Hub's snapshots point at the blobs: they go with them
        for link in hub.glob("models--*/snapshots/**/*") if hub.is_dir() else ():
            if link.is_symlink():
                found.setdefault(link, 0)
    _delete(found, "nothing to clean", yes)


def _files_of(spec: ModelSpec) -> dict[Path, int]:
    """The files specgen downloaded or converted for a model (a Hub file: its snapshot link
    and the blob it points at), with their sizes."""
    from specgen.models import fetch, hub

    base: Path | None
    if spec.kind == "pip":
        base = fetch.pip_file_path(spec.pip, spec.file or "")
    elif spec.kind == "hub":
        base = hub.cached_file(spec.repo or "", spec.file or "", spec.revision)
    else:
        base = Path(spec.path or "").expanduser()
    found: dict[Path, int] = {}
    if base is None or not base.exists():
        return found
    if spec.quant:
        derived = fetch.derived_path(base, spec.quant)
        if derived.is_file():
            found[derived] = derived.stat().st_size
    if spec.kind == "path":
        return found
    for part in _parts(base):
        if part.is_symlink():
            blob = part.resolve()
            if blob.is_file():
                found[blob] = blob.stat().st_size
            found[part] = 0
        elif part.is_file():
            found[part] = part.stat().st_size
    return found


def _delete(found: dict[Path, int], nothing: str, yes: bool) -> None:
    """Say what would go and what it frees, ask (unless ``yes``), then delete."""
    import sys

    from specgen.errors import UsageError

    if not found:
        out.note(nothing)
        return
    for file, bytes_ in sorted(found.items()):
        if bytes_:
            out.note(f"{size(bytes_):>9}  {file}", style=None)
    total = size(sum(found.values()))
    if not yes:
        if not sys.stdin.isatty():
            raise UsageError(f"this deletes {total}: add --yes to delete without asking")
        if not typer.confirm(f"delete these ({total})?", default=False, err=True):
            out.note("nothing deleted")
            return
    for file in found:
        file.unlink(missing_ok=True)
        folder = file.parent  # specgen's own folder of one model (the Hub's layout is kept)
        if (
            folder.parent.name in ("pip", "derived")
            and folder.is_dir()
            and not any(folder.iterdir())
        ):
            folder.rmdir()
    count = len([b for b in found.values() if b])
    out.note(f"deleted {count} file{'s' if count != 1 else ''}, freed {total}")
