"""Real clients, each used as its docs show it, against a running `specgen serve`: one function
per client and what it asks for, returning None when the client got it, else what went wrong.
The compatibility suite (tests/integration/test_clients.py) asserts them with fixed seeds;
benchmarks/clients.py counts them with the clients' own (random) sampling, before and after.

``seed``: given to the client through its own option for it (None: the client sends none).
Nothing here reaches the network but the server: ``LOOPBACK_ONLY`` is the environment that
routes any other request to a refused port.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

KEY = "sk-specgen-test"  # the key tests/integration/test_server.py serves with
# Any request a client makes to somewhere other than the loopback server fails at once.
LOOPBACK_ONLY = {
    "HTTP_PROXY": "http://127.0.0.1:9",
    "HTTPS_PROXY": "http://127.0.0.1:9",
    "ALL_PROXY": "http://127.0.0.1:9",
    "NO_PROXY": "127.0.0.1,localhost",
    "OPENAI_AGENTS_DISABLE_TRACING": "1",
    "OPENAI_API_KEY": KEY,
}


class Country(BaseModel):
    """What the structured-output clients fill (pydantic writes properties and required, and
    no additionalProperties)."""

    name: str
    population_millions: int


COUNTRIES = [
    "France",
    "Japan",
    "Brazil",
    "Kenya",
    "Canada",
    "India",
    "Peru",
    "Spain",
    "Egypt",
    "Chile",
]


def ask_country(country: str) -> str:
    return f"Describe {country}: its name and its population in millions."


WEATHER_TOOL = {  # as OpenAI's function-calling guide writes it
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get current temperature for a given location.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City and country e.g. Paris, France"}
            },
            "required": ["location"],
            "additionalProperties": False,
        },
    },
}
CITIES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Sydney", "Rome", "Berlin", "Madrid", "Dublin"]


def get_weather(location: str) -> str:
    """Get current temperature for a given location."""
    return f"It is 18 degrees and sunny in {location}."


def _seeded(seed: int | None) -> dict[str, Any]:
    return {} if seed is None else {"seed": seed}


def openai_json_schema(url: str, run: int, seed: int | None = None) -> str | None:
    """A pydantic model's own schema as `response_format: json_schema` (not strict)."""
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    schema = {"name": "Country", "schema": Country.model_json_schema()}
    reply = client.chat.completions.create(
        model="x",
        messages=[{"role": "user", "content": ask_country(COUNTRIES[run])}],
        response_format={"type": "json_schema", "json_schema": schema},
        **_seeded(seed),
    )
    choice = reply.choices[0]
    if choice.finish_reason != "stop":
        return f"finish_reason {choice.finish_reason}"
    Country.model_validate_json(choice.message.content or "")
    return None


def openai_tools_required(url: str, run: int, seed: int | None = None) -> str | None:
    """Tools as OpenAI's docs show them: `tool_choice: "required"`, `max_tokens: 80`."""
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    reply = client.chat.completions.create(
        model="x",
        messages=[{"role": "user", "content": f"What is the weather like in {CITIES[run]} today?"}],
        tools=[WEATHER_TOOL],
        tool_choice="required",
        max_tokens=80,
        **_seeded(seed),
    )
    calls = reply.choices[0].message.tool_calls or []
    if not calls:
        return f"no tool call (finish_reason {reply.choices[0].finish_reason})"
    json.loads(calls[0].function.arguments)
    return None


def openai_stream_tools(url: str, run: int, seed: int | None = None) -> str | None:
    """Streamed tool calls put together by the client's own `chat.completions.stream()`."""
    import openai

    class GetWeather(BaseModel):
        location: str

    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    with client.chat.completions.stream(
        model="x",
        messages=[{"role": "user", "content": f"What is the weather in {CITIES[run]}?"}],
        tools=[openai.pydantic_function_tool(GetWeather, name="get_weather")],
        tool_choice="required",
        **_seeded(seed),
    ) as stream:
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls or []
    if not calls or not isinstance(calls[0].function.parsed_arguments, GetWeather):
        return f"no parsed call (finish_reason {final.choices[0].finish_reason})"
    return None


def langchain_bind_tools(url: str, run: int, seed: int | None = None) -> str | None:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model="x", base_url=f"{url}/v1", api_key=KEY, max_retries=0, seed=seed)
    reply = llm.bind_tools([tool(get_weather)]).invoke(f"What is the weather in {CITIES[run]}?")
    if not reply.tool_calls:
        return "no tool call"
    return None


def langchain_structured(url: str, run: int, seed: int | None = None) -> str | None:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model="x", base_url=f"{url}/v1", api_key=KEY, max_retries=0, seed=seed)
    found = llm.with_structured_output(Country).invoke(ask_country(COUNTRIES[run]))
    return None if isinstance(found, Country) else f"got {type(found).__name__}"


def _pydantic_ai_model(url: str):
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    return OpenAIChatModel("x", provider=OpenAIProvider(base_url=f"{url}/v1", api_key=KEY))


def pydantic_ai_typed(url: str, run: int, seed: int | None = None) -> str | None:
    from pydantic_ai import Agent

    agent = Agent(_pydantic_ai_model(url), output_type=Country)
    found = agent.run_sync(ask_country(COUNTRIES[run]), model_settings=_seeded(seed)).output
    return None if isinstance(found, Country) else f"got {type(found).__name__}"


def pydantic_ai_native(url: str, run: int, seed: int | None = None) -> str | None:
    from pydantic_ai import Agent, NativeOutput

    agent = Agent(_pydantic_ai_model(url), output_type=NativeOutput(Country))
    found = agent.run_sync(ask_country(COUNTRIES[run]), model_settings=_seeded(seed)).output
    return None if isinstance(found, Country) else f"got {type(found).__name__}"


def agents_sdk_loop(url: str, run: int, seed: int | None = None) -> str | None:
    """An agent with one function tool, `tool_choice` auto, at most 6 turns."""
    import openai
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    agent = Agent(
        name="Assistant",
        instructions="You are a helpful assistant.",
        tools=[function_tool(get_weather)],
        model=OpenAIChatCompletionsModel(model="x", openai_client=client),
        model_settings=ModelSettings(extra_args=_seeded(seed) or None),
    )
    result = Runner.run_sync(agent, f"What is the weather in {CITIES[run]}?", max_turns=6)
    return None if result.final_output else "no final output"


def llm_cli(url: str, run: int, seed: int | None = None, schema: bool = False) -> str | None:
    """simonw's `llm`, a model added through `extra-openai-models.yaml`."""
    with tempfile.TemporaryDirectory() as home:
        Path(home, "extra-openai-models.yaml").write_text(
            f"- model_id: specgen\n  model_name: x\n  api_base: {url}/v1\n"
            f"  api_key_name: specgen\n  supports_schema: true\n  supports_tools: true\n"
        )
        Path(home, "keys.json").write_text(json.dumps({"specgen": KEY}))
        env = {**os.environ, **LOOPBACK_ONLY, "LLM_USER_PATH": home}
        args = [sys.executable, "-m", "llm", "-m", "specgen", "--no-log"]
        if seed is not None:
            args += ["-o", "seed", str(seed)]
        if schema:
            args += ["--schema", "name, population_millions int", ask_country(COUNTRIES[run])]
        else:
            args += ["-o", "max_tokens", "24", "Say hello in French."]
        done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        return done.stderr.strip().splitlines()[-1][:80] if done.stderr.strip() else "failed"
    if schema:
        found = json.loads(done.stdout)
        return None if {"name", "population_millions"} <= set(found) else "missing keys"
    return None if done.stdout.strip() else "no text"


Client = Callable[[str, int, int | None], str | None]
CLIENTS: dict[str, tuple[str, Client]] = {
    "openai-json-schema": ("openai: a pydantic schema in response_format", openai_json_schema),
    "openai-tools-required": ("openai: tool_choice required, max_tokens 80", openai_tools_required),
    "openai-stream-tools": ("openai: stream() helper, a pydantic tool", openai_stream_tools),
    "langchain-bind-tools": ("LangChain bind_tools", langchain_bind_tools),
    "langchain-structured": ("LangChain with_structured_output", langchain_structured),
    "pydantic-ai-typed": ("pydantic-ai output_type (a tool)", pydantic_ai_typed),
    "pydantic-ai-native": ("pydantic-ai NativeOutput", pydantic_ai_native),
    "agents-sdk-loop": ("Agents SDK: one tool, auto, 6 turns", agents_sdk_loop),
    "llm-cli": ("llm CLI: a prompt", llm_cli),
    "llm-cli-schema": ("llm CLI: --schema", lambda url, run, seed: llm_cli(url, run, seed, True)),
}
