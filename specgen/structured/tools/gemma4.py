"""Gemma 4: ``<|tool_call>call:NAME{...}<tool_call|>`` blocks, whose arguments are JSON with
bare keys and ``<|"|>``-quoted strings (read by ``_GemmaReader``)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from specgen.structured.tools.request import Tool
from specgen.structured.tools.syntax import BlockSyntax, Call


class Gemma4(BlockSyntax):
    """Gemma 4: ``<|tool_call>call:NAME{key:<|"|>text<|"|>,n:3,xs:[1,2]}<tool_call|>``: bare
    keys, strings between ``<|"|>`` quote tokens, the rest as in JSON."""

    name = "gemma4"
    start, end = "<|tool_call>", "<tool_call|>"
    QUOTE = '<|"|>'
    markers = ("<|tool_call>", "<tool_call|>", '<|"|>')

    def body(self, body: str, tools: Sequence[Tool], final: bool) -> Call | None:
        found = re.match(r"^\s*call:([^{\s]+)\{", body)
        if found is None:
            return None if final else Call(None, None, done=False)
        name = found.group(1)
        if not final:
            return Call(name, None, done=False)
        try:
            value, at = _GemmaReader(body, found.end() - 1, self.QUOTE).value()
        except ValueError:
            return None
        if not isinstance(value, dict) or body[at:].strip():
            return None
        return Call(name, json.dumps(value, ensure_ascii=False))

    def call_rule(self, tools: Sequence[Tool], lit: Callable[[str], str]) -> str:
        q = lit(self.QUOTE)
        functions = []
        lines = []
        for i, tool in enumerate(tools):
            keys = list((dict(tool.parameters).get("properties") or {}).keys())
            key = " | ".join(json.dumps(k) for k in keys) if keys else "GKEY"
            lines.append(f'kv{i}: ({key}) ":" gvalue')
            functions.append(f'"call:{tool.name}" "{{" (kv{i} ("," kv{i})*)? "}}"')
        lines += [
            f'gvalue: {q} GTEXT {q} | NUMBER | "true" | "false" | "null" | gobj | garr',
            'gobj: "{" (GKEY ":" gvalue ("," GKEY ":" gvalue)*)? "}"',
            'garr: "[" (gvalue ("," gvalue)*)? "]"',
            r"GKEY: /[A-Za-z_][A-Za-z0-9_]*/",
            r"NUMBER: /-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/",
            r"GTEXT: /[^<]*/" if not q.startswith("<[") else r"GTEXT: /(.|\n)*/",
        ]
        return "\n".join([f"body: ({' | '.join(functions)}) {lit(self.end or '')}", *lines])


_GEMMA_KEY = re.compile(r'[A-Za-z_][A-Za-z0-9_]*|"(?:[^"\\]|\\.)*"')


class _GemmaReader:
    """Gemma 4's argument values: JSON with bare keys and ``<|"|>``-quoted strings."""

    def __init__(self, text: str, at: int, quote: str) -> None:
        self.text, self.at, self.quote = text, at, quote

    def value(self) -> tuple[Any, int]:
        return self._value(), self.at

    def _skip(self) -> None:
        while self.at < len(self.text) and self.text[self.at] in " \n\t\r":
            self.at += 1

    def _take(self, char: str) -> bool:
        self._skip()
        if self.text.startswith(char, self.at):
            self.at += len(char)
            return True
        return False

    def _items(self, close: str, item: Callable[[], None]) -> None:
        """``item, item, ...`` up to ``close`` (the opening bracket already read)."""
        if self._take(close):
            return
        while True:
            item()
            if self._take(close):
                return
            if not self._take(","):
                raise ValueError(f"a ',' or {close!r} expected")

    def _value(self) -> Any:
        self._skip()
        text = self.text
        if text.startswith(self.quote, self.at):
            end = text.find(self.quote, self.at + len(self.quote))
            if end < 0:
                raise ValueError("an unclosed string")
            value = text[self.at + len(self.quote) : end]
            self.at = end + len(self.quote)
            return value
        if self._take("["):
            items: list[Any] = []
            self._items("]", lambda: items.append(self._value()))
            return items
        if self._take("{"):
            out: dict[str, Any] = {}
            self._items("}", lambda: self._pair(out))
            return out
        try:
            value, self.at = json.JSONDecoder().raw_decode(text, self.at)
        except json.JSONDecodeError as err:
            raise ValueError(str(err)) from err
        return value

    def _pair(self, out: dict[str, Any]) -> None:
        self._skip()
        key = _GEMMA_KEY.match(self.text, self.at)
        if key is None:
            raise ValueError("a key expected")
        self.at = key.end()
        if not self._take(":"):
            raise ValueError("':' expected")
        name = key.group(0)
        out[json.loads(name) if name.startswith('"') else name] = self._value()
