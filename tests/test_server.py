"""`specgen serve` for real: a uvicorn server on loopback with the SmolLM2 pair, driven by the
official `openai` client and by plain HTTP (httpx2, the client the openai package itself uses)."""

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

pytestmark = pytest.mark.slow
openai = pytest.importorskip("openai")
KEY = "sk-specgen-test"


def start(target: Path, draft: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "specgen", "serve", "--target", str(target), "--draft",
         str(draft), "--threads", "2", "--port", str(port), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
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
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(name + " ") or line.startswith(name + "{"))


def tokens_since(server: str, client, generated: float) -> float:
    """Tokens generated since ``generated`` was read, once the model is free again (a small
    request gets through: until the cancelled generation has ended it meets a 503)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            client.completions.create(model="x", prompt="Hi", max_tokens=2)
            break
        except openai.InternalServerError:
            time.sleep(0.1)
    return metric(server, "specgen_generation_tokens_total") - generated - 2


def run_cli(*args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "specgen", "run", *args, "--json"],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_greedy_chat_and_completions_equal_specgen_run(client, smollm2_target: Path,
                                                       smollm2_draft: Path) -> None:
    models = ["--target", str(smollm2_target), "--draft", str(smollm2_draft), "--threads", "2",
              "--temperature", "0", "-n", "24"]
    chat = client.chat.completions.create(
        model="x", messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0, max_tokens=24)
    assert chat.choices[0].message.content == run_cli("What is the capital of France?",
                                                      *models)["text"]
    completion = client.completions.create(model="x", prompt="The capital of France is",
                                           temperature=0, max_tokens=24)
    assert completion.choices[0].text == run_cli("The capital of France is", *models,
                                                 "--raw")["text"]
    pieces = [c.choices[0].text for c in client.completions.create(
        model="x", prompt="The capital of France is", temperature=0, max_tokens=24,
        stream=True)]
    assert "".join(pieces) == completion.choices[0].text
    streamed = client.chat.completions.create(
        model="x", messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0, max_tokens=24, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == chat.choices[0].message.content


def test_timings_usage_and_metrics_agree(client, server: str) -> None:
    before = {name: metric(server, name) for name in (
        "specgen_spec_decode_num_draft_tokens_total",
        "specgen_spec_decode_num_accepted_tokens_total", "specgen_generation_tokens_total",
        "specgen_spec_decode_num_accepted_tokens_per_pos_total")}
    raw = client.completions.with_raw_response.create(
        model="x", prompt="Once upon a time", temperature=0.7, seed=3, max_tokens=40)
    body = json.loads(raw.text)
    timings, usage = body["timings"], body["usage"]
    assert timings["predicted_n"] == usage["completion_tokens"] > 0
    assert 0 <= timings["draft_n_accepted"] <= timings["draft_n"]
    assert timings["prompt_n"] + timings["cache_n"] == usage["prompt_tokens"]
    after = {name: metric(server, name) for name in before}
    assert after["specgen_generation_tokens_total"] - before[
        "specgen_generation_tokens_total"] == usage["completion_tokens"]
    assert after["specgen_spec_decode_num_draft_tokens_total"] - before[
        "specgen_spec_decode_num_draft_tokens_total"] == timings["draft_n"]
    accepted = after["specgen_spec_decode_num_accepted_tokens_total"] - before[
        "specgen_spec_decode_num_accepted_tokens_total"]
    assert accepted == timings["draft_n_accepted"]
    assert after["specgen_spec_decode_num_accepted_tokens_per_pos_total"] - before[
        "specgen_spec_decode_num_accepted_tokens_per_pos_total"] == accepted
    assert metric(server, "specgen_request_latency_seconds_count") > 0


def test_a_second_chat_turn_reuses_the_first(client) -> None:
    first = [{"role": "user", "content": "Name a colour."}]
    one = client.chat.completions.with_raw_response.create(model="x", messages=first,
                                                           temperature=0, max_tokens=16)
    answer = json.loads(one.text)
    reply = answer["choices"][0]["message"]["content"]
    turn_two = [*first, {"role": "assistant", "content": reply},
                {"role": "user", "content": "And another one?"}]
    two = json.loads(client.chat.completions.with_raw_response.create(
        model="x", messages=turn_two, temperature=0, max_tokens=16).text)
    cached = two["timings"]["cache_n"]
    assert cached >= answer["usage"]["prompt_tokens"]  # all of turn one's prompt, at least
    assert two["timings"]["prompt_n"] < two["usage"]["prompt_tokens"] - cached + 1
    assert two["usage"]["prompt_tokens_details"]["cached_tokens"] == cached


def test_bad_requests_get_openai_errors(server: str) -> None:
    import httpx2 as httpx

    auth = {"Authorization": f"Bearer {KEY}"}
    url = f"{server}/v1/chat/completions"
    cases = [
        (b"{not json", 400, "invalid_json"),
        (json.dumps({"messages": "hi"}).encode(), 422, "invalid_value"),
        (json.dumps({"messages": [{"role": "user", "content": "hi"}],
                     "temperature": "hot"}).encode(), 422, "invalid_value"),
        (json.dumps({"messages": [{"role": "user", "content": "hi"}],
                     "top_p": 2}).encode(), 422, "invalid_value"),
        (json.dumps({"messages": [{"role": "robot", "content": "hi"}]}).encode(), 422,
         "invalid_value"),
        (json.dumps({"messages": [{"role": "user", "content": "x" * (2 << 20)}]}).encode(),
         413, "request_too_large"),
        (json.dumps({"messages": [{"role": "user", "content": "word " * 5000}],
                     "max_tokens": 4}).encode(), 400, None),
    ]
    for body, status, code in cases:
        response = httpx.post(url, content=body, headers={**auth,
                                                          "Content-Type": "application/json"},
                              timeout=120)
        assert response.status_code == status, (body[:60], response.text)
        error = response.json()["error"]
        assert error["message"] and (code is None or error["code"] == code)
    too_long = httpx.post(url, json={"messages": [{"role": "user", "content": "word " * 5000}]},
                          headers=auth, timeout=120).json()["error"]["message"]
    assert "does not fit the context" in too_long
    unknown = httpx.post(url, json={"messages": [{"role": "user", "content": "hi"}],
                                    "max_tokens": 2, "frequency_penalty": 0, "user": "me"},
                         headers=auth, timeout=120)
    assert unknown.status_code == 200  # fields other clients send are ignored
    chunked = httpx.post(url, headers={**auth, "Content-Type": "application/json"},
                         content=(b"x" * 65536 for _ in range(40)), timeout=60)  # no length
    assert chunked.status_code == 413 and chunked.json()["error"]["code"] == "request_too_large"
    assert httpx.post(url, json={"messages": []}).status_code == 401
    assert httpx.post(url, json={}, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(f"{server}/health").status_code == 200  # no key needed off /v1
    models = httpx.get(f"{server}/v1/models", headers=auth).json()
    assert models["data"][0]["object"] == "model"


def test_queue_overflow_and_a_client_that_leaves(server: str, client) -> None:
    import httpx2 as httpx

    auth = {"Authorization": f"Bearer {KEY}"}
    generated = metric(server, "specgen_generation_tokens_total")
    with httpx.stream("POST", f"{server}/v1/completions", headers=auth, timeout=120,
                      json={"prompt": "Count to one thousand: 1, 2, 3,", "max_tokens": 400,
                            "temperature": 0, "stream": True}) as stream:
        lines = stream.iter_lines()
        assert next(lines).startswith("data: ")  # generating now
        busy = httpx.post(f"{server}/v1/completions", headers=auth, timeout=30,
                          json={"prompt": "Hi", "max_tokens": 2})
        assert busy.status_code == 503 and busy.headers["Retry-After"]
        assert busy.json()["error"]["code"] == "busy"
    # the client left after one chunk: its generation stops at the next cycle
    spent = tokens_since(server, client, generated)
    assert spent < 100, spent  # far from the 400 asked for


def test_sigterm_ends_streams_with_a_final_event(smollm2_target: Path,
                                                 smollm2_draft: Path) -> None:
    import httpx2 as httpx

    proc, url = start(smollm2_target, smollm2_draft)
    events = []
    with httpx.stream("POST", f"{url}/v1/completions", timeout=120,
                      json={"prompt": "Count to one thousand: 1, 2, 3,", "max_tokens": 1000,
                            "temperature": 0, "stream": True}) as stream:
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


def test_the_python_api_generates_as_run_does(smollm2_target: Path,
                                              smollm2_draft: Path) -> None:
    from specgen.api import Specgen
    from specgen.engine import TextChunk
    from specgen.session import Result

    sg = Specgen(target=smollm2_target, draft=smollm2_draft, threads=2)
    result = sg.generate("What is the capital of France?", temperature=0, max_tokens=16)
    assert isinstance(result, Result) and result.stats.n_generated > 0
    cli = run_cli("What is the capital of France?", "--target", str(smollm2_target), "--draft",
                  str(smollm2_draft), "--threads", "2", "--temperature", "0", "-n", "16")
    assert result.text == cli["text"]
    pieces = list(sg.stream([{"role": "user", "content": "What is the capital of France?"}],
                            temperature=0, max_tokens=16))
    assert "".join(pieces) == result.text and sg.last is not None
    events = list(sg.stream_events("Once upon a time", chat=False))
    assert isinstance(events[-1], Result) and all(isinstance(e, TextChunk)
                                                  for e in events[:-1])


def test_back_to_back_requests_never_find_the_model_busy(client) -> None:
    """With --queue 0, a request sent the moment the last answer arrived still gets the model:
    an answer is only sent once its generation has given the model back."""
    for i in range(12):
        answer = client.completions.create(model="x", prompt=f"Number {i}:", max_tokens=2,
                                           temperature=0)
        assert answer.choices[0].finish_reason in ("length", "stop")


def test_serve_takes_the_k_bench_found(smollm2_target: Path, smollm2_draft: Path) -> None:
    from specgen.api import Specgen
    from specgen.choice import choose
    from specgen.memo import memo_path
    from specgen.registry import Registry

    choice = choose(Registry.load(), None, str(smollm2_target), str(smollm2_draft))
    memo = memo_path(choice, 2, -1)
    memo.parent.mkdir(parents=True, exist_ok=True)
    memo.write_text(json.dumps({"sampled": {"variant": 3, "speedup": 1.3, "temperature": 0.8,
                                            "date": "2026-11-29"}}))
    sg = Specgen(target=smollm2_target, draft=smollm2_draft, threads=2, from_bench=True)
    assert sg.lookahead == 3 and "specgen bench" in sg.note
    assert Specgen(target=smollm2_target, draft=smollm2_draft, threads=2).lookahead == "auto"


def test_a_non_streaming_client_that_leaves_cancels_too(server: str, client) -> None:
    import httpx2 as httpx

    generated = metric(server, "specgen_generation_tokens_total")
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{server}/v1/completions", headers={"Authorization": f"Bearer {KEY}"},
                   json={"prompt": "Count to one thousand: 1, 2, 3,", "max_tokens": 600,
                         "temperature": 0}, timeout=httpx.Timeout(5.0, read=1.0))
    spent = tokens_since(server, client, generated)
    assert spent < 150, spent  # about a second of generation, not the 600 asked for
