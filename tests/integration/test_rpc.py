"""Real `specgen worker`s on 127.0.0.1 with the SmolLM2 demo models: output equal to the local
target's, placement (the draft and the output layer stay here, counted in bytes), and every
failure as one line. The pure checks, on fakes, are in tests/host/test_rpc.py."""

from __future__ import annotations

import json
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path

import pytest

from specgen.host import rpc
from tests.conftest import free_port, with_models_cache
from tests.invoke import (
    one_line_error,
    pair_flags,
    specgen_popen,
    specgen_process,
    specgen_serve,
)
from tests.rpc_helpers import CountingProxy, fake_server, hello_reply, wait_for_worker, worker


# -- real workers --------------------------------------------------------------------------------
def run_json(
    target: Path,
    draft: Path | None,
    *extra: str,
    prompt: str = "The capital of France is",
    n: int = 24,
    env: dict[str, str] | None = None,
) -> dict:
    models = ["--target", str(target)] + (["--draft", str(draft)] if draft else [])
    args = [
        "run",
        *models,
        "--raw",
        "--temperature",
        "0",
        "-n",
        str(n),
        "--threads",
        "1",
        "--json",
        *extra,
        prompt,
    ]
    done = specgen_process(*args, env={**with_models_cache(), **(env or {})})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.needs_rpc
def test_greedy_through_one_and_two_workers_is_the_local_target_s(
    smollm2_target: Path, smollm2_draft: Path
) -> None:
    local = run_json(smollm2_target, None, "-k", "0")
    with worker() as (first, _), worker() as (second, _):
        one = run_json(smollm2_target, None, "-k", "0", "--rpc", first)
        two = run_json(smollm2_target, None, "-k", "0", "--rpc", f"{first},{second}")
        speculative = run_json(smollm2_target, smollm2_draft, "-k", "8", "--rpc", first)
        whole_head = run_json(
            smollm2_target, None, "-k", "0", "--rpc", first, "--no-rpc-local-head"
        )
    assert local["stats"]["generated_tokens"] == 24
    for remote in (one, two, speculative, whole_head):
        assert remote["text"] == local["text"] and remote["stats"]["generated_tokens"] == 24
    assert speculative["stats"]["cycles"] < 24 and speculative["stats"]["accepted"] > 0


@pytest.mark.needs_rpc
def test_the_draft_and_the_output_layer_stay_on_this_machine(
    smollm2_target: Path, smollm2_draft: Path
) -> None:
    target_size, draft_size = smollm2_target.stat().st_size, smollm2_draft.stat().st_size
    traffic, texts = {}, {}
    ways = {
        "local head": ("--rpc-local-head", {}),
        "remote head": ("--no-rpc-local-head", {}),
        "remote head, whole rows": ("--no-rpc-local-head", {"SPECGEN_BACKEND_SAMPLING": "0"}),
    }
    with worker() as (endpoint, _):
        for way, (head, env) in ways.items():
            proxy = CountingProxy(endpoint)
            try:
                texts[way] = run_json(
                    smollm2_target, smollm2_draft, "-k", "4", "--rpc", proxy.endpoint, head,
                    n=32, env=env,
                )["text"]  # fmt: skip
                traffic[way] = proxy.counts()
            finally:
                proxy.close()
    assert len(set(texts.values())) == 1  # greedy: the same text every way
    sent_all, received_whole = traffic["remote head, whole rows"]
    sent_local, received_local = traffic["local head"]
    # The whole target went over, and not the draft (which would add its 98 MB).
    assert 0.9 * target_size < sent_all < target_size + draft_size / 2
    # With the output layer here, results are hidden states (576 floats a row), not logit rows
    # (49152 floats each): over ten times fewer bytes back, and the tied embedding stays here.
    assert received_local * 10 < received_whole
    assert sent_local < sent_all - 50 * 2**20
    # With the output layer there, the worker's backend takes each row's argmax: a token id a
    # row comes back, fewer bytes than even the hidden states.
    assert traffic["remote head"][1] < received_local


@pytest.mark.needs_rpc
def test_failures_before_attaching_are_one_line_each(smollm2_target: Path) -> None:
    def run(*extra: str) -> subprocess.CompletedProcess:
        return specgen_process(
            "run",
            "--target",
            str(smollm2_target),
            "-n",
            "4",
            *extra,
            "hi",
            env=with_models_cache(),
            timeout=120,
        )

    nobody = run("--rpc", f"127.0.0.1:{free_port()}")
    one_line_error(nobody, "nothing is listening")
    with worker() as (endpoint, _):
        host, port = endpoint.split(":")
        occupant = socket.create_connection((host, int(port)))  # another client, mid-session
        occupant.sendall(bytes([14]) + struct.pack("<Q", 24) + bytes(24))
        occupant.recv(36)
        busy = run("--rpc", endpoint)
        occupant.close()
    one_line_error(busy, "serving another client")
    with fake_server(hello_reply((rpc.PROTOCOL[0] + 1, 0, 0))) as stranger:
        mismatch = run("--rpc", str(stranger))
    one_line_error(mismatch, "speaks RPC protocol")


@pytest.mark.needs_rpc
def test_a_worker_killed_mid_run_ends_the_run_with_one_line(
    smollm2_target: Path, tmp_path: Path
) -> None:
    with worker() as (endpoint, worker_proc):
        run = specgen_popen(
            "run",
            "--target",
            str(smollm2_target),
            "--raw",
            "-k",
            "0",
            "-n",
            "3000",
            "--ctx-size",
            "4096",
            "--rpc",
            endpoint,
            "Once upon a time",
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=with_models_cache(),
            cwd=tmp_path,
        )
        first = run.stdout.read(1)  # generating: text is coming
        worker_proc.kill()
        rest, errors = run.communicate(timeout=120)
    text = errors.decode()
    assert first and run.returncode == 1, text
    assert "lost the connection to the RPC worker" in text and "Traceback" not in text
    assert "GGML" not in text and len(text.strip().splitlines()) == 1
    assert not list(tmp_path.glob("core*"))


@pytest.mark.needs_rpc
def test_a_worker_stops_cleanly_and_shows_what_it_serves() -> None:
    with worker() as (endpoint, proc):
        host, port = endpoint.split(":")
        held = socket.create_connection((host, int(port)))
        held.sendall(bytes([14]) + struct.pack("<Q", 24) + bytes(24))
        held.recv(36)
        time.sleep(2.5)  # a session, not a probe (1 s at least): the worker shows it
        held.close()
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert f"specgen worker at {endpoint}" in err and "CPU" in err
    assert "client connected" in err and "client disconnected after" in err
    assert "worker stopped" in err and out == ""
    with worker() as (endpoint, _):
        port = endpoint.split(":")[1]
        clash = specgen_process("worker", "--port", port, timeout=60)
    assert clash.returncode == 1 and "pick another --port" in clash.stderr


@pytest.mark.needs_rpc
def test_doctor_lists_the_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    with worker() as (endpoint, _):
        done = specgen_process("doctor", "--json", "--rpc", endpoint, timeout=120)
        wait_for_worker(endpoint)  # doctor let go of it
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)["workers"]
    assert found[0]["endpoint"] == endpoint and found[0]["protocol"] == "7.0.0"
    assert found[0]["round_trip_ms"] > 0 and found[0]["devices"][0]["total_bytes"] > 0


@pytest.mark.needs_rpc
def test_bench_measures_the_verify_over_the_workers(
    smollm2_target: Path, smollm2_draft: Path, tmp_path: Path
) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The capital of France is\n")
    with worker() as (endpoint, _):
        done = specgen_process(
            "bench",
            "--target",
            str(smollm2_target),
            "--draft",
            str(smollm2_draft),
            "-k",
            "2",
            "-n",
            "8",
            "--temperature",
            "0",
            "--prompts",
            str(prompts),
            "--threads",
            "1",
            "--rpc",
            endpoint,
            "--json",
            str(tmp_path / "bench.json"),
            env=with_models_cache(),
        )
    assert done.returncode == 0, done.stderr
    shown = " ".join(done.stdout.split())  # the title wraps at the table's width
    assert f"target on {endpoint}" in shown and "RPC workers" in shown
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["meta"]["target"]["workers"] == [endpoint]


@pytest.mark.needs_rpc
def test_serve_over_a_worker_answers_as_run_does_here(
    smollm2_target: Path, smollm2_draft: Path
) -> None:
    import openai

    here = run_json(smollm2_target, smollm2_draft, "-k", "4")
    with worker() as (endpoint, _):
        proc, url = specgen_serve(
            *pair_flags(smollm2_target, smollm2_draft), "--rpc", endpoint, "-k", "4"
        )
        try:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
            answer = client.completions.create(
                model="x", prompt="The capital of France is", temperature=0, max_tokens=24
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    assert answer.choices[0].text == here["text"]
    assert answer.usage.completion_tokens == 24


@pytest.mark.needs_rpc
def test_parallel_streams_over_a_worker_are_the_local_batchs(
    smollm2_target: Path, smollm2_draft: Path, tmp_path: Path
) -> None:
    """A batch of three prompts as two streams (``run -f --parallel 2``) with the target's
    layers on a worker: each line the one the same batch gives with the target here (a fixed K,
    so the batches' shapes, and so their floats, are the same both ways)."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The capital of France is\ndef fibonacci(n):\nHere is a list of fruits:\n")
    common = [
        "run", "-f", str(prompts), "--each-line", "--parallel", "2", "--raw",
        *pair_flags(smollm2_target, smollm2_draft), "-k", "4", "--temperature", "0", "-n", "24",
        "--threads", "1",
    ]  # fmt: skip

    def lines(*extra: str) -> list[dict]:
        done = specgen_process(*common, *extra, env=with_models_cache())
        assert done.returncode == 0, done.stderr
        return [json.loads(line) for line in done.stdout.splitlines()]

    here = lines()
    with worker() as (endpoint, _):
        remote = lines("--rpc", endpoint)
    assert len(here) == len(remote) == 3
    assert [r["text"] for r in remote] == [r["text"] for r in here]
    assert all(r.get("error") is None and r["text"] for r in remote)
