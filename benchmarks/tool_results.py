"""How a tool's result is put before a model whose chat template takes no tools decides whether
the next answer uses it or calls the tool again. One agent turn after a call and its result, as
the OpenAI Agents SDK sends it, rendered several ways; each is sampled N times (the server's
default temperature, seeds 0..N-1) under the generic answer's grammar, and counted: answered
(``{"response": ...}``), called the same tool with the same arguments again, or called it anew.

    specgen serve --port 8101 &
    python benchmarks/tool_results.py --url http://127.0.0.1:8101 --model TARGET.gguf -n 30
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

import httpx2 as httpx

from specgen.session.chat import render_chat
from specgen.structured.tools import Generic, Tool, ToolChoice, ToolPlan

TOOL = Tool(
    "get_weather",
    "Get current temperature for a given location.",
    {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]},
)
CALL = {"location": "Paris"}
RESULT = "It is 18 degrees and sunny in Paris."
HISTORY: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps(CALL)},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": RESULT},
]


def variants(plan: ToolPlan) -> dict[str, list[dict[str, Any]]]:
    """The conversation as each rendering puts it (the system message describes the tools)."""
    ours = plan.messages(HISTORY)
    system, user, call = ours[0], ours[1], ours[2]
    return {
        # what specgen renders: the result as the user's turn, named by its function
        "specgen": ours,
        # what llama-server's template renders for ChatML without tools: the call is not in
        # the assistant's turn, the result is a turn of role "tool"
        "llama-server": [
            system,
            user,
            {"role": "assistant", "content": ""},
            {"role": "tool", "content": RESULT},
        ],
        # the call kept, the result in a turn of role "tool"
        "tool-role": [system, user, call, {"role": "tool", "content": RESULT}],
        # the result as the user's turn, with the call it answers
        "with-call": [
            system,
            user,
            call,
            {
                "role": "user",
                "content": f"get_weather({json.dumps(CALL)}) returned: {RESULT}",
            },
        ],
        # minja's polyfill (llama-server's rendering before its autoparser): a JSON object
        "polyfill": [
            system,
            user,
            call,
            {
                "role": "user",
                "content": json.dumps(
                    {
                        "tool_response": {
                            "tool": "get_weather",
                            "content": RESULT,
                            "tool_call_id": "call_1",
                        }
                    }
                ),
            },
        ],
        # the result, then what to do with it
        "hint": [
            system,
            user,
            call,
            {
                "role": "user",
                "content": f"The result of get_weather: {RESULT}\nAnswer my question with it.",
            },
        ],
        # after the model called again: two calls and two results
        "specgen-twice": [*ours, ours[2], ours[3]],
        "hint-twice": [
            system,
            user,
            call,
            {
                "role": "user",
                "content": f"The result of get_weather: {RESULT}\nAnswer my question with it.",
            },
        ]
        * 1
        + [
            call,
            {
                "role": "user",
                "content": f"The result of get_weather: {RESULT}\nAnswer my question with it.",
            },
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", type=Path, required=True, help="the target's GGUF (template)")
    parser.add_argument("-n", type=int, default=30)
    parser.add_argument("--only", nargs="*")
    args = parser.parse_args()
    from gguf import GGUFReader

    field = GGUFReader(args.model).fields["tokenizer.chat_template"]
    template = bytes(field.parts[field.data[0]]).decode()
    plan = ToolPlan(Generic(), (TOOL,), ToolChoice("auto"))
    grammar = plan.grammar()
    assert grammar is not None
    schema = json.loads(grammar.text.split("%json ", 1)[1])
    for name, messages in variants(plan).items():
        if args.only and name not in args.only:
            continue
        prompt = render_chat(template, messages)
        said: Counter[str] = Counter()
        for seed in range(args.n):
            reply = httpx.post(
                f"{args.url}/v1/completions",
                json={"prompt": prompt, "json_schema": schema, "seed": seed, "max_tokens": 80},
                headers={"Authorization": "Bearer sk-local"},
                timeout=300,
            ).json()
            text = reply["choices"][0]["text"]
            try:
                answer = json.loads(text)
            except json.JSONDecodeError:
                said["cut"] += 1
                continue
            if "response" in answer:
                said["answered"] += 1
            elif any(c.get("arguments") == CALL for c in answer["tool_calls"]):
                said["called again, same"] += 1
            else:
                said["called anew"] += 1
        print(f"{name:14} {dict(said)}", flush=True)


if __name__ == "__main__":
    main()
