"""What a person sees: streamed text on stdout, live acceptance statistics on stderr.

The generation loop never calls the UI to redraw: the live views pull the shared ``Stats`` at a
fixed refresh rate (Rich ``Live`` does this through ``get_renderable``), so redraw cost does not
grow with the token rate. stdout carries only the generated text.

Three ways to show live stats, chosen from what the streams are:
- stderr is not a terminal: no live view, one final stats line (unless stats are off);
- stderr is a terminal and stdout is not (text piped to a file): Rich ``Live`` on stderr;
- both are the same terminal: the text scrolls above a status bar kept on the bottom line
  (a scroll region, as apt does), so the streamed text and the stats never overwrite each other.
  A terminal that reports no size (a pseudo-terminal of 0x0, as ``script`` and some CI runners
  and ``docker exec -t`` give) has no bottom line to keep: the text streams as it is and the
  final statistics follow it.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, TextIO

from rich.console import Console
from rich.live import Live
from rich.text import Text

from specgen.cli.output import figure
from specgen.stats import Stats

REFRESH_PER_SECOND = 4


def stats_segments(stats: Stats, final: bool = False) -> list[Text]:
    """The statistics as short pieces (K, acceptance, speed, counts, ...), in reading order."""
    parts: list[Text] = []
    speculating = stats.speculative and stats.lookahead != 0
    if speculating:
        parts += [
            Text(lookahead_label(stats, final), style="bold cyan"),
            accept_label(stats),
            Text(f"{figure(stats.tokens_per_cycle, '.2f')} tok/cycle"),
        ]
    else:
        parts.append(Text("target alone (K=0)", style="bold cyan"))
    parts += [
        Text(f"{figure(stats.tokens_per_second, '.1f')} tok/s", style="bold magenta"),
        Text(f"{plural(stats.n_generated, 'token')}  {plural(stats.n_cycles, 'cycle')}"),
    ]
    if speculating:
        parts.append(Text(sources_label(stats)))
    if final:
        parts.append(
            Text(
                f"prompt {stats.n_prompt} tok in {stats.prompt_seconds:.2f}s"
                f" ({figure(stats.prompt_tokens_per_second, '.0f')} tok/s)",
                style="dim",
            )
        )
        if stats.coupling == "gumbel":  # the seed gives this text again, at any K
            parts.append(Text(f"seed {stats.seed}", style="dim"))
        if stats.stop_reason:
            parts.append(Text(f"stop: {stats.stop_reason}", style="dim"))
    return parts


def stats_text(stats: Stats, final: bool = False, width: int | None = None) -> Text:
    """The statistics on one line, or, given a ``width``, on as few lines as fit in it."""
    lines: list[Text] = []
    for part in stats_segments(stats, final):
        if lines and (width is None or len(lines[-1]) + 2 + len(part) <= width):
            lines[-1].append("  ")
            lines[-1].append_text(part)
        else:
            lines.append(part.copy())
    return Text("\n").join(lines)


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def lookahead_label(stats: Stats, final: bool = False) -> str:
    """``K=8``; while ``auto`` chooses, ``K=auto (now 5)``; at the end, the K it chose most
    (``K=auto (mostly 5)``), not the last cycle's, which a run's end often leaves at 0."""
    if stats.lookahead != "auto":
        return f"K={stats.lookahead}"
    if not stats.n_cycles:
        return "K=auto"
    if final:
        guessing = {k: n for k, n in stats.k_counts.items() if k}
        if not guessing:
            return "K=auto (target alone)"
        return f"K=auto (mostly {max(guessing, key=lambda k: (guessing[k], k))})"
    return f"K=auto (now {stats.current_lookahead})"


def accept_label(stats: Stats) -> Text:
    """The share of guesses kept: one figure for one source, one a source for several (a
    prompt lookup's cheap guesses would otherwise hide a draft model's)."""
    sources = {name: src for name, src in stats.by_source.items() if src.drafted}
    if len(sources) <= 1:
        rate = stats.accept_rate
        return Text.assemble(
            "accept ", (figure(None if rate is None else rate * 100, ".0f") + "%", "bold green")
        )
    label = Text("accept")
    for name, src in sorted(sources.items()):
        label.append(f" {name} ")
        label.append(f"{src.accepted / src.drafted * 100:.0f}%", style="bold green")
    return label


def sources_label(stats: Stats) -> str:
    """Accepted/drafted guesses by source, one wording whatever the sources:
    ``accepted model 40/52 ngram 31/33``."""
    if not stats.by_source:
        return "accepted 0/0"
    return "accepted " + " ".join(
        f"{name} {src.accepted}/{src.drafted}" for name, src in sorted(stats.by_source.items())
    )


class _LiveStats:
    """``get_renderable`` hook for Rich ``Live``: reads the stats afresh on every refresh."""

    def __init__(self, stats: Stats) -> None:
        self.stats = stats

    def __rich__(self) -> Text:
        return stats_text(self.stats)


class _BottomBar:
    """A one-line status bar on the last row of a terminal that stdout also writes to."""

    def __init__(self, stats: Stats, out: TextIO, err: TextIO) -> None:
        self.stats, self.out, self.err = stats, out, err
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._rows = 0
        self._old_term: Callable[[int, FrameType | None], Any] | int | None = None
        self._term_installed = False
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        with self._lock:
            self._set_region()
        # A plain SIGTERM would leave the terminal with its scroll region cut short: turn it
        # into an exit that runs the clean-up below.
        if threading.current_thread() is threading.main_thread():
            self._old_term = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
            self._term_installed = True
        self._thread.start()

    def _set_region(self) -> None:
        cols, rows = shutil.get_terminal_size()
        self._rows = rows
        # Make room for the bar, then confine scrolling to the rows above it.
        self.err.write(f"\n\x1b[1A\x1b7\x1b[1;{rows - 1}r\x1b8")
        self.err.flush()

    def _draw(self) -> None:
        cols, rows = shutil.get_terminal_size()
        if rows != self._rows:
            self._set_region()
        buf = io.StringIO()
        Console(file=buf, force_terminal=True, width=cols, no_color=False).print(
            stats_text(self.stats), end="", crop=True, overflow="ellipsis", no_wrap=True
        )
        self.err.write(f"\x1b7\x1b[{rows};1H\x1b[2K{buf.getvalue()}\x1b8")
        self.err.flush()

    def _loop(self) -> None:
        while not self._done.wait(1 / REFRESH_PER_SECOND):
            with self._lock:
                self._draw()

    def write(self, text: str) -> None:
        with self._lock:
            self.out.write(text)
            self.out.flush()

    def stop(self) -> None:
        self._done.set()
        self._thread.join()
        with self._lock:
            self.err.write(f"\x1b7\x1b[r\x1b[{self._rows};1H\x1b[2K\x1b8")
            self.err.flush()
        if self._term_installed:
            signal.signal(signal.SIGTERM, self._old_term or signal.SIG_DFL)


class StreamView:
    """Streams text to ``out`` and shows live stats on ``err``; use as a context manager."""

    def __init__(
        self,
        stats: Stats,
        show_stats: bool = True,
        out: TextIO | None = None,
        err: TextIO | None = None,
    ) -> None:
        self.stats = stats
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.show_stats = show_stats
        self.console = Console(file=self.err)
        self._live: Live | None = None
        self._bar: _BottomBar | None = None
        self._ended_with_newline = True

    def __enter__(self) -> StreamView:
        if self.show_stats and self.console.is_terminal:
            if self.out.isatty():
                if reports_size(self.err):
                    self._bar = _BottomBar(self.stats, self.out, self.err)
                    self._bar.start()
            else:
                self._live = Live(
                    _LiveStats(self.stats),
                    console=self.console,
                    refresh_per_second=REFRESH_PER_SECOND,
                    transient=True,
                    redirect_stdout=False,
                    redirect_stderr=False,
                )
                self._live.start()
        return self

    def write(self, text: str) -> None:
        if not text:
            return
        self._ended_with_newline = text.endswith("\n")
        if self._bar is not None:
            self._bar.write(text)
        else:
            self.out.write(text)
            self.out.flush()

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        # An error ends the command with its own one line: no statistics of nothing above it.
        self.close(final_stats=kind is None or issubclass(kind, KeyboardInterrupt))

    def close(self, final_stats: bool = True) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        if self._live is not None:
            self._live.stop()
            self._live = None
        if not self._ended_with_newline and self.out.isatty():
            self.out.write("\n")
        self.out.flush()
        if self.show_stats and final_stats:
            # Where stdout and stderr are one file (`> log 2>&1`), start the stats on a line of
            # their own; stdout itself keeps exactly the generated text.
            if (
                not self._ended_with_newline
                and not self.out.isatty()
                and same_file(self.out, self.err)
            ):
                self.err.write("\n")
                self.err.flush()
            self.console.print(
                stats_text(self.stats, final=True, width=self.console.width), soft_wrap=True
            )


def reports_size(stream: TextIO) -> bool:
    """Whether the terminal behind ``stream`` says how many rows and columns it has."""
    try:
        size = os.get_terminal_size(stream.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        return False
    return size.lines > 0 and size.columns > 0


def same_file(a: TextIO, b: TextIO) -> bool:
    """Whether two streams write to the same file, pipe or terminal."""
    try:
        one, two = os.fstat(a.fileno()), os.fstat(b.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        return False
    return (one.st_dev, one.st_ino) == (two.st_dev, two.st_ino)
