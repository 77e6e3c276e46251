"""The generic form, for a chat template that takes no tools: the tools are described in a
system message and the answer is one JSON object under a grammar, as llama-server's generic
format. While it streams, only a ``{"response": "..."}`` answer's text is passed on, each
character of it read once (``Generic.scan``)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from specgen.structured.tools.json_calls import calls_array, json_rule, listed_calls
from specgen.structured.tools.request import Tool, ToolChoice
from specgen.structured.tools.syntax import Call, Parsed, Scan, Syntax, chosen


class Generic(Syntax):
    """A template without tools: the tools are described in a system message and the answer is
    one JSON object under a grammar, ``{"tool_calls": [{"name": ..., "arguments": {...}}]}`` or
    (with ``auto``) ``{"response": "..."}``, as llama-server's generic format."""

    name = "generic"
    native = False

    def instructions(self, tools: Sequence[Tool], choice: ToolChoice) -> str:
        listed = json.dumps([t.as_openai()["function"] for t in tools], ensure_ascii=False)
        answer = (
            'Answer with one JSON object: {"tool_calls": [{"name": <a tool\'s name>, '
            '"arguments": {<its arguments>}}]} to call tools'
        )
        if choice.mode == "auto":
            answer += ', or {"response": <your answer>} to answer directly'
        return f"You can call these tools:\n{listed}\n{answer}."

    def answer_instructions(self, tools: Sequence[Tool]) -> str:
        """What the model is told when it must answer from the results it has (its last calls
        repeated earlier ones and got the same results)."""
        names = ", ".join(t.name for t in tools)
        return (
            f"The results of your calls to {names} are above; calling again returns the same. "
            'Answer now with one JSON object: {"response": <your answer>}.'
        )

    def answer_grammar(self) -> str:
        """An answer and no calls (``answer_instructions``)."""
        return f"%llguidance {{}}\nstart: {json_rule(_RESPONSE_OBJECT)}"

    def parse(self, text: str, tools: Sequence[Tool], final: bool) -> Parsed:
        if not final:
            return Parsed(_partial_response(text) or "", _finished_calls(text))
        try:
            found = json.loads(text)
        except json.JSONDecodeError:
            return Parsed(text)
        if isinstance(found, dict) and isinstance(found.get("response"), str):
            return Parsed(found["response"])
        calls = listed_calls(found.get("tool_calls") if isinstance(found, dict) else None)
        return Parsed("", calls) if calls else Parsed(text)

    def scan(self, text: str, at: int, tools: Sequence[Tool]) -> Scan:
        """The response's text from ``at``: past the opening ``{"response": "`` (then ``at`` is
        within the string), every whole character and escape is read for good."""
        if at == 0:
            match = _RESPONSE.match(text)
            if match is None:  # calls: read again as a whole, each one once it is whole
                return Scan(Parsed("", _finished_calls(text)))
            at = match.end()
        said, settled = _response_text(text, at)
        return Scan(Parsed(said), settled)

    def grammar(
        self, tools: Sequence[Tool], choice: ToolChoice, parallel: bool, lit: Callable[[str], str]
    ) -> str:
        calls = calls_array(chosen(tools, choice), parallel)
        answers: list[dict[str, Any]] = [
            {
                "type": "object",
                "properties": {"tool_calls": calls},
                "required": ["tool_calls"],
                "additionalProperties": False,
            }
        ]
        if choice.mode == "auto":
            answers.append(_RESPONSE_OBJECT)
        return f"%llguidance {{}}\nstart: {json_rule({'anyOf': answers})}"


_RESPONSE_OBJECT: dict[str, Any] = {
    "type": "object",
    "properties": {"response": {"type": "string"}},
    "required": ["response"],
    "additionalProperties": False,
}
_RESPONSE = re.compile(r'^\s*\{\s*"response"\s*:\s*"')
_CALLS = re.compile(r'^\s*\{\s*"tool_calls"\s*:\s*\[')
_BETWEEN = re.compile(r"\s*,?\s*")


def _finished_calls(text: str) -> list[Call]:
    """The whole calls of a ``{"tool_calls": [...`` answer so far (or cut short)."""
    match = _CALLS.match(text)
    if match is None:
        return []
    decoder, at, entries = json.JSONDecoder(), match.end(), []
    while True:
        at = _BETWEEN.match(text, at).end()  # type: ignore[union-attr]
        try:
            entry, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            break
        entries.append(entry)
    return listed_calls(entries) or []


def _partial_response(text: str) -> str | None:
    """The text of a ``{"response": "...`` answer so far (whole escapes only)."""
    match = _RESPONSE.match(text)
    if match is None:
        return None
    return _response_text(text, match.end())[0]


def _response_text(body: str, i: int) -> tuple[str, int]:
    """The JSON string's text from ``i`` (within it) up to its closing quote or to what is not
    whole yet (an escape cut short), and where that stops."""
    out: list[str] = []
    while i < len(body):
        c = body[i]
        if c == '"':
            break
        if c == "\\":
            escape = body[i : i + 6] if body[i + 1 : i + 2] == "u" else body[i : i + 2]
            if len(escape) < (6 if escape[1:2] == "u" else 2):
                break
            try:
                out.append(json.loads(f'"{escape}"'))
            except json.JSONDecodeError:
                break
            i += len(escape)
            continue
        out.append(c)
        i += 1
    return "".join(out), i
