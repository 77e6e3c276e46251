"""What ``specgen doctor`` finds and advises (``specgen.checks``): the advice read from made-up
machines (``tests.fakes.machine_facts``), and doctor's report of a pair it has seen run."""

from __future__ import annotations

import json
import os
from pathlib import Path

from specgen.checks import Facts, advice
from tests.fakes import machine_facts, pair_facts
from tests.invoke import specgen_here
from tests.tiny_models import write_qwen35


def _gpu_machine(share: float, backend_sampling: str = "on") -> Facts:
    """A GPU machine whose pair's loop took ``share`` of each sampled cycle on the host."""
    pair = pair_facts(
        bench={"sampled": {"variant": 4}}, host_share={"sampled": share, "greedy": 0.01}
    )
    return machine_facts(
        pair, gpu_offload=True, nvidia_gpu_present=True, backend_sampling=backend_sampling
    )


def test_doctor_says_where_the_loops_host_work_limits_the_speedup_on_a_gpu() -> None:
    tips = " | ".join(advice(_gpu_machine(0.31)))
    assert "31% of each cycle at sampled decoding" in tips and "greedy" not in tips
    assert "limits the speedup" not in " | ".join(advice(_gpu_machine(0.05)))
    cpu = {**_gpu_machine(0.31), "gpu_offload": False, "nvidia_gpu_present": False}
    assert "limits the speedup" not in " | ".join(advice(cpu))  # a CPU's steps are long
    off = " | ".join(advice(_gpu_machine(0.05, "off")))
    assert "SPECGEN_BACKEND_SAMPLING=0" in off
    assert "0.3.36 or later" in " | ".join(advice(_gpu_machine(0.05, "absent")))


def test_doctor_says_how_a_hybrid_target_rolls_back_and_what_it_cost(tmp_path: Path) -> None:
    target = write_qwen35(tmp_path / "mtp.gguf", mtp=True)
    home = Path(os.environ["SPECGEN_HOME"])
    (home / "models.toml").write_text(
        f'[pairs.tiny]\ntarget = {{ path = "{target}" }}\ndraft = "mtp"\n'
    )
    ran = specgen_here("run", "--pair", "tiny", "-k", "6", "-n", "16", "--threads", "1", "hi")
    assert ran.returncode == 0, ran.stderr
    found = json.loads(specgen_here("doctor", "--json", "--hub-timeout", "0.1").stdout)
    tiny = next(p for p in found["pairs"] if p["name"] == "tiny")
    assert tiny["target_layout"]["kind"] == "hybrid" and tiny["target_layout"]["mtp_heads"] == 1
    assert tiny["rollback"]["snapshots"] == 6 and tiny["rollback"]["bounded"] > 0
    assert found["mtp_api"] is True
    human = specgen_here("doctor", "--hub-timeout", "0.1")
    assert "tiny target" in human.stdout and "by snapshot" in human.stdout
    moe = pair_facts(target_layout={"few_active_experts": True, "experts": "8 of 256"})
    tips = " | ".join(advice(machine_facts(moe)))
    assert "8 of 256 experts a token" in tips and "--draft ngram" in tips


def test_doctor_warns_when_other_processes_hold_the_cores() -> None:
    busy = machine_facts(logical_cpus=2, physical_cores=2, default_threads=2, others_busy=1.1)
    tips = " | ".join(advice(busy))
    assert "other processes keep 1.1 of 2 CPUs busy now" in tips and "use 1 thread " in tips
    assert "other processes" not in " | ".join(advice(machine_facts()))  # an idle machine
