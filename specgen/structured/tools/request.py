"""What a request asks for: OpenAI's ``tools`` and ``tool_choice`` read into ``Tool`` and
``ToolChoice`` (a malformed one is a one-line ``UsageError``), and ``ToolCall``, a call as the
answer carries it. Knows no syntax: how a model writes calls is the families' business."""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from specgen.errors import UsageError

NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
Mode = Literal["auto", "none", "required", "named"]


@dataclass(frozen=True)
class Tool:
    """One function a model may call: its name, description and arguments' JSON Schema."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object"})

    def as_openai(self) -> dict[str, Any]:
        """The shape chat templates take (``tools`` as OpenAI sends them)."""
        function: dict[str, Any] = {"name": self.name, "parameters": dict(self.parameters)}
        if self.description:
            function["description"] = self.description
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolCall:
    """A call the model made: OpenAI's ``id``, the function's name, its arguments as JSON text."""

    id: str
    name: str
    arguments: str

    def as_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def tools_from_request(value: Any) -> tuple[Tool, ...]:
    """OpenAI's ``tools`` list; UsageError (one line) on a malformed one."""
    if not isinstance(value, list):
        raise UsageError('\'tools\' must be a list of {"type": "function", "function": {...}}')
    tools: list[Tool] = []
    for i, entry in enumerate(value):
        function = entry.get("function") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or entry.get("type", "function") != "function":
            raise UsageError(f"tools[{i}]: only tools of type 'function' are supported")
        if not isinstance(function, dict):
            raise UsageError(f"tools[{i}]: a tool needs a 'function' object")
        name = function.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise UsageError(
                f"tools[{i}]: the function's 'name' must be 1-64 letters, digits, '_', '.' or '-'"
            )
        if any(t.name == name for t in tools):
            raise UsageError(f"tools[{i}]: two tools are named {name!r}")
        parameters = function.get("parameters") or {"type": "object"}
        if not isinstance(parameters, dict):
            raise UsageError(f"tools[{i}]: 'parameters' must be a JSON Schema (an object)")
        description = function.get("description") or ""
        if not isinstance(description, str):
            raise UsageError(f"tools[{i}]: 'description' must be a string")
        tools.append(Tool(name, description, parameters))
    return tuple(tools)


@dataclass(frozen=True)
class ToolChoice:
    """``auto``, ``none``, ``required``, or ``named`` (that one function must be called)."""

    mode: Mode = "auto"
    name: str | None = None


def choice_from_request(value: Any, tools: Sequence[Tool]) -> ToolChoice:
    """OpenAI's ``tool_choice``: a string, or ``{"type": "function", "function": {"name"}}``."""
    if value is None:
        return ToolChoice("auto" if tools else "none")
    if value in ("auto", "none", "required"):
        if value == "required" and not tools:
            raise UsageError("tool_choice 'required' needs 'tools'")
        return ToolChoice(value)
    name = None
    if isinstance(value, dict):
        function = value.get("function")
        if value.get("type") == "function" and isinstance(function, dict):
            name = function.get("name")
    if not isinstance(name, str):
        raise UsageError(
            "'tool_choice' must be 'auto', 'none', 'required' or "
            '{"type": "function", "function": {"name": ...}}'
        )
    if not any(t.name == name for t in tools):
        raise UsageError(f"tool_choice names {name!r}, which is not one of the 'tools'")
    return ToolChoice("named", name)
