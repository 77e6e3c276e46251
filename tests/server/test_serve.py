"""`specgen serve` over a socket, on fakes in a subprocess (``SPECGEN_BACKEND``) whose decodes
take real time: a full queue, clients that go away (streaming or not) and stop their
generations, SIGTERM ending the streams with a final event. What a request gets is tested in
this process (test_app.py); what only a real model shows, in tests/integration/test_server.py."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.conftest import FakePair
from tests.invoke import specgen_serve

openai = pytest.importorskip("openai")
KEY = "sk-specgen-test"


def start(fakes: FakePair, *extra: str) -> tuple[subprocess.Popen, str]:
    """The server on the fakes, each decode 2 ms of real time, with room for long answers."""
    return specgen_serve(*fakes.busy().args("--ctx-size", "8192"), *extra, fakes=True)


@pytest.fixture
def server(fake_pair: FakePair) -> Iterator[str]:
    proc, url = start(fake_pair, "--api-key", KEY, "--queue", "0", "--parallel", "1")
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


def test_sigterm_ends_a_stream_with_an_error_event_a_client_can_tell(
    fake_pair: FakePair,
) -> None:
    """A stream the shutdown cuts ends in an error event (as OpenAI streams report one), not a
    finish_reason of "stop": the openai client raises on it instead of returning half an
    answer as whole. The console has one access-log line per request."""
    import httpx2 as httpx

    proc, url = start(fake_pair)
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
    assert final["error"]["code"] == "server_shutdown" and "shut down" in final["error"]["message"]
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks)  # none says "stop"
    # uvicorn ends gracefully, then re-raises the signal, as a terminated process should
    assert proc.wait(timeout=60) in (0, -signal.SIGTERM)
    err = proc.communicate()[1]
    assert "Traceback" not in err
    (line,) = [x for x in err.splitlines() if x.startswith("POST /v1/completions")]
    assert " 200 " in line and "stop: cancelled" in line and "shut down" in line


def test_max_tokens_is_bounded_by_the_context_and_the_limit(fake_pair: FakePair) -> None:
    """A request's max_tokens is bounded by the context and --max-tokens-limit, on a server
    started without --parallel: it takes llama-server's 4 slots (a fake's file is no GGUF, so
    no memory check lowers them), and says so."""
    import httpx2 as httpx

    proc, url = specgen_serve(
        *fake_pair.args("--ctx-size", "512", "--max-tokens-limit", "6"), fakes=True
    )
    try:
        assert httpx.get(f"{url}/health").json()["slots"]["total"] == 4
        asked = {"prompt": "Count: 1, 2, 3,", "temperature": 0}
        done = httpx.post(f"{url}/v1/completions", json={**asked, "max_tokens": 40}, timeout=60)
        assert done.status_code == 200, done.text
        assert done.json()["usage"]["completion_tokens"] <= 6  # lowered to the limit
        assert done.json()["choices"][0]["finish_reason"] == "length"
        huge = httpx.post(f"{url}/v1/completions", json={**asked, "max_tokens": 100000}, timeout=60)
        assert huge.status_code == 400
        assert huge.json()["error"]["code"] == "context_length_exceeded"
        assert "512" in huge.json()["error"]["message"]
    finally:
        proc.send_signal(signal.SIGTERM)
        err = proc.communicate(timeout=60)[1]
    lines = [x for x in err.splitlines() if x.startswith("POST /v1/completions")]
    assert len(lines) == 2 and " 200 " in lines[0] and " 400 " in lines[1], err
    assert "--parallel 4: llama-server's slots" in err and "4 at once" in err, err
    assert "new tokens" in lines[0] and "tok/s" in lines[0] and "stop: max_tokens" in lines[0]


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
