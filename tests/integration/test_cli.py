"""The command line on the real demo pair, for what only llama.cpp shows: its own logs kept
off the terminal, and a load that Ctrl-C cuts short. The rest of the command line is tested on
fakes (tests/cli/)."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from tests.invoke import pair_flags, specgen_popen, specgen_process


@pytest.fixture(scope="module")
def pair_args(smollm2_target: Path, smollm2_draft: Path) -> list[str]:
    return pair_flags(smollm2_target, smollm2_draft, "--temperature", "0", "-n", "24", "--raw")


def test_real_models_print_only_the_text_and_llama_cpp_stays_silent(pair_args: list[str]) -> None:
    done = specgen_process("run", "The capital of France is", *pair_args)
    assert done.returncode == 0, done.stderr
    as_json = specgen_process("run", "The capital of France is", *pair_args, "--json")
    assert done.stdout == json.loads(as_json.stdout)["text"] and done.stdout
    assert "tok/s" in done.stderr and "accept" in done.stderr
    assert "llama" not in done.stderr.lower()  # llama.cpp's own logs stay silent
    assert as_json.stderr == ""


def test_ctrl_c_while_loading_stops_at_once(smollm2_target: Path, smollm2_draft: Path) -> None:
    """A real SIGINT during the load: no tokens, one line of ours, exit 130."""
    import time

    proc = specgen_popen(
        "run",
        "Tell me a long story.",
        "--target",
        str(smollm2_target),
        "--draft",
        str(smollm2_draft),
        "-n",
        "500",
        "--verbose",
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    seen = b""
    while b"llama_model_loader" not in seen:  # llama.cpp has started reading the target
        chunk = proc.stderr.readline()
        assert chunk, seen
        seen += chunk
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    waited = time.monotonic() - sent
    assert proc.returncode == 130, err[-2000:]
    assert out == b""  # nothing was generated
    assert b"Exception ignored" not in err and b"Traceback" not in err
    assert err.decode().strip().splitlines()[-1] == "interrupted while loading the models"
    assert waited < 10  # the load was not finished first (it takes ~1 s), let alone 500 tokens
