"""``specgen models``: list, pull, inspect and check the named draft/target pairs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from specgen.errors import UserError
from specgen.options import DraftOpt, TargetOpt
from specgen.output import out, size
from specgen.registry import ModelSpec

app = typer.Typer(help="List, download, inspect and check model pairs.", no_args_is_help=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _size(path: Path | None) -> str:
    if path is None:
        return "-"
    return size(sum(p.stat().st_size for p in _parts(path)))


def _parts(path: Path) -> list[Path]:
    from specgen.hub import split_parts

    return [path.with_name(n) for n in split_parts(path.name)]


@app.command("list")
def list_pairs(
    json_out: JsonOpt = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show full specs, licenses and descriptions.")
    ] = False,
) -> None:
    """The known pairs, and which of their files are already downloaded."""
    from specgen.hub import remote_sizes
    from specgen.registry import Registry, cached, user_models_file

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
    records = []
    for pair, files in rows:
        both = all(files.values())
        sizes = [size_of(spec, files[r]) for r, spec in pair.members()]
        known = [s for s in sizes if s is not None]
        total = f" ({size(sum(known))})" if len(known) == len(sizes) else ""
        state = (
            " + ".join(_size(files[r]) for r, _ in pair.members())
            if both
            else ("partly" if any(files.values()) else "no") + total
        )
        name = pair.name + (" *" if pair.name == registry.default else "")
        labels = [spec.label() if verbose else _short(spec) for _, spec in pair.members()]
        if pair.draft is None:
            labels.append("ngram")
        chat = {True: "yes", False: "no", None: "auto"}[pair.chat]
        records.append((pair, [name, str(pair.lookahead), chat, *labels, state], both))
    # Every column stays whole; file names, the only long ones, are shortened in the middle
    # (their ends say the most: the family and the quantization) to share what is left of
    # the width. `models list -v` and `models info` show them in full.
    fixed = [
        max(len(c), *(len(r[1][i]) for r in records)) if records else len(c)
        for i, c in ((0, "PAIR"), (1, "K"), (2, "CHAT"), (5, "DOWNLOADED"))
    ]
    room = max(12, (out.out.width - sum(fixed) - 2 * 5) // 2)  # five gaps of two spaces
    table = Table(box=None, pad_edge=False)
    for column in ("PAIR", "K", "CHAT", "TARGET", "DRAFT", "DOWNLOADED"):
        table.add_column(column, no_wrap=True, overflow="fold" if verbose else "ellipsis")
    for pair, cells, both in records:
        if not verbose:
            cells[3:5] = [shorten(cell, room) for cell in cells[3:5]]
        cells[5] = f"[green]{cells[5]}[/]" if both else cells[5]
        table.add_row(*cells)
        if verbose:
            table.add_row("", "", "", f"[dim]{pair.description}[/]", f"[dim]{pair.license}[/]", "")
    out.out.print(table)
    out.note(f"* default pair. Add your own pairs in {user_models_file()}")


def shorten(name: str, width: int) -> str:
    """A name cut to ``width`` characters in the middle: ``Meta-Llama-3.1…-Q4_K_M.gguf``."""
    if len(name) <= width:
        return name
    tail = (width - 1) // 2
    return name[: width - 1 - tail] + "…" + name[len(name) - tail :]


def _short(spec: ModelSpec) -> str:
    from specgen.fetch import pip_file_path

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
    from specgen.registry import Registry, resolve

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
    from specgen.gguf import facts
    from specgen.registry import Registry, read_header

    found = read_header(Registry.load().spec(spec))
    details = facts(found.header, found.name, found.size)
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
        elif key == "size_bytes":
            value = size(value) if isinstance(value, int) else None
        elif isinstance(value, bool):
            value = "yes" if value else "no"
        table.add_row(key.replace("_", " "), "-" if value is None else str(value))
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
    from specgen import compat
    from specgen.choice import choose
    from specgen.gguf import HeaderVocabulary
    from specgen.registry import Registry, read_header

    choice = choose(Registry.load(), pair, target, draft)
    if choice.draft is None:
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
    if not verdict:
        raise UserError(
            f"{name}: draft {found[1].name} does not fit target {found[0].name}: {verdict.reason}"
        )
    out.text(
        f"ok {name}: draft {found[1].name} fits target {found[0].name} "
        f"({compat.VOCAB_TYPES.get(target_vocab.vocab_type)}, "
        f"{target_vocab.n_vocab} / {draft_vocab.n_vocab} tokens)\n"
    )


@app.command()
def path() -> None:
    """Where your own models.toml and specgen's caches live."""
    from specgen.registry import user_models_file
    from specgen.store import cache_root

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
