"""`specgen serve` for real: a uvicorn server on loopback with the SmolLM2 pair, driven by the
official `openai` client, for what only a real model shows: the loop's own host time, a real
tokenizer's chat turns. The app's behaviour request by request (answers equal to `specgen
run`'s, usage and metrics) is tested in this process on fake models (tests/server/test_app.py),
and the server over a socket (clients that go away, SIGTERM) on fakes in a subprocess
(tests/server/test_serve.py)."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.invoke import pair_flags, specgen_serve

openai = pytest.importorskip("openai")
KEY = "sk-specgen-test"


def start(target: Path, draft: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    return specgen_serve(*pair_flags(target, draft), *extra)


@pytest.fixture(scope="module")
def server(smollm2_target: Path, smollm2_draft: Path) -> Iterator[str]:
    proc, url = start(smollm2_target, smollm2_draft, "--api-key", KEY, "--queue", "0")
    yield url
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)


@pytest.fixture
def client(server: str):
    return openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0)


def test_the_loops_host_time_is_a_share_of_the_generation(client) -> None:
    """Only llama.cpp says how long its decodes took: the rest of a cycle is the loop's own."""
    raw = client.completions.with_raw_response.create(
        model="x", prompt="Once upon a time", temperature=0.7, seed=3, max_tokens=40
    )
    timings = json.loads(raw.text)["timings"]
    assert 0 < timings["host_ms"] < timings["predicted_ms"]


def test_a_second_chat_turn_reuses_the_first_through_a_real_tokenizer(client) -> None:
    """Turn one's prompt, rendered by SmolLM2's template and tokenized by its BPE, is reused
    when turn two's begins with it (up to the token at the seam, which may merge anew)."""
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


def test_a_requests_seed_gives_its_text_again_and_says_which_rule_ran(client) -> None:
    """The server runs -k auto, whose K follows the timings: a seed's text is the same anyway."""

    def ask(seed: int | None) -> tuple[str, object]:
        raw = client.completions.with_raw_response.create(
            model="x", prompt="Once upon a time", temperature=0.8, seed=seed, max_tokens=32
        )
        body = json.loads(raw.text)
        return body["choices"][0]["text"], body["timings"]["coupling"]

    first, rule = ask(11)
    assert first and rule == "gumbel"
    assert [ask(11) for _ in range(2)] == [(first, "gumbel")] * 2
    assert ask(None)[1] == "residual"
