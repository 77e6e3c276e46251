"""Structured output under speculation, on the SmolLM2 demo pair: JSON that validates, greedy
identity with the constrained target alone and with llama-cpp-python's own grammar path, the
masked distribution (chi-square), forced tokens as free guesses, and batches, the command line,
the server and bench keeping to a schema. Bad input, on fakes: tests/structured/."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from specgen.backend import LlamaModel
from specgen.core.constraint import masked
from specgen.core.sampling import SamplingParams, warp
from specgen.drafters import HybridDrafter, ModelDrafter, NgramDrafter
from specgen.engine import GenerationConfig, SpeculativeEngine
from specgen.session.generate import prompt_tokens
from specgen.structured import grammar
from tests.fakes import run_to_end
from tests.invoke import specgen_here
from tests.stats_helpers import pooled_chisquare_pvalue

GREEDY = SamplingParams(temperature=0)


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer"},
        "city": {"type": "string", "maxLength": 40},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


PASSAGES = [
    "Ada Lovelace, 36 years old, lives in London.",
    "Alan Turing is 41 and lives in Wilmslow.",
    "Grace Hopper, aged 85, lives in Arlington.",
]


def drafters(draft: LlamaModel) -> dict[str, tuple[object, object]]:
    return {
        "model": (ModelDrafter(draft), 4),
        "ngram": (NgramDrafter(), 4),
        "hybrid": (HybridDrafter(ModelDrafter(draft)), 4),
        "auto": (HybridDrafter(ModelDrafter(draft)), "auto"),
    }


def text_of(model: LlamaModel, tokens: list[int]) -> str:
    return b"".join(model.piece(t) for t in tokens).decode("utf-8", "replace")


def test_json_validates_and_greedy_is_the_constrained_target_alone(smol) -> None:
    target, draft = smol
    schema = grammar.json_schema(PERSON)
    finished = 0
    for passage in PASSAGES:
        prompt = prompt_tokens(target, f"Extract as JSON: {passage}", True)
        for temperature in (0.0, 0.8):
            sampling = SamplingParams(temperature=temperature)
            config = GenerationConfig(0, sampling, 96, seed=1, grammar=schema)
            alone, _ = run_to_end(SpeculativeEngine(target), config, prompt)
            for name, (drafter, k) in drafters(draft).items():
                for seed in (1,):
                    config = GenerationConfig(k, sampling, 96, seed=seed, grammar=schema)
                    engine = SpeculativeEngine(target, drafter)
                    tokens, stats = run_to_end(engine, config, prompt)
                    if temperature == 0:
                        assert tokens == alone, (passage, name)
                    if stats.stop_reason == "eog":
                        finished += 1
                        jsonschema.validate(json.loads(text_of(target, tokens)), PERSON)
    assert finished >= 20  # of 24: the schema bounds the strings, so most end well in 96


def test_greedy_matches_llama_cpp_pythons_own_grammar_path(smol, smollm2_target: Path) -> None:
    """An independent oracle: llama-cpp-python's high-level Llama with a LlamaGrammar on the
    target alone, temperature 0, against specgen speculating under the same GBNF."""
    from llama_cpp import Llama, LlamaGrammar

    target, draft = smol
    oracle = Llama(str(smollm2_target), n_ctx=512, n_threads=2, verbose=False)
    grammars = [
        'root ::= ("yes" | "no") "." ',
        'root ::= "- " [a-z]+ ("\\n- " [a-z]+){2,4}',
    ]
    prompts = ["Is the sea salty? Answer: ", "Three animals, one per line:\n"]
    for text, prompt in zip(grammars, prompts):
        expected = oracle.create_completion(
            prompt, grammar=LlamaGrammar.from_string(text, verbose=False), temperature=0,
            max_tokens=24,
        )["choices"][0]["text"]  # fmt: skip
        tokens = target.tokenize(prompt)
        config = GenerationConfig(4, GREEDY, 24, grammar=grammar.gbnf(text, files=False))
        engine = SpeculativeEngine(target, HybridDrafter(ModelDrafter(draft)))
        got, _ = run_to_end(engine, config, tokens)
        assert text_of(target, got) == expected


def test_sampled_output_follows_the_masked_target(smol) -> None:
    """Chi-square over fixed seeds on (x1, x2): x1 from the prompt's pass, x2 drafted by the
    draft model from its masked q; their law must be p'(x1) p'(x2 | x1), p' the target's
    distribution masked by the grammar then warped."""
    target, draft = smol
    sampling = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0)
    # No separator: one the grammar forces would be the second token, a free guess, where
    # this test wants the draft model's.
    rule = grammar.gbnf(
        'root ::= ("red" | "green" | "blue" | "pink") ("cat" | "dog" | "cow" | "owl")',
        files=False,
    )
    prompt = target.tokenize("My favourite colour and animal: ")
    target.reset()
    matcher = target.constrain(rule)
    p1 = warp(masked(target.decode(prompt, 1)[0].copy(), matcher.allowed()), sampling, True)
    joint = {}
    for a in p1.ids.tolist():
        target.reset()
        matcher.consume(a)
        row = masked(target.decode([*prompt, a], 1)[0].copy(), matcher.allowed())
        p2 = warp(row, sampling, True)
        matcher.rollback(1)
        for b, pb in zip(p2.ids.tolist(), p2.probs):
            joint[(a, b)] = p1.prob(a) * pb
    engine = SpeculativeEngine(target, ModelDrafter(draft))
    n, counts, drafted = 350, {}, 0
    for seed in range(n):
        config = GenerationConfig(2, sampling, 3, seed=seed, grammar=rule)
        tokens, stats = run_to_end(engine, config, prompt)
        key = (tokens[0], tokens[1])
        assert key in joint, "a pair the grammar and p' do not allow"
        counts[key] = counts.get(key, 0) + 1
        drafted += "model" in stats.by_source
    keys = sorted(joint)
    observed = np.array([counts.get(k, 0) for k in keys], dtype=float)
    expected = np.array([joint[k] for k in keys]) * n
    assert drafted > n / 2
    assert pooled_chisquare_pvalue(observed, expected) > 1e-3


def test_forced_tokens_are_free_guesses_never_rejected(smol) -> None:
    target, draft = smol
    schema = grammar.json_schema(PERSON)
    prompt = prompt_tokens(target, f"Extract as JSON: {PASSAGES[0]}", True)
    for temperature in (0.0, 0.8):
        config = GenerationConfig(
            4, SamplingParams(temperature=temperature), 96, seed=3, grammar=schema
        )
        _, stats = run_to_end(SpeculativeEngine(target, NgramDrafter()), config, prompt)
        forced = stats.by_source["grammar"]
        assert forced.drafted > 0 and forced.accepted == forced.drafted


def test_batches_the_cli_and_the_server_keep_to_the_schema(
    smollm2_target: Path, smollm2_draft: Path, tmp_path: Path
) -> None:
    import asyncio

    import httpx2 as httpx

    from specgen.api import Specgen
    from specgen.server import create_app

    schema = json.dumps(PERSON)
    models = ["--target", str(smollm2_target), "--draft", str(smollm2_draft), "--threads", "2"]
    done = specgen_here(
        "run", *models, "--json-schema", schema, "-n", "96", "--temperature", "0",
        f"Extract as JSON: {PASSAGES[1]}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    jsonschema.validate(json.loads(done.stdout), PERSON)
    lines = tmp_path / "batch.jsonl"
    lines.write_text(
        json.dumps({"prompt": f"Extract as JSON: {PASSAGES[2]}", "json_schema": PERSON}) + "\n"
        + json.dumps({"prompt": "x", "json_schema": {"type": 5}}) + "\n"
    )  # fmt: skip
    batch = specgen_here("run", *models, "-f", str(lines), "-n", "96", "--temperature", "0")
    records = [json.loads(line) for line in batch.stdout.splitlines()]
    jsonschema.validate(json.loads(records[0]["text"]), PERSON)
    assert "invalid JSON schema" in records[1]["error"]

    app = create_app(Specgen(target=smollm2_target, draft=smollm2_draft, threads=2), max_queue=0)
    openai = pytest.importorskip("openai")

    async def ask() -> str:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://specgen"
        ) as http:
            client = openai.AsyncOpenAI(base_url="http://specgen/v1", api_key="x", http_client=http)
            reply = await client.chat.completions.create(
                model="x",
                messages=[{"role": "user", "content": f"Extract as JSON: {PASSAGES[0]}"}],
                temperature=0,
                max_tokens=96,
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "person", "schema": PERSON, "strict": True},
                },
            )
            return reply.choices[0].message.content or ""

    jsonschema.validate(json.loads(asyncio.run(ask())), PERSON)


def test_bench_runs_a_constrained_prompt_under_its_grammar_in_every_row(
    smollm2_target: Path, smollm2_draft: Path, tmp_path: Path
) -> None:
    from specgen.bench.prompts import BUILTIN, EXTRACTION_SCHEMA, builtin_grammars

    # the built-in set has one extraction prompt, with its schema
    kinds = [kind for kind, _ in BUILTIN]
    assert [g is not None for g in builtin_grammars()] == [k == "json" for k in kinds]
    extraction = BUILTIN[kinds.index("json")][1]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        json.dumps({"prompt": extraction, "json_schema": EXTRACTION_SCHEMA}) + "\n"
        + json.dumps({"prompt": extraction}) + "\n"
    )  # fmt: skip
    out = tmp_path / "bench.json"
    done = specgen_here(
        "bench", "--target", str(smollm2_target), "--draft", str(smollm2_draft),
        "--threads", "2", "-k", "3", "-n", "24", "--repeats", "1", "--temperature", "0",
        "--prompts", str(prompts), "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["meta"]["params"]["constrained_prompts"] == 1
    (row,) = report["per_k"]
    # the grammar forced some guesses (free ones, counted apart from the draft model's)
    assert row["forced_share"] and 0 < row["forced_share"] < 1
    assert 0 < row["host_share"] < 1  # the loop's own time, measured in bench too
    assert len(report["per_prompt"]) == 2
