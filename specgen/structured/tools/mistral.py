"""Mistral's two ways after ``[TOOL_CALLS]``: Nemo's one JSON list of every call (read as a
whole), and the later templates' ``NAME[ARGS]{...}``, one block per call."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from specgen.structured.tools.json_calls import (
    calls_array,
    held_arguments,
    json_arguments,
    json_rule,
    listed_calls,
    loose_json,
    schema_of,
)
from specgen.structured.tools.request import Tool, ToolChoice
from specgen.structured.tools.syntax import BlockSyntax, Call, Parsed, Syntax, chosen, hold


class MistralNemo(Syntax):
    """Mistral Nemo and others of its time: ``[TOOL_CALLS][{"name": ..., "arguments": {...},
    "id": "..."}, ...]``."""

    name = "mistral-nemo"
    start = "[TOOL_CALLS]"
    markers = ("[TOOL_CALLS]",)
    ID = {"type": "string", "pattern": "^[A-Za-z0-9]{9}$"}  # the call ids its template writes

    def parse(self, text: str, tools: Sequence[Tool], final: bool) -> Parsed:
        begin = text.find(self.start)
        if begin < 0:
            return Parsed(text if final else hold(text, self.start))
        if not final:
            return Parsed(text[:begin])
        try:
            found = json.loads(text[begin + len(self.start) :])
        except json.JSONDecodeError:
            return Parsed(text)
        calls = listed_calls(found)
        return Parsed(text[:begin], calls) if calls else Parsed(text)

    def grammar(
        self, tools: Sequence[Tool], choice: ToolChoice, parallel: bool, lit: Callable[[str], str]
    ) -> str:
        items = calls_array(chosen(tools, choice), parallel, {"id": self.ID})
        call = f"call: {lit(self.start)} {json_rule(items)}"
        if choice.mode in ("required", "named"):
            return f"%llguidance {{}}\nstart: call\n{call}"
        return f"%llguidance {{}}\nstart: TEXT | TEXT call\nTEXT: /(.|\\n)*/\n{call}"


class MistralTagged(BlockSyntax):
    """Ministral/Magistral 3 and later Mistral templates: ``[TOOL_CALLS]NAME[ARGS]{...}``,
    one per call."""

    name = "mistral"
    start = "[TOOL_CALLS]"
    markers = ("[TOOL_CALLS]", "[ARGS]")

    def body(self, body: str, tools: Sequence[Tool], final: bool) -> Call | None:
        if "[ARGS]" not in body:
            return None if final else Call(None, None, done=False)
        name, arguments = body.split("[ARGS]", 1)
        if not final:
            return Call(name.strip(), held_arguments(arguments, self.start), done=False)
        checked_arguments = json_arguments(loose_json(arguments.strip()))
        return None if checked_arguments is None else Call(name.strip(), arguments.strip())

    def call_rule(self, tools: Sequence[Tool], lit: Callable[[str], str]) -> str:
        alternatives = [
            f"{json.dumps(t.name)} {lit('[ARGS]')} {json_rule(schema_of(t))}" for t in tools
        ]
        return f"body: {' | '.join(alternatives)}"
