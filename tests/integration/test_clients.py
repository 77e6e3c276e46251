"""Real clients against `specgen serve` on loopback, the SmolLM2 demo pair: each client as its
docs show it (its own defaults; a fixed seed given through its own option, so a run
reproduces), asking for what users ask of it: a pydantic model filled through a JSON schema,
tool calls (OpenAI's docs' `tool_choice: "required"` with `max_tokens: 80`, streamed ones put
together by the client), LangChain's `bind_tools` and `with_structured_output`, pydantic-ai's
typed output, an OpenAI Agents SDK loop with one tool, and simonw's `llm` CLI through its
OpenAI-compatible model config. Nothing reaches the network but the server (``LOOPBACK_ONLY``
sends any other request to a refused port). The clients are pinned in the `test` extra."""

from __future__ import annotations

import pytest

from tests.clients import CLIENTS, LOOPBACK_ONLY
from tests.integration.test_server import server  # noqa: F401 - the demo pair's server

pytestmark = pytest.mark.slow
SEEDS = (0, 1, 2)


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in LOOPBACK_ONLY.items():
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_each_client_gets_what_it_asked_for(server: str, client: str) -> None:  # noqa: F811
    what, run_one = CLIENTS[client]
    problems = {seed: run_one(server, seed, seed) for seed in SEEDS}
    assert problems == dict.fromkeys(SEEDS), f"{what}: {problems}"


def test_nothing_but_the_server_is_reached(server: str) -> None:  # noqa: F811
    """The guard itself: a client pointed elsewhere fails at once instead of going out."""
    import openai

    elsewhere = openai.OpenAI(base_url="https://api.openai.com/v1", max_retries=0, timeout=10)
    with pytest.raises(openai.APIConnectionError):
        elsewhere.models.list()
