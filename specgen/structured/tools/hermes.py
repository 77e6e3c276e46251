"""Hermes 2/3, Qwen2.5 and Qwen3: each call a JSON object in its own ``<tool_call>`` block."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from specgen.structured.tools.json_calls import call_schema, json_call, json_rule
from specgen.structured.tools.request import Tool
from specgen.structured.tools.syntax import BlockSyntax, Call


class Hermes(BlockSyntax):
    """Hermes 2/3, Qwen2.5, Qwen3:
    ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, one block per call."""

    name = "hermes"
    start, end = "<tool_call>", "</tool_call>"
    markers = ("<tool_call>", "</tool_call>")

    def body(self, body: str, tools: Sequence[Tool], final: bool) -> Call | None:
        return json_call(body, "arguments", final, None if final else self.end)

    def call_rule(self, tools: Sequence[Tool], lit: Callable[[str], str]) -> str:
        return (
            f'body: "\\n" {json_rule(call_schema(tools, "arguments"))} "\\n" {lit(self.end or "")}'
        )
