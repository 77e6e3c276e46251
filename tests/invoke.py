"""``specgen ARGS`` run in this process, as a user runs it but without a new interpreter.

The command goes through the entry point (``cli.execute``: the error table, the exit codes), with
stdin, stdout and stderr on real files, as a shell's redirections give them: piped text is a
file on stdin (none: an empty one, as ``subprocess.run(input="")`` gives), and what each stream
got is read back apart. A test that needs a terminal, a signal or a new process (Ctrl-C, the
live bar, llama.cpp's own logs) runs ``python -m specgen`` in a subprocess instead.
"""

from __future__ import annotations

import io
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Done:
    """What a command did: its exit code and what it wrote to each stream."""

    returncode: int
    stdout: str
    stderr: str


def specgen_here(
    *args: str,
    input: str | None = "",
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    merged: bool = False,
) -> Done:
    """Run the command; ``input`` None gives it no stdin at all (``/dev/null``), and ``merged``
    one file for stdout and stderr (``> log 2>&1``: then all of it is in ``stdout``)."""
    from specgen import cli

    saved_streams = sys.stdin, sys.stdout, sys.stderr
    saved_env = {name: os.environ.get(name) for name in env or {}}
    saved_cwd = Path.cwd()
    with (
        open(os.devnull, "rb") if input is None else tempfile.TemporaryFile() as stdin,
        tempfile.TemporaryFile() as stdout,
        tempfile.TemporaryFile() as stderr,
    ):
        if input is not None:
            stdin.write(input.encode("utf-8"))
            stdin.seek(0)
        sys.stdin = io.TextIOWrapper(stdin, encoding="utf-8")
        sys.stdout = io.TextIOWrapper(stdout, encoding="utf-8", write_through=True)
        sys.stderr = io.TextIOWrapper(
            stdout if merged else stderr,
            encoding="utf-8",
            errors="backslashreplace",
            write_through=True,
        )
        os.environ.update(env or {})
        if cwd is not None:
            os.chdir(cwd)
        try:
            code = cli.execute(list(args))
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for stream in (sys.stdin, sys.stdout, sys.stderr):
                stream.detach()
            sys.stdin, sys.stdout, sys.stderr = saved_streams
            for name, value in saved_env.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            os.chdir(saved_cwd)
        stdout.seek(0)
        stderr.seek(0)
        return Done(code, stdout.read().decode("utf-8"), stderr.read().decode("utf-8"))


def pair_flags(target: Path, draft: Path, *extra: str) -> list[str]:
    """``--target T --draft D --threads 2`` and ``extra``: a real pair on this machine's two
    cores, as most tests of the real models run it."""
    return ["--target", str(target), "--draft", str(draft), "--threads", "2", *extra]
