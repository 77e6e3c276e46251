"""Tool calls for real: `specgen serve` on loopback with SmolLM2, driven by the official `openai`
client. SmolLM2's own template has no tools (the generic JSON form, under a grammar); a copy of it
with a Hermes/Qwen-style template (written with gguf's own `gguf-new-metadata`) calls tools in
`<tool_call>` blocks. A call, a `role: tool` answer and the final text; streamed deltas that add
up to the whole answer; `required`, a named function and `parallel_tool_calls`."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest

from tests.integration.test_server import KEY, start
from tests.structured.test_tools import HERMES_TEMPLATE

pytestmark = pytest.mark.slow
openai = pytest.importorskip("openai")

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 12}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


def serve(target: Path, draft: Path) -> Iterator[object]:
    # One slot (the queue of one generation at a time), where the other server tests take
    # the default slots.
    proc, url = start(target, draft, "--api-key", KEY, "--queue", "0", "--parallel", "1")
    yield openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)


@pytest.fixture(scope="module")
def generic(smollm2_target: Path, smollm2_draft: Path) -> Iterator[object]:
    yield from serve(smollm2_target, smollm2_draft)


@pytest.fixture(scope="module")
def hermes(smollm2_draft: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """The SmolLM2 pair with the Hermes template on its target (the draft's file, re-written)."""
    target = tmp_path_factory.mktemp("hermes") / "smollm2-hermes.gguf"
    tool = shutil.which("gguf-new-metadata") or str(
        Path(sys.executable).parent / "gguf-new-metadata"
    )
    subprocess.run(
        [tool, "--chat-template", HERMES_TEMPLATE, str(smollm2_draft), str(target)],
        check=True,
        capture_output=True,
        input="y\n",
        text=True,
    )
    yield from serve(target, smollm2_draft)


def checked_calls(message, tools=(WEATHER, TIME)) -> list[tuple[str, dict]]:
    """The message's calls as (name, arguments), each valid under its tool's schema."""
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    out = []
    for call in message.tool_calls or []:
        assert call.type == "function" and call.id.startswith("call_")
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, schemas[call.function.name])
        out.append((call.function.name, arguments))
    return out


def streamed(client, **request) -> tuple[str, list[dict], str]:
    """The content, the calls and the finish reason, put together from the stream's deltas."""
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **request):
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for part in choice.delta.tool_calls or []:
            entry = calls.setdefault(part.index, {"name": None, "arguments": "", "parts": 0})
            if part.id is not None:
                assert entry["name"] is None, "a call's id and name come once, first"
                entry["id"], entry["name"] = part.id, part.function.name
            entry["arguments"] += part.function.arguments or ""
            entry["parts"] += 1
        finish = choice.finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("server", ["generic", "hermes"])
def test_a_tool_round_trip_a_call_its_result_and_the_final_text(request, server) -> None:
    client = request.getfixturevalue(server)
    ask = dict(model="x", messages=ASK, tools=[WEATHER, TIME], temperature=0, max_tokens=80)
    # one call: this small model, let call again, calls again until max_tokens
    first = client.chat.completions.create(tool_choice="required", parallel_tool_calls=False, **ask)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = checked_calls(choice.message)
    assert calls and choice.message.content is None
    call = choice.message.tool_calls[0]
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"},
    ]
    final = client.chat.completions.create(
        model="x", messages=history, tools=[WEATHER, TIME], tool_choice="none", max_tokens=24
    )
    answer = final.choices[0]
    assert answer.message.tool_calls is None and answer.message.content
    assert answer.finish_reason in ("stop", "length")
    # the call and its result were in the prompt
    plain = client.chat.completions.create(model="x", messages=ASK, max_tokens=1)
    assert final.usage.prompt_tokens > plain.usage.prompt_tokens + 10


@pytest.mark.parametrize("server", ["generic", "hermes"])
def test_streamed_tool_call_deltas_add_up_to_the_whole_answer(request, server) -> None:
    client = request.getfixturevalue(server)
    ask = dict(
        model="x",
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=80,
    )
    whole = client.chat.completions.create(**ask).choices[0]
    content, calls, finish = streamed(client, **ask)
    assert finish == "tool_calls" and content == ""
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == checked_calls(whole.message)
    if server == "hermes":  # JSON arguments stream in fragments as they are written
        assert calls[0]["parts"] > 2


def test_a_named_function_and_one_call_only(hermes) -> None:
    ask = dict(model="x", messages=ASK, tools=[WEATHER, TIME], temperature=0.8, max_tokens=80)
    for seed in range(3):
        named = hermes.chat.completions.create(
            tool_choice={"type": "function", "function": {"name": "get_time"}}, seed=seed, **ask
        )
        assert [name for name, _ in checked_calls(named.choices[0].message)][:1] == ["get_time"]
        one = hermes.chat.completions.create(
            tool_choice="required", parallel_tool_calls=False, seed=seed, **ask
        )
        assert len(checked_calls(one.choices[0].message)) == 1


def test_auto_answers_with_text_or_calls_never_a_500(generic, hermes) -> None:
    for client in (generic, hermes):
        for seed in range(3):
            reply = client.chat.completions.create(
                model="x",
                messages=ASK,
                tools=[WEATHER, TIME],
                temperature=1.0,
                seed=seed,
                max_tokens=60,
            ).choices[0]
            calls = checked_calls(reply.message) if reply.finish_reason == "tool_calls" else []
            assert calls or reply.message.content is not None
