"""Ctrl-C during a long call into C: the call runs on a worker thread, its result or error comes
back to the caller, and an interrupt meanwhile ends the process at once with one line."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import pytest

from specgen.host.interrupts import interruptible


def test_the_call_s_result_and_error_come_back() -> None:
    assert interruptible(lambda: 41 + 1, "adding") == 42
    with pytest.raises(ZeroDivisionError):
        interruptible(lambda: 1 / 0, "dividing")
    seen = []
    worker = threading.Thread(target=lambda: seen.append(interruptible(threading.get_ident)))
    worker.start()
    worker.join()
    assert seen == [worker.ident]  # off the main thread the call runs right there


def test_ctrl_c_during_the_call_ends_the_process_at_once_with_one_line() -> None:
    code = (
        "import time; from specgen.host.interrupts import interruptible\n"
        "def call():\n    print('ready', flush=True)\n    time.sleep(60)\n"
        "interruptible(call, 'waiting for nothing')\nprint('finished')"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"  # the call began
    time.sleep(0.2)  # and the main thread waits for it
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and out == ""  # the call was not waited for
    assert err.strip().splitlines() == ["interrupted while waiting for nothing"]
    assert time.monotonic() - sent < 30  # well before the 60 s sleep would have ended


def test_ctrl_c_during_a_conversion_leaves_no_partial_file(tmp_path) -> None:
    """The F32 copy being written (gigabytes for a 7B) is removed before the process ends."""
    src = tmp_path / "model.gguf"
    src.write_bytes(b"GGUF" + bytes(64))
    code = (
        "import time, specgen.backend as backend\n"
        "from specgen.models import fetch\n"
        "def quantize(src, dest, quant):\n"
        "    dest.write_bytes(b'half a model')\n"
        "    print('writing', flush=True)\n"
        "    time.sleep(60)\n"
        "backend.quantize = quantize\n"
        f"fetch.derive(__import__('pathlib').Path({str(src)!r}), 'F32')\n"
    )
    cache = tmp_path / "cache"
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**__import__("os").environ, "SPECGEN_CACHE": str(cache)},
    )
    assert proc.stdout is not None and proc.stdout.readline() == "writing\n"
    assert list(cache.rglob("*.partial"))  # the half-written file is there
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "interrupted while converting model.gguf" in err
    assert not list(cache.rglob("*.partial")) and not list(cache.rglob("*.gguf"))
