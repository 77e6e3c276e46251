"""Errors a user can cause, and the one table that turns them into a line, an exit code and an
HTTP status.

Commands raise; ``cli.main`` looks the exception up here and prints only the message (the full
traceback only with ``SPECGEN_DEBUG=1``); batch runs write the same message into their error
lines, and a server answers with the status. Every message says what to do next.

Exit codes: 0 ok, 1 failed, 2 bad usage, 130 interrupted.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from dataclasses import dataclass

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class UserError(Exception):
    """A mistake the user can fix; the message says how."""


class UsageError(UserError):
    """Options or arguments that cannot work together or are out of range (exit code 2)."""


class Interrupted(Exception):  # noqa: N818 (the word users see)
    """Ctrl-C, after the command has shown what it did by then: exit 130, nothing more said."""


class BackendError(RuntimeError):
    """Something llama.cpp refused: a file it cannot load, a decode that failed, a full context."""


class ContextFull(BackendError):
    """The context window has no room for the tokens asked to be decoded."""


class CpuUnsupported(UserError):
    """This build of llama.cpp dies on this CPU (the self-test child was killed by a signal)."""


class PromptTooLong(UserError):
    """The prompt alone fills the context window."""


class ChatTemplateError(UserError):
    """The model has no chat template, or its template failed to render."""


@dataclass(frozen=True)
class Entry:
    """How one kind of error is shown: its message, the exit code, the HTTP status."""

    message: Callable[[BaseException], str]
    exit_code: int = EXIT_FAILED
    http_status: int = 400


def _os_error(err: BaseException) -> str:
    assert isinstance(err, OSError)
    where = f" {err.filename}" if err.filename else ""
    if err.errno == errno.ENOSPC:
        return f"the disk is full (writing{where}): free some space and run again"
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return (
            f"permission denied:{where} ({err.strerror}); check the folder's permissions "
            f"or point SPECGEN_CACHE / -o elsewhere"
        )
    return f"{err.strerror or err}:{where}"


def _text(err: BaseException) -> str:
    return str(err)


# Looked up by the nearest class in an error's MRO: a UserError subclass without a row of its own
# (a prompt too long for the context, a chat template that refuses it) is shown as UserError is.
TABLE: dict[type[BaseException], Entry] = {
    UsageError: Entry(_text, EXIT_USAGE, 400),
    CpuUnsupported: Entry(_text, EXIT_FAILED, 500),
    UserError: Entry(_text, EXIT_FAILED, 400),
    ContextFull: Entry(_text, EXIT_FAILED, 400),
    BackendError: Entry(_text, EXIT_FAILED, 500),
    FileNotFoundError: Entry(
        lambda e: f"file not found: {getattr(e, 'filename', '') or e}", EXIT_FAILED, 404
    ),
    IsADirectoryError: Entry(
        lambda e: f"{getattr(e, 'filename', '')} is a folder, not a file", EXIT_FAILED, 400
    ),
    UnicodeDecodeError: Entry(lambda e: "the input is not valid UTF-8 text", EXIT_FAILED, 400),
    OSError: Entry(_os_error, EXIT_FAILED, 500),
}


def lookup(err: BaseException) -> Entry | None:
    """The table's entry for an error (the nearest class it knows), or None for a bug."""
    for cls in type(err).__mro__:
        if cls in TABLE:
            return TABLE[cls]
    return None


def describe(err: BaseException) -> str | None:
    """The one-line message for an error a user can cause, or None for a bug."""
    entry = lookup(err)
    return None if entry is None else entry.message(err)
