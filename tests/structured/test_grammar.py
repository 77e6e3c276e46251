"""Structured output's bad input, on fakes: one line and exit 2, an error record, a 400. What a
grammar does to a real model's output is in tests/integration/test_structured.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.invoke import one_line_error, specgen_here

# -- bad input, on fakes (no model is loaded before the options are checked) --------------------


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--json-schema", '{"type": 5}'], "invalid JSON schema"),
        (["--json-schema", "{not json"], "not JSON"),
        (["--json-schema", "missing.json"], "file not found"),
        (["--format", "yaml"], "unknown format 'yaml'"),
        (["--format", "json", "--grammar", 'root ::= "a"'], "give one of"),
        (["--grammar", "root ::= (("], "invalid grammar"),
    ],
)
def test_a_bad_schema_or_grammar_is_one_line_and_exit_2(fake_pair, args, said) -> None:
    one_line_error(specgen_here("run", *fake_pair.args(*args), "hello"), said, code=2)


def test_the_server_refuses_what_it_would_otherwise_ignore(fake_pair) -> None:
    import asyncio

    import httpx2 as httpx

    from specgen.api import Specgen
    from specgen.server import create_app

    app = create_app(Specgen(target=fake_pair.target, draft=fake_pair.draft), max_queue=0)

    async def post(**extra) -> httpx.Response:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://specgen"
        ) as http:
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra}
            return await http.post("/v1/chat/completions", json=body)

    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    for field, value in [
        ("functions", tools),  # OpenAI's older form of tools
        ("tool_choice", "required"),  # with no tools to call
        ("mirostat", 2),
        ("best_of", 2),
    ]:
        reply = asyncio.run(post(**{field: value}))
        assert reply.status_code == 400, field
        error = reply.json()["error"]
        assert field in error["message"] and error["type"] == "invalid_request_error"
    bad = asyncio.run(post(response_format={"type": "json_schema", "json_schema": {"schema": 5}}))
    assert bad.status_code == 400 and "response_format" in bad.json()["error"]["message"]
    both = asyncio.run(post(tools=tools, response_format={"type": "json_object"}))
    assert both.status_code == 400 and "'tools' or 'response_format'" in both.text
    odd = asyncio.run(post(response_format={"type": "xml"}))
    assert odd.status_code == 400 and "'xml'" in odd.json()["error"]["message"]
    neutral = asyncio.run(post(logprobs=False, presence_penalty=0, user="me", tools=[]))
    assert neutral.status_code == 200
    assert asyncio.run(post(logit_bias={"5": 10})).status_code == 200
    out_of_range = asyncio.run(post(logit_bias={"5": 1000}))
    assert (
        out_of_range.status_code == 400 and "logit_bias" in out_of_range.json()["error"]["message"]
    )


def test_a_vocabulary_without_an_end_token_refuses_a_grammar_in_one_line(tmp_path: Path) -> None:
    """The tiny qwen35 models have no end-of-generation token: a grammar cannot end on them, and
    llguidance cannot build a tokenizer from their numbered pieces. Either way, one line."""
    from tests.tiny_models import write_qwen35

    target = write_qwen35(tmp_path / "tiny.gguf")
    done = specgen_here(
        "run", "--target", str(target), "--threads", "1", "-n", "4", "--format", "json", "x"
    )
    # FIXME: the live view prints the (empty) final stats above the error today (as for a prompt
    # too long, tests/cli/test_errors.py); then this is one line and progress goes.
    one_line_error(done, "structured output cannot run on it", progress=True)
    assert done.stdout == ""
