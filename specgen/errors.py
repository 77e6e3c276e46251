"""Errors a user can cause, and the single table that turns them into one line each.

Commands raise; ``cli.main`` looks the exception up here and prints only the message (the full
traceback only with ``SPECGEN_DEBUG=1``). Every message says what to do next.
"""

from __future__ import annotations


class UserError(Exception):
    """A mistake the user can fix; the message says how."""


class BackendError(RuntimeError):
    """Something llama.cpp refused: a file it cannot load, a decode that failed, a full context."""


class ContextFull(BackendError):
    """The context window has no room for the tokens asked to be decoded."""


def describe(err: BaseException) -> str | None:
    """The one-line message for an error a user can cause, or None for a bug."""
    # Imported here so that `specgen --help` does not pay for llama_cpp.
    from specgen.chat import ChatTemplateError
    from specgen.engine import PromptTooLong

    if isinstance(err, UserError | BackendError | ChatTemplateError | PromptTooLong):
        return str(err)
    if isinstance(err, FileNotFoundError):
        return f"file not found: {err.filename or err}"
    if isinstance(err, IsADirectoryError | PermissionError):
        return f"cannot read {err.filename}: {err.strerror}"
    if isinstance(err, UnicodeDecodeError):
        return "the prompt is not valid UTF-8 text"
    return None
