"""Llama 3.1/3.2/3.3: the whole answer is one JSON call, or it is text. Read as a whole, so a
stream parses it all again for each piece (``Syntax.scan``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from specgen.structured.tools.json_calls import call_schema, json_call, json_rule
from specgen.structured.tools.request import Tool, ToolChoice
from specgen.structured.tools.syntax import Parsed, Syntax, chosen


class Llama3(Syntax):
    """Llama 3.1/3.2/3.3: the whole answer is ``{"name": ..., "parameters": {...}}`` (after an
    optional ``<|python_tag|>``); any other answer is text."""

    name = "llama3"
    markers = ("<|python_tag|>",)

    def parse(self, text: str, tools: Sequence[Tool], final: bool) -> Parsed:
        body = text.removeprefix("<|python_tag|>")
        if not body.lstrip().startswith("{"):
            if not final and (not body.strip() or "<|python_tag|>".startswith(text)):
                return Parsed("")
            return Parsed(text)
        call = json_call(body.strip() if final else body, "parameters", final, None)
        if call is None:
            return Parsed(text)
        return Parsed("", [call])

    def call_rule(self, tools: Sequence[Tool], lit: Callable[[str], str]) -> str:
        return f"call: {json_rule(call_schema(tools, 'parameters'))}"

    def grammar(
        self, tools: Sequence[Tool], choice: ToolChoice, parallel: bool, lit: Callable[[str], str]
    ) -> str:
        rules = self.call_rule(chosen(tools, choice), lit)
        if choice.mode in ("required", "named"):
            return f"%llguidance {{}}\nstart: call\n{rules}"
        return f"%llguidance {{}}\nstart: TEXT | call\nTEXT: /[^{{](.|\\n)*/\n{rules}"
