"""Log-probabilities of the generated tokens, from the target's own rows (the verify pass has
them): the same with or without speculation, equal to the target's softmax, through the engine,
`run --json`, batches and the server (the official openai client, streamed and not)."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from specgen.core.sampling import SamplingParams
from specgen.drafters import HybridDrafter, ModelDrafter
from specgen.engine import CycleDone, GenerationConfig, SpeculativeEngine
from specgen.structured.grammar import LogitBias
from tests.fakes import FakeModel
from tests.invoke import specgen_here

GREEDY = SamplingParams(temperature=0)
PROMPT = [1, 2, 3]


def generate(engine: SpeculativeEngine, config: GenerationConfig) -> tuple[list[int], list]:
    tokens, found = [], []
    for event in engine.generate(PROMPT, config):
        if isinstance(event, CycleDone):
            tokens.extend(event.tokens)
            found.extend(event.logprobs)
    return tokens, found


def log_softmax(row: np.ndarray) -> np.ndarray:
    row = row.astype(np.float64)
    return row - (row.max() + np.log(np.exp(row - row.max()).sum()))


@pytest.mark.parametrize("bias", [None, LogitBias.from_mapping({4: 2.0, 9: -100})])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_logprobs_are_the_targets_softmax_with_or_without_speculation(bias, temperature) -> None:
    sampling = SamplingParams(temperature=temperature)
    ref = FakeModel()
    config = GenerationConfig(0, sampling, 24, seed=7, logit_bias=bias, logprobs=3)
    alone, alone_lp = generate(SpeculativeEngine(FakeModel()), config)
    ways = [
        (ModelDrafter(FakeModel(noise=0.5, salt=3)), 4),
        (HybridDrafter(ModelDrafter(FakeModel(noise=0.5, salt=3))), "auto"),
    ]
    for drafter, k in ways:
        cfg = GenerationConfig(k, sampling, 24, seed=7, logit_bias=bias, logprobs=3)
        tokens, found = generate(SpeculativeEngine(FakeModel(), drafter), cfg)
        assert len(found) == len(tokens)
        for i, (token, entry) in enumerate(zip(tokens, found)):
            row = ref.logits_after([*PROMPT, *tokens[:i]])
            expected = log_softmax(row if bias is None else bias.apply(row))
            assert entry.token == token
            assert entry.logprob == pytest.approx(expected[token], abs=1e-9)
            assert [t for t, _, _ in entry.top] == list(np.argsort(-expected, kind="stable")[:3])
        if temperature == 0:
            assert tokens == alone and [f.logprob for f in found] == pytest.approx(
                [f.logprob for f in alone_lp]
            )


def test_run_json_and_batches_carry_logprobs(fake_pair, tmp_path) -> None:
    done = specgen_here(
        "run", *fake_pair.args("--temperature", "0", "-n", "10", "--json", "--logprobs", "2"), "hi"
    )
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    found = record["logprobs"]
    assert len(found) == record["stats"]["generated_tokens"] == 10
    assert "".join(f["token"] for f in found) == record["text"]
    assert all(len(f["top"]) == 2 and f["logprob"] <= 0 for f in found)
    lines = tmp_path / "b.jsonl"
    lines.write_text('{"prompt": "hi", "logprobs": 1}\n{"prompt": "hi"}\n')
    batch = specgen_here("run", *fake_pair.args("-f", str(lines), "-n", "4", "--temperature", "0"))
    first, second = (json.loads(line) for line in batch.stdout.splitlines())
    assert len(first["logprobs"]) == 4 and "logprobs" not in second


def test_the_server_returns_openai_logprobs(fake_pair) -> None:
    import httpx2 as httpx

    openai = pytest.importorskip("openai")
    from specgen.api import Specgen
    from specgen.server import create_app

    app = create_app(Specgen(target=fake_pair.target, draft=fake_pair.draft), max_queue=0)
    messages = [{"role": "user", "content": "hi"}]

    async def work():
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://specgen"
        ) as http:
            client = openai.AsyncOpenAI(base_url="http://specgen/v1", api_key="x", http_client=http)
            chat = await client.chat.completions.create(
                model="x", messages=messages, temperature=0, max_tokens=8, logprobs=True,
                top_logprobs=2,
            )  # fmt: skip
            streamed = [
                c async for c in await client.chat.completions.create(
                    model="x", messages=messages, temperature=0, max_tokens=8, logprobs=True,
                    stream=True,
                )
            ]  # fmt: skip
            completion = await client.completions.create(
                model="x", prompt="hi", temperature=0, max_tokens=8, logprobs=2
            )
            refused = await http.post(
                "/v1/chat/completions", json={"messages": messages, "top_logprobs": 2}
            )
            return chat, streamed, completion, refused

    chat, streamed, completion, refused = asyncio.run(work())
    content = chat.choices[0].logprobs.content
    assert (
        len(content) == 8 and "".join(c.token for c in content) == chat.choices[0].message.content
    )
    assert all(len(c.top_logprobs) == 2 and c.logprob <= 0 for c in content)
    from_stream = [c for chunk in streamed if chunk.choices and chunk.choices[0].logprobs
                   for c in chunk.choices[0].logprobs.content]  # fmt: skip
    assert [c.logprob for c in from_stream] == pytest.approx([c.logprob for c in content])
    lp = completion.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == 8
    assert all(len(top) <= 2 for top in lp.top_logprobs)
    assert refused.status_code == 400 and "top_logprobs" in refused.json()["error"]["message"]
