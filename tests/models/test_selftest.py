"""The CPU self-test (a child that dies of SIGILL ends as one line with the fix) and doctor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specgen.errors import CpuUnsupported
from specgen.models import selftest

DIES_OF_SIGILL = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGILL)"]
PASSES = [sys.executable, "-c", "pass"]
FAILS = [sys.executable, "-c", "raise SystemExit(3)"]


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    """A file with a GGUF header that says Q4_K_M (the self-test keys on quantization)."""
    import struct

    def string(text: str) -> bytes:
        return struct.pack("<Q", len(text)) + text.encode()

    path = tmp_path / "m.gguf"
    path.write_bytes(
        b"GGUF"
        + struct.pack("<IQQ", 3, 0, 1)
        + string("general.file_type")
        + struct.pack("<II", 4, 15)
    )
    return path


@pytest.fixture
def selftest_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECGEN_SELFTEST", "1")


def test_a_child_killed_by_sigill_is_named_with_the_fix(
    model_file: Path, selftest_on: None
) -> None:
    verdict = selftest.run_child(DIES_OF_SIGILL)
    assert verdict is not None and not verdict.ok and verdict.signal == "SIGILL"
    with pytest.raises(CpuUnsupported) as caught:
        selftest.ensure_cpu_works([model_file], command=DIES_OF_SIGILL)
    message = str(caught.value)
    assert "SIGILL" in message and selftest.PORTABLE_CMAKE_ARGS in message
    assert "pip install --force-reinstall --no-cache-dir llama-cpp-python" in message
    # the verdict is cached: a second call does not run a child (this one would pass)
    with pytest.raises(CpuUnsupported):
        selftest.ensure_cpu_works([model_file], command=PASSES)


def test_a_passing_child_is_cached_and_a_failing_one_is_not(
    model_file: Path, selftest_on: None
) -> None:
    assert selftest.ensure_cpu_works([model_file], command=FAILS) is None
    assert selftest.cached_verdict([model_file]) is None  # not a CPU verdict: not kept
    assert selftest.ensure_cpu_works([model_file], command=PASSES).ok
    assert selftest.ensure_cpu_works([model_file], command=DIES_OF_SIGILL).ok  # cached


def test_the_cli_stops_with_one_line_on_an_unsupported_cpu(
    model_file: Path, selftest_on: None
) -> None:
    with pytest.raises(CpuUnsupported):
        selftest.ensure_cpu_works([model_file], command=DIES_OF_SIGILL)
    done = subprocess.run(
        [sys.executable, "-m", "specgen", "run", "hi", "--target", str(model_file)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "SIGILL" in lines[0] and "CMAKE_ARGS" in lines[0]


@pytest.mark.slow
def test_the_real_self_test_passes_here(
    smollm2_draft: Path, smollm2_target: Path, selftest_on: None
) -> None:
    verdict = selftest.ensure_cpu_works([smollm2_target, smollm2_draft])
    assert verdict is not None and verdict.ok
    assert set(selftest.quant_types([smollm2_target, smollm2_draft])) == {"F32", "Q4_1"}


def test_doctor_json_and_its_advice() -> None:
    from specgen.checks import advice

    done = subprocess.run(
        [sys.executable, "-m", "specgen", "doctor", "--json", "--hub-timeout", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    for key in (
        "llama_cpp_python",
        "system_info",
        "backends",
        "gpu_offload",
        "self_test",
        "default_threads",
        "caches",
        "pairs",
        "hub",
        "advice",
    ):
        assert key in found
    assert found["caches"]["specgen cache"]["path"] == os.environ["SPECGEN_CACHE"]
    assert found["hub"]["state"]
    machine = {
        **found,
        "gpu_offload": False,
        "nvidia_gpu_present": True,
        "physical_cores": 4,
        "default_threads": 8,
        "cpu_lists_amx": False,
        "self_test": {"ok": True, "message": "passed"},
        "pairs": [
            {
                "name": "p",
                "downloaded": True,
                "bench": {"sampled": {"variant": 0, "cost_ratio": 0.7}},
            }
        ],
    }
    tips = " | ".join(advice(machine))
    assert "-DGGML_CUDA=on" in tips and "--threads 4" in tips
    assert "no K pays" in tips and "0.70 of a target step" in tips
    human = subprocess.run(
        [sys.executable, "-m", "specgen", "doctor", "--hub-timeout", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )
    assert human.returncode == 0 and "CPU self-test" in human.stdout
