"""`specgen serve` for real: a uvicorn server on loopback with the SmolLM2 pair, driven by the
official `openai` client and by plain HTTP (httpx2, the client the openai package itself uses):
answers equal to `specgen run`'s, clients that go away, SIGTERM. The app's behaviour request by
request is tested in this process on fake models (test_server_app.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.invoke import pair_flags

pytestmark = pytest.mark.slow
openai = pytest.importorskip("openai")
KEY = "sk-specgen-test"


def start(target: Path, draft: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "specgen",
            "serve",
            *pair_flags(target, draft),
            "--port",
            str(port),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    url = f"http://127.0.0.1:{port}"
    import httpx2 as httpx

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    raise AssertionError("the server did not start")


@pytest.fixture(scope="module")
def server(smollm2_target: Path, smollm2_draft: Path) -> Iterator[str]:
    proc, url = start(smollm2_target, smollm2_draft, "--api-key", KEY, "--queue", "0")
    yield url
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)


@pytest.fixture
def client(server: str):
    return openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0)


def metric(url: str, name: str) -> float:
    import httpx2 as httpx

    text = httpx.get(f"{url}/metrics").text
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(name + " ") or line.startswith(name + "{")
    )


def tokens_since(server: str, client, generated: float) -> float:
    """Tokens generated since ``generated`` was read, once the model is free again (a small
    request gets through: until the cancelled generation has ended it meets a 503)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            client.completions.create(model="x", prompt="Hi", max_tokens=2)
            break
        except openai.InternalServerError:
            assert time.monotonic() < deadline, "the cancelled generation never ended"
            time.sleep(0.1)
    return metric(server, "specgen_generation_tokens_total") - generated - 2


def run_cli(*args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "specgen", "run", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_greedy_chat_and_completions_equal_specgen_run(
    client, smollm2_target: Path, smollm2_draft: Path
) -> None:
    models = pair_flags(smollm2_target, smollm2_draft, "--temperature", "0", "-n", "24")
    chat = client.chat.completions.create(
        model="x",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0,
        max_tokens=24,
    )
    assert (
        chat.choices[0].message.content
        == run_cli("What is the capital of France?", *models)["text"]
    )
    completion = client.completions.create(
        model="x", prompt="The capital of France is", temperature=0, max_tokens=24
    )
    assert (
        completion.choices[0].text == run_cli("The capital of France is", *models, "--raw")["text"]
    )
    pieces = [
        c.choices[0].text
        for c in client.completions.create(
            model="x", prompt="The capital of France is", temperature=0, max_tokens=24, stream=True
        )
    ]
    assert "".join(pieces) == completion.choices[0].text
    streamed = client.chat.completions.create(
        model="x",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0,
        max_tokens=24,
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == chat.choices[0].message.content


def test_timings_usage_and_metrics_agree(client, server: str) -> None:
    before = {
        name: metric(server, name)
        for name in (
            "specgen_spec_decode_num_draft_tokens_total",
            "specgen_spec_decode_num_accepted_tokens_total",
            "specgen_generation_tokens_total",
            "specgen_spec_decode_num_accepted_tokens_per_pos_total",
        )
    }
    raw = client.completions.with_raw_response.create(
        model="x", prompt="Once upon a time", temperature=0.7, seed=3, max_tokens=40
    )
    body = json.loads(raw.text)
    timings, usage = body["timings"], body["usage"]
    assert timings["predicted_n"] == usage["completion_tokens"] > 0
    assert 0 <= timings["draft_n_accepted"] <= timings["draft_n"]
    assert timings["prompt_n"] + timings["cache_n"] == usage["prompt_tokens"]
    assert 0 < timings["host_ms"] < timings["predicted_ms"]
    after = {name: metric(server, name) for name in before}
    assert (
        after["specgen_generation_tokens_total"] - before["specgen_generation_tokens_total"]
        == usage["completion_tokens"]
    )
    assert (
        after["specgen_spec_decode_num_draft_tokens_total"]
        - before["specgen_spec_decode_num_draft_tokens_total"]
        == timings["draft_n"]
    )
    accepted = (
        after["specgen_spec_decode_num_accepted_tokens_total"]
        - before["specgen_spec_decode_num_accepted_tokens_total"]
    )
    assert accepted == timings["draft_n_accepted"]
    assert (
        after["specgen_spec_decode_num_accepted_tokens_per_pos_total"]
        - before["specgen_spec_decode_num_accepted_tokens_per_pos_total"]
        == accepted
    )
    assert metric(server, "specgen_request_latency_seconds_count") > 0


def test_a_second_chat_turn_reuses_the_first(client) -> None:
    first = [{"role": "user", "content": "Name a colour."}]
    one = client.chat.completions.with_raw_response.create(
        model="x", messages=first, temperature=0, max_tokens=16
    )
    answer = json.loads(one.text)
    reply = answer["choices"][0]["message"]["content"]
    turn_two = [
        *first,
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "And another one?"},
    ]
    two = json.loads(
        client.chat.completions.with_raw_response.create(
            model="x", messages=turn_two, temperature=0, max_tokens=16
        ).text
    )
    cached = two["timings"]["cache_n"]
    assert cached >= answer["usage"]["prompt_tokens"]  # all of turn one's prompt, at least
    assert two["timings"]["prompt_n"] < two["usage"]["prompt_tokens"] - cached + 1
    assert two["usage"]["prompt_tokens_details"]["cached_tokens"] == cached


def test_queue_overflow_and_a_client_that_leaves(server: str, client) -> None:
    import httpx2 as httpx

    auth = {"Authorization": f"Bearer {KEY}"}
    generated = metric(server, "specgen_generation_tokens_total")
    with httpx.stream(
        "POST",
        f"{server}/v1/completions",
        headers=auth,
        timeout=120,
        json={
            "prompt": "Count to one thousand: 1, 2, 3,",
            "max_tokens": 400,
            "temperature": 0,
            "stream": True,
        },
    ) as stream:
        lines = stream.iter_lines()
        assert next(lines).startswith("data: ")  # generating now
        busy = httpx.post(
            f"{server}/v1/completions",
            headers=auth,
            timeout=30,
            json={"prompt": "Hi", "max_tokens": 2},
        )
        assert busy.status_code == 503 and busy.headers["Retry-After"]
        assert busy.json()["error"]["code"] == "busy"
    # the client left after one chunk: its generation stops at the next cycle, long before the
    # 400 tokens asked for (however fast the machine: a few cycles pass, not 400 tokens' worth)
    spent = tokens_since(server, client, generated)
    assert spent < 400, spent


def test_sigterm_ends_streams_with_a_final_event(smollm2_target: Path, smollm2_draft: Path) -> None:
    import httpx2 as httpx

    proc, url = start(smollm2_target, smollm2_draft)
    events = []
    with httpx.stream(
        "POST",
        f"{url}/v1/completions",
        timeout=120,
        json={
            "prompt": "Count to one thousand: 1, 2, 3,",
            "max_tokens": 1000,
            "temperature": 0,
            "stream": True,
        },
    ) as stream:
        for line in stream.iter_lines():
            if not line:
                continue
            events.append(line)
            if len(events) == 2:
                proc.send_signal(signal.SIGTERM)
    assert events[-1] == "data: [DONE]"
    final = json.loads(events[-2].removeprefix("data: "))
    assert final["choices"][0]["finish_reason"] == "stop"
    assert final["usage"]["completion_tokens"] < 1000
    # uvicorn ends gracefully, then re-raises the signal, as a terminated process should
    assert proc.wait(timeout=60) in (0, -signal.SIGTERM)
    assert "Traceback" not in proc.communicate()[1]


def test_a_non_streaming_client_that_leaves_cancels_too(server: str, client) -> None:
    import httpx2 as httpx

    generated = metric(server, "specgen_generation_tokens_total")
    with pytest.raises(httpx.TimeoutException):
        httpx.post(
            f"{server}/v1/completions",
            headers={"Authorization": f"Bearer {KEY}"},
            json={
                "prompt": "Count to one thousand: 1, 2, 3,",
                "max_tokens": 3000,
                "temperature": 0,
            },
            timeout=httpx.Timeout(5.0, read=1.0),
        )
    # the client gave up after a second; the server sees it within DISCONNECT_CHECK_SECONDS and
    # stops at the next cycle: before the 3000 tokens asked for, however fast the machine
    spent = tokens_since(server, client, generated)
    assert spent < 3000, spent
