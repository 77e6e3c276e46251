"""A tool call side by side: the target alone and specgen speculating, both under the call's
grammar, on the path `specgen serve` takes for `tools` with `tool_choice: "required"` (the plan
from the target's chat template, the grammar, the answer parsed back into a call). Greedy, so
both write the same call; round by round, alternating which goes first; medians.

    python benchmarks/tool_call_speed.py TARGET.gguf DRAFT.gguf [--rounds 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specgen.api import Settings, Specgen  # noqa: E402
from specgen.core.sampling import SamplingParams  # noqa: E402
from specgen.session.generate import Result  # noqa: E402
from specgen.structured.tools import ToolChoice, tools_from_request  # noqa: E402

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "book_flight",
            "description": "Book a flight for a passenger",
            "parameters": {
                "type": "object",
                "properties": {
                    "passenger": {"type": "string", "maxLength": 40},
                    "origin": {"type": "string", "maxLength": 30},
                    "destination": {"type": "string", "maxLength": 30},
                    "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
                    "seats": {"type": "integer"},
                },
                "required": ["passenger", "origin", "destination", "date", "seats"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 30}},
                "required": ["city"],
            },
        },
    },
]
ASK = [
    {
        "role": "user",
        "content": "Please book 2 seats for Ada Lovelace from London to Paris on 2026-12-24.",
    }
]


def one(sg: Specgen, lookahead: object) -> tuple[float, str]:
    plan = sg.tool_plan(tools_from_request(TOOLS), ToolChoice("required"), parallel=False)
    settings = Settings(
        lookahead=lookahead,  # type: ignore[arg-type]
        max_tokens=128,
        sampling=SamplingParams(temperature=0),
        grammar=plan.grammar(),
        keep_text=plan.keep_text(),
    )
    result = None
    for item in sg.stream_events(plan.messages(ASK), settings, tools=plan.template_tools()):
        if isinstance(item, Result):
            result = item
    assert result is not None
    content, calls = plan.parse(result.text)
    assert calls, f"no call in {result.text!r}"
    return result.stats.tokens_per_second or 0.0, f"{calls[0].name}({calls[0].arguments})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target")
    parser.add_argument("draft")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    sg = Specgen(target=args.target, draft=args.draft, threads=args.threads, n_ctx=2048)
    print(f"syntax: {sg.tool_plan(tools_from_request(TOOLS), ToolChoice('required')).syntax.name}")
    speeds: dict[object, list[float]] = {0: [], "auto": []}
    calls = set()
    one(sg, "auto")  # warm-up: the grammar's tokenizer, the costs -k auto learns
    for round_ in range(args.rounds):
        order = [0, "auto"] if round_ % 2 == 0 else ["auto", 0]
        for lookahead in order:
            tps, call = one(sg, lookahead)
            speeds[lookahead].append(tps)
            calls.add(call)
    alone = statistics.median(speeds[0])
    auto = statistics.median(speeds["auto"])
    print(f"calls written: {sorted(calls)}")
    print(f"target alone under the grammar: {alone:.1f} tok/s ({speeds[0]})")
    print(f"specgen -k auto under the grammar: {auto:.1f} tok/s ({speeds['auto']})")
    print(f"ratio: {auto / alone:.2f}x")


if __name__ == "__main__":
    main()
