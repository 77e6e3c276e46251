"""Calls written as JSON, the pieces the families share: reading ``{"name": ..., "arguments":
{...}}`` back (whole, or so far while it streams, so that what streamed is a prefix of what
ends), and the ``%json`` rules that hold a call's arguments to its tool's JSON Schema."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from specgen.structured.grammar import closed_objects
from specgen.structured.tools.request import Tool
from specgen.structured.tools.syntax import Call, hold

# -- reading calls back --------------------------------------------------------------------------


def held_arguments(text: str, end: str | None) -> str:
    """The arguments so far, less what may still turn out to close the call (a ``}``, space,
    the start of the end marker): a prefix of the arguments' final text."""
    if end:
        text = hold(text, end)
    return text.rstrip(" \t\r\n}")


def json_arguments(value: Any) -> str | None:
    """Arguments as JSON text: an object as it is written, a string that holds one as is."""
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, str):
        try:
            return value if isinstance(json.loads(value), dict) else None
        except json.JSONDecodeError:
            return None
    return None


def loose_json(raw: str) -> Any:
    """``raw`` as JSON, or as the text it is when it is not JSON."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


_NAME_FIELD = re.compile(
    r'^\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(arguments|parameters)"\s*:\s*'
)


def json_call(body: str, key: str, final: bool, end: str | None) -> Call | None:
    """A ``{"name": ..., "<key>": {...}}`` call: whole (``final``) or so far. The arguments are
    the model's own text of them, so what streamed is a prefix of what ends."""
    if not final:
        match = _NAME_FIELD.match(body)
        if match is None:
            return Call(None, None, done=False)
        rest = body[match.end() :]
        return Call(json.loads(f'"{match.group(1)}"'), held_arguments(rest, end), done=False)
    try:
        found = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(found, dict) or not isinstance(found.get("name"), str):
        return None
    if key not in found:
        return None
    match = _NAME_FIELD.match(body)
    if match is not None and match.group(2) == key:
        try:
            value, _ = json.JSONDecoder().raw_decode(body, match.end())
        except json.JSONDecodeError:
            value = None
        if isinstance(value, dict):
            return Call(found["name"], body[match.end() :].rstrip().removesuffix("}").rstrip())
    arguments = json_arguments(found[key])
    return None if arguments is None else Call(found["name"], arguments)


def listed_calls(entries: Any) -> list[Call] | None:
    """A JSON list of ``{"name": ..., "arguments": {...}}`` as calls (None: not such a list)."""
    if not isinstance(entries, list) or not entries:
        return None
    calls = []
    for entry in entries:
        arguments = json_arguments(entry.get("arguments")) if isinstance(entry, dict) else None
        if arguments is None or not isinstance(entry.get("name"), str):
            return None
        calls.append(Call(entry["name"], arguments))
    return calls


# -- the grammar's JSON rules --------------------------------------------------------------------


def schema_of(tool: Tool) -> dict[str, Any]:
    """A tool's arguments' schema as its grammar holds them: objects closed as every JSON
    Schema is (``closed_objects``: a function takes what it names; left open, a small model
    invents arguments until ``max_tokens``)."""
    schema: dict[str, Any] = closed_objects(dict(tool.parameters) or {"type": "object"})
    return schema


def call_schema(
    tools: Sequence[Tool], key: str, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """``{"name": <one tool's>, <key>: <its arguments>}`` (and ``extra`` optional fields)."""
    return {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": t.name}, key: schema_of(t), **(extra or {})},
                "required": ["name", key],
                "additionalProperties": False,
            }
            for t in tools
        ]
    }


def calls_array(
    tools: Sequence[Tool], parallel: bool, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A JSON list of calls: at least one, and only one unless ``parallel``."""
    array: dict[str, Any] = {
        "type": "array",
        "items": call_schema(tools, "arguments", extra),
        "minItems": 1,
    }
    if not parallel:
        array["maxItems"] = 1
    return array


# Calls are written as templates render them (``tojson``: ", " and ": ", no other space): the
# model's own habit, and every key and separator one forced way on (free guesses).
RIGID = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def json_rule(schema: Mapping[str, Any]) -> str:
    """A Lark ``%json`` rule for ``schema``, written the rigid way (``RIGID``)."""
    return "%json " + json.dumps({**schema, "x-guidance": RIGID})
