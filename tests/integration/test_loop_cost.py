"""The loop's own host cost measured on the real demo pair (only llama.cpp says how long its
decodes took), and doctor reporting it."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import with_models_cache
from tests.invoke import specgen_process


def test_a_run_leaves_its_host_share_for_doctor(smollm2_target: Path, smollm2_draft: Path) -> None:
    """A real run on the demo pair measures its loop's host work; doctor reports it, and that
    this build can take rows' top-k on its backend (on this CPU the rows are read in place)."""
    env = with_models_cache()
    done = specgen_process(
        "run", "--pair", "smollm2-135m-demo", "--json", "-k", "4", "-n", "32",
        "--temperature", "0.8", "The history of Rome", env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout)["stats"]
    assert stats["rows"] == "whole"
    assert 0 < stats["host_share"] < 1 and stats["host_seconds"] > 0
    doctor = specgen_process("doctor", "--json", "--hub-timeout", "0.5", env=env)
    assert doctor.returncode == 0, doctor.stderr
    found = json.loads(doctor.stdout)
    assert found["backend_sampling"] == "on"
    pair = next(p for p in found["pairs"] if p["name"] == "smollm2-135m-demo")
    assert 0 < pair["host_share"]["sampled"] < 1
