"""Qwen3-Coder, Qwen3.5/3.6 and Nemotron Nano 3: a call as XML-like ``<function=NAME>`` and
``<parameter=KEY>`` lines inside a ``<tool_call>`` block, values as text."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from specgen.structured.tools.json_calls import json_rule, loose_json
from specgen.structured.tools.request import Tool
from specgen.structured.tools.syntax import BlockSyntax, Call


class QwenXml(BlockSyntax):
    """Qwen3-Coder, Qwen3.5/3.6, Nemotron Nano 3: ``<tool_call>\\n<function=NAME>\\n
    <parameter=K>\\nV\\n</parameter>\\n</function>\\n</tool_call>`` (values are text; those
    whose schema is not a string are read as JSON)."""

    name = "qwen-xml"
    start, end = "<tool_call>", "</tool_call>"
    markers = ("<tool_call>", "</tool_call>")
    _FUNCTION = re.compile(r"^\s*<function=([^>\n]+)>")
    _PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)

    def body(self, body: str, tools: Sequence[Tool], final: bool) -> Call | None:
        found = self._FUNCTION.match(body)
        if found is None:
            return None if final else Call(None, None, done=False)
        name = found.group(1).strip()
        if not final:
            return Call(name, None, done=False)
        inner = body[found.end() :]
        if "</function>" not in inner:
            return None
        inner = inner[: inner.index("</function>")]
        properties: dict[str, Any] = next(
            (dict(t.parameters).get("properties") or {} for t in tools if t.name == name), {}
        )
        arguments: dict[str, Any] = {}
        for key, raw in self._PARAMETER.findall(inner):
            key = key.strip()
            kind = properties.get(key, {}).get("type") if isinstance(properties, dict) else None
            arguments[key] = raw if kind == "string" else loose_json(raw)
        return Call(name, json.dumps(arguments, ensure_ascii=False))

    def call_rule(self, tools: Sequence[Tool], lit: Callable[[str], str]) -> str:
        lines, functions = [], []
        for i, tool in enumerate(tools):
            props = dict(tool.parameters).get("properties") or {}
            params = []
            for j, (key, schema) in enumerate(props.items()):
                value = (
                    "ptext"
                    if not isinstance(schema, dict) or schema.get("type") in ("string", None)
                    else f'{json_rule(schema)} "\\n</parameter>\\n"'
                )
                lines.append(f'p{i}_{j}: "<parameter={key}>\\n" {value}')
                params.append(f"p{i}_{j}")
            any_param = f"({' | '.join(params)})*" if params else ""
            lines.append(f'f{i}: "<function={tool.name}>\\n" {any_param} "</function>\\n"')
            functions.append(f"f{i}")
        lines.append(r"ptext[lazy]: /(.|\n)*\n<\/parameter>\n/")
        body = f'body: "\\n" ({" | ".join(functions)}) {lit(self.end or "")}'
        return "\n".join([body, *lines])
