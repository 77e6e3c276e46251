"""``specgen run -f FILE`` over many prompts: the batch's files and what it shows on stderr.

The batch itself is library code (``specgen.session.batch``); this module reads the prompts, opens
the output before the models load (a bad ``-o`` fails at once), and shows a progress bar and the
closing summary on stderr.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from specgen.cli.output import figure, out
from specgen.errors import EXIT_FAILED, EXIT_INTERRUPTED, UsageError

if TYPE_CHECKING:
    from specgen.api import Settings, Specgen
    from specgen.session.batch import BatchTally
    from specgen.session.prompts import BatchItem


def read_batch(
    argument: str | None, file: Path | None, each_line: bool, jsonl: bool
) -> list[BatchItem]:
    """The prompts of a batch file (``-``: stdin): one a line, or JSON lines."""
    from specgen.session.prompts import parse_jsonl, parse_lines, read_file

    if file is None:
        raise UsageError("a batch reads its prompts from --file FILE ('-': stdin)")
    if argument is not None:
        raise UsageError("a batch takes its prompts from --file, not from an argument")
    if each_line and jsonl:
        raise UsageError("--each-line and --jsonl are two formats: pick one")
    text = read_file(file)
    return parse_lines(text) if each_line else parse_jsonl(text)


def open_output(output: Path | None) -> IO[str]:
    """The batch's sink, opened before the models load so a bad -o fails at once."""
    if output is None:
        return sys.stdout
    if output.is_dir():
        raise UsageError(f"--output {output} is a folder: give a file")
    output.parent.mkdir(parents=True, exist_ok=True)
    sink = output.open("a", encoding="utf-8")
    if sink.tell() > 0:
        with output.open("rb") as existing:
            existing.seek(-1, os.SEEK_END)
            if existing.read(1) != b"\n":  # a line a crash cut short: keep it on its own
                sink.write("\n")
    return sink


def finished(output: Path | None, resume: bool) -> set[str]:
    """The ids ``--resume`` skips: those with a result in the output file."""
    from specgen.session.batch import finished_ids

    return finished_ids(output) if resume and output is not None else set()


def to_run(items: list[BatchItem], skip: set[str]) -> int:
    """The prompts a batch will generate for: its good lines not skipped."""
    from specgen.session.prompts import BadLine

    return sum(1 for item in items if not isinstance(item, BadLine) and str(item.id) not in skip)


def run_batch_shown(
    sg: Specgen,
    settings: Settings,
    items: list[BatchItem],
    sink: IO[str],
    output: Path | None,
    skip: set[str],
    chat: bool,
    system: str | None,
    no_stats: bool,
) -> int:
    """Run every prompt but the ``skip``ped ids; the exit code says whether all went well (1:
    some failed)."""

    def write(record: dict[str, object]) -> None:
        sink.write(json.dumps(record, ensure_ascii=False) + "\n")
        sink.flush()

    bar = Progress(
        TextColumn("[bold]batch"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rates]}"),
        TimeRemainingColumn(),
        console=out.err,
        transient=True,
        disable=no_stats or not out.err.is_terminal,
    )
    with bar:
        task = bar.add_task("batch", total=len(items), rates="")

        def on_progress(p: BatchTally) -> None:
            rate = figure(None if p.accept_rate is None else p.accept_rate * 100, ".0f", "%")
            bar.update(
                task,
                completed=p.done + p.failed + p.skipped,
                rates=f"accept {rate}  {figure(p.tokens_per_second, '.1f')} tok/s",
            )

        tally = sg.batch(
            items,
            settings,
            chat=chat,
            system=system,
            write=write,
            skip=skip,
            on_progress=on_progress,
            total=len(items),
        )
    if sink is not sys.stdout:
        sink.close()
    if not no_stats:
        _batch_summary(tally, output)
    if tally.interrupted:
        return EXIT_INTERRUPTED
    return EXIT_FAILED if tally.failed else 0


def _batch_summary(p: BatchTally, output: Path | None) -> None:
    parts = [f"batch: {p.done} of {p.total} prompts done"]
    if p.failed:
        parts.append(f"{p.failed} failed (error lines in {output or 'the output'})")
    if p.skipped:
        parts.append(f"{p.skipped} skipped (already in {output})")
    if p.interrupted:
        parts.append("interrupted (run again with --resume to finish)")
    if p.accept_rate is not None:
        parts.append(f"accept {p.accept_rate:.0%}")
    if p.tokens_per_second is not None:
        parts.append(f"{p.tokens_per_second:.1f} tok/s")
    out.note(", ".join(parts), style="yellow" if p.failed or p.interrupted else None)
