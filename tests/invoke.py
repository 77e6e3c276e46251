"""``specgen ARGS`` as a user runs it, and the check of the one line a refused command says.

``specgen_here`` runs the command in this process, without a new interpreter: it goes through the
entry point (``cli.execute``: the error table, the exit codes), with stdin, stdout and stderr on
real files, as a shell's redirections give them: piped text is a file on stdin (none: an empty
one, as ``subprocess.run(input="")`` gives), and what each stream got is read back apart. A test
that needs a terminal, a signal or a new process (Ctrl-C, the live bar, llama.cpp's own logs)
runs ``python -m specgen`` in a subprocess instead: ``specgen_process`` (waited for) or
``specgen_popen`` (started), on real models or, with ``fakes=True``, on the files
``tests.fakes.write_fake`` writes.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPECGEN = [sys.executable, "-m", "specgen"]
REPO = Path(__file__).resolve().parents[1]  # where ``tests`` imports from


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


def process_env(env: Mapping[str, str | None] | None = None, fakes: bool = False) -> dict[str, str]:
    """The environment of a ``specgen`` subprocess: this one's (the test's own folders, from
    ``conftest.isolated``) with ``env`` over it (None unsets a name). ``fakes``: it loads model
    files as ``tests.fakes`` fakes on a fake clock (``SPECGEN_BACKEND``, with this checkout on
    its path so ``tests`` imports)."""
    merged = dict(os.environ)
    if fakes:
        merged["SPECGEN_BACKEND"] = "tests.fakes:fake_backend"
        merged["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(REPO), os.environ.get("PYTHONPATH")])
        )
    for name, value in (env or {}).items():
        if value is None:
            merged.pop(name, None)
        else:
            merged[name] = value
    return merged


def specgen_process(
    *args: str,
    input: str | None = "",
    env: Mapping[str, str | None] | None = None,
    fakes: bool = False,
    timeout: float = 300,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -m specgen ARGS`` in a process of its own, waited for; ``input`` None gives it
    no stdin at all (``/dev/null``)."""
    return subprocess.run(
        [*SPECGEN, *args],
        input=input,
        stdin=subprocess.DEVNULL if input is None else None,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=process_env(env, fakes),
        cwd=cwd,
    )


def specgen_popen(
    *args: str,
    env: Mapping[str, str | None] | None = None,
    fakes: bool = False,
    **popen: Any,
) -> subprocess.Popen:
    """``python -m specgen ARGS`` started in a process of its own, for a test to signal or read
    as it runs; ``popen`` are ``subprocess.Popen``'s own (``stdout=``, ``stderr=``, ``text=``)."""
    return subprocess.Popen([*SPECGEN, *args], env=process_env(env, fakes), **popen)


def specgen_serve(
    *args: str, env: Mapping[str, str | None] | None = None, fakes: bool = False
) -> tuple[subprocess.Popen, str]:
    """``specgen serve ARGS`` on a free loopback port, once it answers ``/health``: the process
    (stdout and stderr piped, as text) and the server's URL."""
    import httpx2 as httpx

    from tests.conftest import free_port

    port = free_port()
    proc = specgen_popen(
        "serve",
        *args,
        "--port",
        str(port),
        env=env,
        fakes=fakes,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise AssertionError("the server did not start")


def one_line_error(
    done: Done | subprocess.CompletedProcess[str],
    *needles: str,
    code: int = 1,
    progress: bool = False,
) -> str:
    """The one line a refused command says, which holds every needle: the exit ``code``, no
    traceback, nothing on stdout and on stderr a single ``error: ...`` line; or, for a usage
    error Typer catches itself, Typer's usage line and hint framing a single ``Error: ...`` (its
    text is returned joined onto one line). ``progress``: the command did part of its work first
    (a download), so its progress lines on stderr and what it finished on stdout come before."""
    assert done.returncode == code, (done.returncode, done.stderr)
    assert progress or done.stdout == "", done.stdout
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    said = [i for i, line in enumerate(lines) if line.startswith(("error:", "Error:"))]
    assert len(said) == 1, done.stderr
    if lines[said[0]].startswith("error:"):  # ours: the last line, and the only one
        assert said[0] == len(lines) - 1 and (progress or len(lines) == 1), done.stderr
        line = lines[-1]
    else:  # Typer's: "Usage: ...", "Try ... for help.", then the error, maybe wrapped
        assert code == 2 and lines[0].startswith("Usage:"), done.stderr
        line = " ".join(" ".join(lines[said[0] :]).split())
    for needle in needles:
        assert needle in line, done.stderr
    return line


def pair_flags(target: Path, draft: Path, *extra: str) -> list[str]:
    """``--target T --draft D --threads 2`` and ``extra``: a real pair on this machine's two
    cores, as most tests of the real models run it."""
    return ["--target", str(target), "--draft", str(draft), "--threads", "2", *extra]


def batch_of_two(folder: Path, *args: str) -> list[dict[str, Any]]:
    """``specgen run -f`` over two prompts, one a line, with ``args``: the records, each checked
    to carry no error."""
    import json

    prompts = folder / "prompts.txt"
    prompts.write_text("hello world\nsecond prompt\n")
    done = specgen_here("run", "-f", str(prompts), "--each-line", *args)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(records) == 2 and all(r.get("error") is None for r in records)
    return records


def complete_in_process(app: Any, body: dict[str, Any]) -> dict[str, Any]:
    """One ``/v1/completions`` request to an app in this process (httpx's ASGI transport, no
    socket): the answer's JSON."""
    import asyncio

    import httpx2 as httpx

    async def ask() -> httpx.Response:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://specgen"
        ) as client:
            return await client.post("/v1/completions", json=body)

    answer: dict[str, Any] = asyncio.run(ask()).json()
    return answer


# How the tests run the tiny models of ``tests.tiny_models``: one thread, greedy, 24 tokens, JSON.
TINY_FLAGS = ("--threads", "1", "--temperature", "0", "-n", "24", "--json")


def run_tiny(*args: str) -> dict[str, Any]:
    """``specgen run`` on tiny models with ``args``: its JSON."""
    import json

    done = specgen_here("run", *args, *TINY_FLAGS, "hello world")
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def fails_tiny(*args: str) -> str:
    """The one line a refused ``run`` on tiny models says."""
    return one_line_error(specgen_here("run", *args, *TINY_FLAGS, "hello world"))
