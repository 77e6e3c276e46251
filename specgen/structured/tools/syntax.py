"""Tool calls: OpenAI's ``tools`` and ``tool_choice`` for local models, in each model's own syntax.

A model calls tools in the syntax its chat template taught it (Hermes/Qwen ``<tool_call>`` JSON,
Qwen3.5's XML, Llama 3's bare JSON, Mistral's ``[TOOL_CALLS]``, Gemma 4's ``<|tool_call>``); a
template without tools gets a generic JSON answer under a grammar, as llama-server does. This
module owns, per syntax: which templates use it, the grammar that keeps a call well formed (the
arguments under each tool's JSON Schema where the syntax is JSON), and the parser that turns the
model's text back into OpenAI ``tool_calls``, whole or while it streams (``ToolStream``).

``tool_choice``: ``auto`` lets the model answer or call (the grammar is lazy: free text until a
call begins, then the call's syntax); ``required`` and a named function must call (the grammar
starts with the call); ``none`` renders no tools. A call that does not parse comes back as text.

Pure: no llama.cpp and no server. The markers a vocabulary holds as single special tokens are
given by the caller (``Plan.markers``), so the grammar writes them as those tokens.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from specgen.errors import UsageError
from specgen.structured.grammar import Grammar, checked

NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
Mode = Literal["auto", "none", "required", "named"]


# -- what a request asks for ---------------------------------------------------------------------


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


# -- what a model's text holds -------------------------------------------------------------------


@dataclass
class Call:
    """A call in a model's text: its name and arguments once known. While it streams,
    ``arguments`` is a prefix of the final JSON text (or None until one is safe to say)."""

    name: str | None
    arguments: str | None
    done: bool = True


@dataclass
class Parsed:
    """A model's text split into what it says (``content``) and the calls it makes."""

    content: str
    calls: list[Call] = field(default_factory=list)


def _hold(text: str, marker: str) -> str:
    """``text`` without an ending that could be the start of ``marker`` (still streaming)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return text[:-n]
    return text


def _held_arguments(text: str, end: str | None) -> str:
    """The arguments so far, less what may still turn out to close the call (a ``}``, space,
    the start of the end marker): a prefix of the arguments' final text."""
    if end:
        text = _hold(text, end)
    return text.rstrip(" \t\r\n}")


def _json_arguments(value: Any) -> str | None:
    """Arguments as JSON text: an object as it is written, a string that holds one as is."""
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, str):
        try:
            return value if isinstance(json.loads(value), dict) else None
        except json.JSONDecodeError:
            return None
    return None


_NAME_FIELD = re.compile(
    r'^\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(arguments|parameters)"\s*:\s*'
)


def _json_call(body: str, key: str, final: bool, end: str | None) -> Call | None:
    """A ``{"name": ..., "<key>": {...}}`` call: whole (``final``) or so far. The arguments are
    the model's own text of them, so what streamed is a prefix of what ends."""
    if not final:
        match = _NAME_FIELD.match(body)
        if match is None:
            return Call(None, None, done=False)
        rest = body[match.end() :]
        return Call(json.loads(f'"{match.group(1)}"'), _held_arguments(rest, end), done=False)
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
    arguments = _json_arguments(found[key])
    return None if arguments is None else Call(found["name"], arguments)


# -- syntaxes ------------------------------------------------------------------------------------


class Syntax:
    """How one family of models writes tool calls. Block syntaxes (a start marker, a body, an
    optional end marker) share the splitting; each says how its body reads and is constrained."""

    name = "generic"
    start = ""
    end: str | None = None
    native = True  # the template itself takes ``tools`` (else they are described in the prompt)
    markers: tuple[str, ...] = ()

    def parse(self, text: str, tools: Sequence[Tool], final: bool) -> Parsed:
        content: list[str] = []
        calls: list[Call] = []
        at = 0
        while True:
            begin = text.find(self.start, at)
            if begin < 0:
                rest = text[at:]
                content.append(rest if final else _hold(rest, self.start))
                break
            content.append(text[at:begin])
            body_at = begin + len(self.start)
            close = self._close(text, body_at)
            if close is None:  # the last call is still being written
                call = self.body(text[body_at:], tools, final)
                if final and call is None:
                    content.append(text[begin:])
                elif call is not None:
                    calls.append(call)
                break
            body_end, next_at = close
            call = self.body(text[body_at:body_end], tools, True)
            if call is None:
                content.append(text[begin:next_at])
            else:
                calls.append(call)
            at = next_at
        return Parsed("".join(content), calls)

    def _close(self, text: str, at: int) -> tuple[int, int] | None:
        """Where the body starting at ``at`` ends, and where the text after the call starts."""
        if self.end:
            found = text.find(self.end, at)
            return None if found < 0 else (found, found + len(self.end))
        found = text.find(self.start, at)
        return None if found < 0 else (found, found)

    def body(self, body: str, tools: Sequence[Tool], final: bool) -> Call | None:
        raise NotImplementedError

    # The grammar: a call (``call``), written as Lark for llguidance.
    def call_rule(self, tools: Sequence[Tool], lit: Callable[[str], str]) -> str:
        raise NotImplementedError

    def grammar(
        self, tools: Sequence[Tool], choice: ToolChoice, parallel: bool, lit: Callable[[str], str]
    ) -> str:
        """The Lark grammar for this choice: ``required``/``named`` start with a call (one, or
        several with ``parallel``); ``auto`` is free text until the start marker, then a call."""
        chosen = _chosen(tools, choice)
        opener = lit(self.start)
        rules = f"call: {opener} body\n{self.call_rule(chosen, lit)}"
        if choice.mode in ("required", "named"):
            top = 'start: call ("\\n"* call)*' if parallel else "start: call"
            return f"%llguidance {{}}\n{top}\n{rules}"
        if opener.startswith("<["):  # a special token: text cannot spell it
            head = f"tag: TEXT {opener} body"
        else:
            head = f"tag: trig body\ntrig[lazy]: TEXT {opener}"
        top = "start: tag* TEXT" if parallel else "start: TEXT | tag"
        return f"%llguidance {{}}\n{top}\nTEXT: /(.|\\n)*/\n{head}\n{rules}"


def _schema_of(tool: Tool) -> dict[str, Any]:
    """A tool's arguments' schema as its grammar holds them: only the properties it declares,
    unless the schema says ``additionalProperties`` itself (a function takes what it names;
    left open, a small model invents arguments until ``max_tokens``)."""
    schema = dict(tool.parameters) or {"type": "object"}
    if schema.get("type") == "object" and "properties" in schema:
        schema.setdefault("additionalProperties", False)
    return schema


def _call_schema(
    tools: Sequence[Tool], key: str, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """``{"name": <one tool's>, <key>: <its arguments>}`` (and ``extra`` optional fields)."""
    return {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": t.name}, key: _schema_of(t), **(extra or {})},
                "required": ["name", key],
                "additionalProperties": False,
            }
            for t in tools
        ]
    }


def _listed_calls(entries: Any) -> list[Call] | None:
    """A JSON list of ``{"name": ..., "arguments": {...}}`` as calls (None: not such a list)."""
    if not isinstance(entries, list) or not entries:
        return None
    calls = []
    for entry in entries:
        arguments = _json_arguments(entry.get("arguments")) if isinstance(entry, dict) else None
        if arguments is None or not isinstance(entry.get("name"), str):
            return None
        calls.append(Call(entry["name"], arguments))
    return calls


def _chosen(tools: Sequence[Tool], choice: ToolChoice) -> list[Tool]:
    """The tools the grammar lets the model call: the named one, or all."""
    return [t for t in tools if choice.mode != "named" or t.name == choice.name]


def _calls_array(
    tools: Sequence[Tool], parallel: bool, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A JSON list of calls: at least one, and only one unless ``parallel``."""
    array: dict[str, Any] = {
        "type": "array",
        "items": _call_schema(tools, "arguments", extra),
        "minItems": 1,
    }
    if not parallel:
        array["maxItems"] = 1
    return array


# Calls are written as templates render them (``tojson``: ", " and ": ", no other space): the
# model's own habit, and every key and separator one forced way on (free guesses).
RIGID = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _json(schema: Mapping[str, Any]) -> str:
    return "%json " + json.dumps({**schema, "x-guidance": RIGID})


class Hermes(Syntax):
    """Hermes 2/3, Qwen2.5, Qwen3:
    ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, one block per call."""

    name = "hermes"
    start, end = "<tool_call>", "</tool_call>"
    markers = ("<tool_call>", "</tool_call>")

    def body(self, body: str, tools: Sequence[Tool], final: bool) -> Call | None:
        return _json_call(body, "arguments", final, None if final else self.end)

    def call_rule(self, tools: Sequence[Tool], lit: Callable[[str], str]) -> str:
        return f'body: "\\n" {_json(_call_schema(tools, "arguments"))} "\\n" {lit(self.end or "")}'


class QwenXml(Syntax):
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
            arguments[key] = raw if kind == "string" else _loose_json(raw)
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
                    else f'{_json(schema)} "\\n</parameter>\\n"'
                )
                lines.append(f'p{i}_{j}: "<parameter={key}>\\n" {value}')
                params.append(f"p{i}_{j}")
            any_param = f"({' | '.join(params)})*" if params else ""
            lines.append(f'f{i}: "<function={tool.name}>\\n" {any_param} "</function>\\n"')
            functions.append(f"f{i}")
        lines.append(r"ptext[lazy]: /(.|\n)*\n<\/parameter>\n/")
        body = f'body: "\\n" ({" | ".join(functions)}) {lit(self.end or "")}'
        return "\n".join([body, *lines])


def _loose_json(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


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
        call = _json_call(body.strip() if final else body, "parameters", final, None)
        if call is None:
            return Parsed(text)
        return Parsed("", [call])

    def call_rule(self, tools: Sequence[Tool], lit: Callable[[str], str]) -> str:
        return f"call: {_json(_call_schema(tools, 'parameters'))}"

    def grammar(
        self, tools: Sequence[Tool], choice: ToolChoice, parallel: bool, lit: Callable[[str], str]
    ) -> str:
        chosen = _chosen(tools, choice)
        rules = self.call_rule(chosen, lit)
        if choice.mode in ("required", "named"):
            return f"%llguidance {{}}\nstart: call\n{rules}"
        return f"%llguidance {{}}\nstart: TEXT | call\nTEXT: /[^{{](.|\\n)*/\n{rules}"


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
            return Parsed(text if final else _hold(text, self.start))
        if not final:
            return Parsed(text[:begin])
        try:
            found = json.loads(text[begin + len(self.start) :])
        except json.JSONDecodeError:
            return Parsed(text)
        calls = _listed_calls(found)
        return Parsed(text[:begin], calls) if calls else Parsed(text)

    def grammar(
        self, tools: Sequence[Tool], choice: ToolChoice, parallel: bool, lit: Callable[[str], str]
    ) -> str:
        chosen = _chosen(tools, choice)
        items = _calls_array(chosen, parallel, {"id": self.ID})
        call = f"call: {lit(self.start)} {_json(items)}"
        if choice.mode in ("required", "named"):
            return f"%llguidance {{}}\nstart: call\n{call}"
        return f"%llguidance {{}}\nstart: TEXT | TEXT call\nTEXT: /(.|\\n)*/\n{call}"


class MistralTagged(Syntax):
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
            return Call(name.strip(), _held_arguments(arguments, self.start), done=False)
        checked_arguments = _json_arguments(_loose_json(arguments.strip()))
        return None if checked_arguments is None else Call(name.strip(), arguments.strip())

    def call_rule(self, tools: Sequence[Tool], lit: Callable[[str], str]) -> str:
        alternatives = [
            f"{json.dumps(t.name)} {lit('[ARGS]')} {_json(_schema_of(t))}" for t in tools
        ]
        return f"body: {' | '.join(alternatives)}"


class Gemma4(Syntax):
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

    def parse(self, text: str, tools: Sequence[Tool], final: bool) -> Parsed:
        if not final:
            return Parsed(_partial_response(text) or "")
        try:
            found = json.loads(text)
        except json.JSONDecodeError:
            return Parsed(text)
        if isinstance(found, dict) and isinstance(found.get("response"), str):
            return Parsed(found["response"])
        calls = _listed_calls(found.get("tool_calls") if isinstance(found, dict) else None)
        return Parsed("", calls) if calls else Parsed(text)

    def grammar(
        self, tools: Sequence[Tool], choice: ToolChoice, parallel: bool, lit: Callable[[str], str]
    ) -> str:
        chosen = _chosen(tools, choice)
        calls = _calls_array(chosen, parallel)
        answers: list[dict[str, Any]] = [
            {
                "type": "object",
                "properties": {"tool_calls": calls},
                "required": ["tool_calls"],
                "additionalProperties": False,
            }
        ]
        if choice.mode == "auto":
            answers.append(
                {
                    "type": "object",
                    "properties": {"response": {"type": "string"}},
                    "required": ["response"],
                    "additionalProperties": False,
                }
            )
        return f"%llguidance {{}}\nstart: {_json({'anyOf': answers})}"


_RESPONSE = re.compile(r'^\s*\{\s*"response"\s*:\s*"')


def _partial_response(text: str) -> str | None:
    """The text of a ``{"response": "...`` answer so far (whole escapes only)."""
    match = _RESPONSE.match(text)
    if match is None:
        return None
    out, i, body = [], match.end(), text
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
    return "".join(out)


SYNTAXES: tuple[type[Syntax], ...] = (Gemma4, MistralTagged, MistralNemo, QwenXml, Hermes, Llama3)


def syntax_for(template: str | None) -> Syntax:
    """The tool-call syntax a chat template teaches (by its markers, as llama.cpp tells them
    apart), or the generic JSON form when it teaches none."""
    text = template or ""
    if "<|tool_call>" in text:
        return Gemma4()
    if "[TOOL_CALLS]" in text:
        return MistralTagged() if "[ARGS]" in text else MistralNemo()
    if "<tool_call>" in text:
        return QwenXml() if "<function=" in text else Hermes()
    if "<|start_header_id|>" in text and ("<|python_tag|>" in text or '"parameters"' in text):
        return Llama3()
    return Generic()


# -- one request's tools -------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """One request's tools: the syntax, what the prompt gets, what the output must match, and
    how the text is read back. ``markers``: the syntax's markers that the vocabulary holds as
    single special tokens (text -> token id), which the grammar writes as those tokens and the
    output keeps as their text."""

    syntax: Syntax
    tools: tuple[Tool, ...]
    choice: ToolChoice
    parallel: bool = True
    markers: Mapping[str, int] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return bool(self.tools) and self.choice.mode != "none"

    def keep_text(self) -> tuple[tuple[int, bytes], ...]:
        """The special-token markers the output prints as their text, so the parser sees them
        (``GenerationConfig.keep_text``)."""
        return tuple((token, text.encode()) for text, token in self.markers.items())

    def template_tools(self) -> list[dict[str, Any]] | None:
        """The ``tools`` the chat template renders (none for ``none`` or the generic form)."""
        if not self.active or not self.syntax.native:
            return None
        return [t.as_openai() for t in self.tools]

    def grammar(self) -> Grammar | None:
        """What the output must match (compiled once: a bad tool schema is said here)."""
        if not self.active:
            return None

        def lit(text: str) -> str:
            token = self.markers.get(text)
            return f"<[{token}]>" if token is not None else json.dumps(text)

        try:
            return checked(
                Grammar("lark", self.syntax.grammar(self.tools, self.choice, self.parallel, lit))
            )
        except UsageError as err:
            raise UsageError(f"the tools' schemas give no usable grammar: {err}") from err

    def messages(self, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The conversation as the chat template takes it: tool calls with their arguments as
        objects and a null content as "". A template without tools (the generic form) gets them
        described in the system message, calls written as the JSON the model answers with, and
        results as the user's turn (one turn for results in a row)."""
        out: list[dict[str, Any]] = []
        results: list[bool] = []  # whether out[i] holds tool results
        for message in messages:
            item = dict(message)
            if item.get("content") is None:
                item["content"] = ""
            if item.get("tool_calls"):
                item["tool_calls"] = [_call_for_template(c) for c in item["tool_calls"]]
            result = item.get("role") == "tool"
            if not self.syntax.native:
                item = _as_text(item)
                if result and results and results[-1]:
                    out[-1]["content"] += "\n" + item["content"]
                    continue
            out.append(item)
            results.append(result)
        if self.active and isinstance(self.syntax, Generic):
            text = self.syntax.instructions(self.tools, self.choice)
            if out and out[0]["role"] == "system":
                out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{text}"}
            else:
                out.insert(0, {"role": "system", "content": text})
        return out

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """The final text's content (None when it is only calls) and its calls, with new ids."""
        if not self.active:
            return text, []
        parsed = self.syntax.parse(text, self.tools, final=True)
        calls = [
            ToolCall(new_call_id(), c.name, c.arguments)
            for c in parsed.calls
            if c.name is not None and c.arguments is not None
        ]
        content = parsed.content if parsed.content.strip() or not calls else None
        return content, calls

    def stream(self) -> ToolStream:
        return ToolStream(self)


def _call_for_template(call: Any) -> dict[str, Any]:
    """An OpenAI tool call with its arguments as an object (what templates index into)."""
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        return call if isinstance(call, dict) else {}
    function = dict(call["function"])
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            function["arguments"] = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    return {**call, "type": call.get("type", "function"), "function": function}


def _as_text(item: dict[str, Any]) -> dict[str, Any]:
    """A message for a template without tools: calls as the generic JSON, results as user text."""
    if item.get("role") == "tool":
        name = item.get("name") or item.get("tool_call_id") or "the tool"
        return {"role": "user", "content": f"The result of {name}: {item['content']}"}
    calls = item.get("tool_calls")
    if calls:
        written = [
            {"name": c["function"].get("name"), "arguments": c["function"].get("arguments")}
            for c in calls
            if c
        ]
        text = json.dumps({"tool_calls": written}, ensure_ascii=False)
        content = f"{item['content']}\n{text}" if item["content"] else text
        return {"role": item["role"], "content": content}
    return {"role": item["role"], "content": item["content"]}


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class Delta:
    """What a piece of streamed text adds: content, and OpenAI ``tool_calls`` deltas."""

    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


class ToolStream:
    """The streamed text of one answer, read as it comes: content is passed on until a call may
    begin; a call's first delta carries its index, id, type and name, later ones fragments of
    its arguments. What streams is always a prefix of what the whole text parses to."""

    def __init__(self, plan: Plan) -> None:
        self.plan, self.text = plan, ""
        self.sent_content = 0
        self.sent: list[tuple[str, str]] = []  # per call: its id, the arguments sent so far
        self.calls: list[ToolCall] = []

    def feed(self, piece: str) -> Delta:
        self.text += piece
        return self._diff(self.plan.syntax.parse(self.text, self.plan.tools, final=False))

    def finish(self) -> Delta:
        """The rest, from the whole text; ``self.calls`` are then the answer's calls."""
        parsed = self.plan.syntax.parse(self.text, self.plan.tools, final=True)
        delta = self._diff(parsed)
        self.calls = [
            ToolCall(self.sent[i][0], c.name, c.arguments)
            for i, c in enumerate(parsed.calls)
            if i < len(self.sent) and c.name is not None and c.arguments is not None
        ]
        return delta

    def _diff(self, parsed: Parsed) -> Delta:
        delta = Delta()
        if len(parsed.content) > self.sent_content:
            delta.content = parsed.content[self.sent_content :]
            self.sent_content = len(parsed.content)
        for index, call in enumerate(parsed.calls):
            if call.name is None:
                break
            if index == len(self.sent):
                self.sent.append((new_call_id(), ""))
                delta.tool_calls.append(
                    {
                        "index": index,
                        "id": self.sent[index][0],
                        "type": "function",
                        "function": {"name": call.name, "arguments": ""},
                    }
                )
            ident, sent = self.sent[index]
            arguments = call.arguments or ""
            if len(arguments) > len(sent) and arguments.startswith(sent):
                delta.tool_calls.append(
                    {"index": index, "function": {"arguments": arguments[len(sent) :]}}
                )
                self.sent[index] = (ident, arguments)
        return delta
