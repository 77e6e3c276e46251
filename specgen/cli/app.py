"""The ``specgen`` app: thin Typer commands over the engine, the registry and the bench.

Each command parses options, builds plain objects and hands them on; ``main`` owns the error
table (``specgen.errors``): a user's mistake ends as one line on stderr, never a traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Annotated

import typer

from specgen import __version__
from specgen.cli.bench import bench
from specgen.cli.doctor import doctor
from specgen.cli.models import app as models_app
from specgen.cli.options import HELP, readable_help_placeholders
from specgen.cli.output import out
from specgen.cli.run import chat, run
from specgen.cli.serve import serve
from specgen.cli.worker import worker
from specgen.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    Interrupted,
    lookup,
)

app = typer.Typer(
    name="specgen",
    help="Fast local text generation with speculative decoding on llama.cpp.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings=HELP,
)
readable_help_placeholders()


def _version(value: bool) -> None:
    if value:
        typer.echo(f"specgen {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Fast local text generation with speculative decoding on llama.cpp."""


app.command()(run)
app.command("chat")(chat)
app.add_typer(models_app, name="models")
app.command("bench")(bench)
app.command("doctor")(doctor)
app.command("serve")(serve)
app.command("worker")(worker)


def main(args: Sequence[str] | None = None) -> None:
    """Entry point: run the app on ``args`` (default: the command line) and exit with its code;
    every error a user can cause ends as one line (exit codes: 0 ok, 1 failed, 2 bad usage,
    130 interrupted)."""
    sys.exit(execute(args))


def execute(args: Sequence[str] | None = None) -> int:
    """Run the app and return its exit code (``main`` without the exit, for tests in-process)."""
    try:
        code = app(args=None if args is None else list(args), standalone_mode=False)
        sys.stdout.flush()
        if code == EXIT_INTERRUPTED:  # Typer turns a Ctrl-C nobody handled into 130
            out.warning("interrupted")
        return code if isinstance(code, int) else EXIT_OK
    except Interrupted:  # the command already showed what it had done
        return EXIT_INTERRUPTED
    except typer.Exit as exit_:
        return int(exit_.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        out.warning("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return _reader_left()
    except SystemExit as exit_:  # Typer turns a broken pipe into exit 1
        if isinstance(exit_.__context__, BrokenPipeError):
            return _reader_left()
        raise
    except Exception as err:  # the error table decides what a user sees
        if os.environ.get("SPECGEN_DEBUG") == "1":
            raise
        return _report(err)


def _reader_left() -> int:
    """The reader of stdout went away (`| head`): its choice, not an error; exit quietly."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_OK


def _report(err: Exception) -> int:
    """Print one line for an error and return the exit code the table gives it."""
    entry = lookup(err)
    if entry is None:
        show = getattr(err, "show", None)
        if callable(show):  # Typer's usage errors: print them as Typer would
            show()
            return int(getattr(err, "exit_code", EXIT_USAGE))
        out.error(
            f"internal error: {type(err).__name__}: {err} (rerun with SPECGEN_DEBUG=1 "
            f"for the traceback, and report it)"
        )
        return EXIT_FAILED
    out.error(entry.message(err))
    return entry.exit_code
