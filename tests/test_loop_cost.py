"""The loop's own host cost: measured per cycle, kept with the costs, and reported by doctor."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specgen.lookahead import CostBook
from tests.conftest import with_models_cache


def test_the_host_share_is_kept_with_the_costs() -> None:
    book = CostBook()
    for host, cycle in ((0.004, 0.1), (0.002, 0.1), (0.002, 0.1)):  # the first runs cold
        book.sampled.observe_host(host, cycle)
    again = CostBook.restore(json.loads(json.dumps(book.snapshot())))
    assert again.sampled.host_share is not None
    assert again.sampled.host_share.mean == pytest.approx(0.02)
    assert again.greedy.host_share is None


def _gpu_machine(share: float, backend_sampling: str = "on") -> dict:
    return {
        "self_test": {"ok": True, "message": "passed"},
        "cpu_features": [],
        "cpu_lists_amx": False,
        "gpu_offload": True,
        "nvidia_gpu_present": True,
        "workers": [],
        "physical_cores": 16,
        "default_threads": 16,
        "backend_sampling": backend_sampling,
        "pairs": [
            {
                "name": "p",
                "downloaded": True,
                "bench": {"sampled": {"variant": 4}},
                "host_share": {"sampled": share, "greedy": 0.01},
            }
        ],
    }


def test_doctor_says_where_the_loops_host_work_limits_the_speedup_on_a_gpu() -> None:
    from specgen.checks import advice

    tips = " | ".join(advice(_gpu_machine(0.31)))
    assert "31% of each cycle at sampled decoding" in tips and "greedy" not in tips
    assert "limits the speedup" not in " | ".join(advice(_gpu_machine(0.05)))
    cpu = {**_gpu_machine(0.31), "gpu_offload": False, "nvidia_gpu_present": False}
    assert "limits the speedup" not in " | ".join(advice(cpu))  # a CPU's steps are long
    off = " | ".join(advice(_gpu_machine(0.05, "off")))
    assert "SPECGEN_BACKEND_SAMPLING=0" in off
    assert "0.3.36 or later" in " | ".join(advice(_gpu_machine(0.05, "absent")))


@pytest.mark.slow
def test_a_run_leaves_its_host_share_for_doctor(smollm2_target: Path, smollm2_draft: Path) -> None:
    """A real run on the demo pair measures its loop's host work; doctor reports it, and that
    this build can take rows' top-k on its backend (on this CPU the rows are read in place)."""
    env = with_models_cache()
    run = [sys.executable, "-m", "specgen", "run", "--pair", "smollm2-135m-demo", "--json"]
    done = subprocess.run(
        [*run, "-k", "4", "-n", "32", "--temperature", "0.8", "The history of Rome"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout)["stats"]
    assert stats["rows"] == "whole"
    assert 0 < stats["host_share"] < 1 and stats["host_seconds"] > 0
    doctor = subprocess.run(
        [sys.executable, "-m", "specgen", "doctor", "--json", "--hub-timeout", "0.5"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert doctor.returncode == 0, doctor.stderr
    found = json.loads(doctor.stdout)
    assert found["backend_sampling"] == "on"
    pair = next(p for p in found["pairs"] if p["name"] == "smollm2-135m-demo")
    assert 0 < pair["host_share"]["sampled"] < 1
