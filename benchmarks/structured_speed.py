"""Constrained generation side by side: the target alone under a JSON schema, specgen speculating
under it, and llama-cpp-python's own grammar path (``Llama.create_completion(grammar=...)``,
the target alone), on a JSON extraction prompt (the answer fills a schema from a passage in the
prompt). Greedy, so all write the same kind of text; round by round, medians.

    python benchmarks/structured_speed.py TARGET.gguf DRAFT.gguf [--rounds 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specgen.core.sampling import SamplingParams  # noqa: E402
from specgen.engine import Finished, GenerationConfig  # noqa: E402
from specgen.session.pair import PairOptions, load_pair  # noqa: E402
from specgen.structured import grammar  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 80},
        "author": {"type": "string", "maxLength": 60},
        "year": {"type": "integer"},
        "pages": {"type": "integer"},
        "publisher": {"type": "string", "maxLength": 60},
    },
    "required": ["title", "author", "year", "pages", "publisher"],
    "additionalProperties": False,
}
PROMPT = (
    "Passage: The novel Middlemarch, by George Eliot, was published in 1871 by William "
    "Blackwood and Sons; the first edition ran to 880 pages.\n"
    'Fill this JSON with the passage\'s facts: {"title": ..., "author": ..., "year": ..., '
    '"pages": ..., "publisher": ...}\nJSON: '
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target")
    parser.add_argument("draft")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("-n", "--max-tokens", type=int, default=96)
    args = parser.parse_args()
    from llama_cpp import Llama, LlamaGrammar

    pair = load_pair(
        args.target, args.draft, PairOptions.for_both(threads=args.threads), ngram=True
    )
    oracle = Llama(args.target, n_ctx=1024, n_threads=args.threads, verbose=False)
    rule = grammar.json_schema(SCHEMA)
    gbnf = LlamaGrammar.from_json_schema(json.dumps(SCHEMA), verbose=False)
    tokens = pair.target.tokenize(PROMPT)
    greedy = SamplingParams(temperature=0)

    def specgen_run(lookahead: object) -> tuple[float, str]:
        engine = pair.engine()
        config = GenerationConfig(lookahead, greedy, args.max_tokens, grammar=rule)  # type: ignore[arg-type]
        out: list[int] = []
        for event in engine.generate(tokens, config):
            if hasattr(event, "tokens"):
                out.extend(event.tokens)  # type: ignore[attr-defined]
            if isinstance(event, Finished):
                text = b"".join(pair.target.piece(t) for t in out[: event.stats.n_generated])
                return event.stats.n_generated / event.stats.elapsed(), text.decode()
        raise AssertionError

    def oracle_run() -> tuple[float, str]:
        started = time.perf_counter()
        reply = oracle.create_completion(
            PROMPT, grammar=gbnf, temperature=0, max_tokens=args.max_tokens
        )
        seconds = time.perf_counter() - started
        return reply["usage"]["completion_tokens"] / seconds, reply["choices"][0]["text"]

    ways = {"specgen -k 0": lambda: specgen_run(0), "specgen -k auto": lambda: specgen_run("auto"),
            "llama-cpp-python grammar": oracle_run}  # fmt: skip
    rates: dict[str, list[float]] = {name: [] for name in ways}
    texts: dict[str, str] = {}
    for _ in range(args.rounds + 1):
        for name, run in ways.items():
            rate, texts[name] = run()
            rates[name].append(rate)
    base = statistics.median(rates["specgen -k 0"][1:])
    for name, found in rates.items():
        rate = statistics.median(found[1:])  # the first round warms up
        print(f"{name:<28} {rate:7.1f} tok/s  {rate / base:5.2f}x  {texts[name][:60]!r}")


if __name__ == "__main__":
    main()
