"""What a person sees, and on which stream: the one output object of the command line.

stdout carries only the product of a command: the generated text, the JSON asked for with
``--json``, a table the user asked for (``models list``, a bench's report). Everything else
(notes, warnings, progress, live statistics, errors) goes to stderr, so ``specgen run ... >
out.txt`` holds the answer and nothing more. Both consoles find the streams when they print, so
a test that swaps ``sys.stdout`` sees what a user would.

Numbers are formatted here too: ``figure`` for a measured value that may be missing, ``size``
for bytes (decimal units, as the Hub and pip show file sizes: 1 GB = 10^9 bytes).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console, RenderableType
from rich.markup import escape


class Output:
    """The command line's stdout (the product) and stderr (everything else)."""

    def __init__(self) -> None:
        self.out = Console()
        self.err = Console(stderr=True)

    # -- stdout: the product ------------------------------------------------------------------
    def show(self, renderable: RenderableType) -> None:
        """A table or report the command exists to show, on stdout (whole, never cropped)."""
        self.out.print(renderable, crop=False)

    def text(self, text: str) -> None:
        """Text as it is (generated text, a path), on stdout."""
        sys.stdout.write(text)
        sys.stdout.flush()

    def json(self, value: Any, indent: int | None = None) -> None:
        """One JSON document on stdout: with ``--json``, nothing else is written there."""
        sys.stdout.write(json.dumps(value, indent=indent, default=str) + "\n")
        sys.stdout.flush()

    # -- stderr: everything else ------------------------------------------------------------
    def note(self, text: str, style: str | None = "dim") -> None:
        """A line for the person watching (where a K came from, a file written)."""
        self.err.print(text, style=style, highlight=False, soft_wrap=True, markup=False)

    def warning(self, text: str) -> None:
        self.note(text, "yellow")

    def error(self, message: str) -> None:
        """The one line an error ends with."""
        self.err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)


out = Output()


def figure(value: float | None, spec: str, unit: str = "", missing: str = "-") -> str:
    """A measured value as text (``missing`` where there is none)."""
    return missing if value is None else format(value, spec) + unit


def size(total: int) -> str:
    """Bytes in decimal units: ``1.23 GB``, ``512 MB``, ``40 kB``."""
    if total >= 1e8:
        return f"{total / 1e9:.2f} GB"
    return f"{total / 1e6:.0f} MB" if total >= 1e6 else f"{total / 1e3:.0f} kB"
