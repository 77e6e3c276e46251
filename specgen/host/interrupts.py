"""Ctrl-C during long calls into llama.cpp: stop within a moment, print one line, exit 130.

Python runs a signal handler only between bytecodes of the main thread. While the main thread
is inside a long C call (loading a model, converting one), the handler waits; and when llama.cpp
calls back into Python meanwhile (its log callback), the KeyboardInterrupt is raised inside the
ctypes callback, where ctypes prints "Exception ignored" and drops it, so the load goes on and
the generation after it too. Running such a call on a worker thread keeps the main thread free
to take the interrupt at once. The worker cannot be stopped from outside, so an interrupt ends
the process there and then (``os._exit``: no half-torn-down llama.cpp at interpreter exit).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

from specgen.errors import EXIT_INTERRUPTED

T = TypeVar("T")


def interruptible(
    call: Callable[[], T], what: str = "", cleanup: Callable[[], None] | None = None
) -> T:
    """``call()`` on a worker thread; Ctrl-C meanwhile runs ``cleanup`` (a half-written file
    removed) and exits 130 with one line on stderr."""
    if threading.current_thread() is not threading.main_thread():
        return call()
    values: list[T] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            values.append(call())
        except BaseException as err:  # handed back to the caller's thread below
            errors.append(err)

    worker = threading.Thread(target=work, name="specgen-load", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.05)
    except KeyboardInterrupt:
        abandon(what, cleanup)
    if errors:
        raise errors[0]
    return values[0]


def abandon(what: str = "", cleanup: Callable[[], None] | None = None) -> None:
    """End the process at once after Ctrl-C: run ``cleanup``, flush what was printed, say so
    (over a spinner's last frame on a terminal), exit 130."""
    if cleanup is not None:
        try:
            cleanup()
        except OSError:
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    note = f" while {what}" if what else ""
    try:
        clear = "\r\x1b[2K" if sys.stderr.isatty() else ""
        sys.stderr.write(f"{clear}interrupted{note}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os._exit(EXIT_INTERRUPTED)
