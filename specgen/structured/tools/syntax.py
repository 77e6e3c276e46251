"""What every family of tool-call syntax is: a ``Syntax`` reads a model's text into ``Parsed``
content and ``Call``s (whole, or while it streams) and writes the Lark grammar that keeps a call
well formed. ``BlockSyntax`` is the shape most families share: a start marker, a body, an
optional end marker, once per call.

While an answer streams, ``Syntax.scan`` reads on from where the last piece left the text
settled, so a stream reads each call once (``ToolStream``). Knows no particular family."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from specgen.structured.tools.request import Tool, ToolChoice


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


@dataclass
class Scan:
    """What ``Syntax.scan`` read of a streaming text from ``at``: ``parsed`` is what that part
    of the text says so far. Once ``settled`` is past ``at``, the text before ``settled`` is read
    for good: it gave all of ``parsed.content`` and the first ``whole`` of ``parsed.calls``, and
    the next scan starts at ``settled``."""

    parsed: Parsed
    settled: int = 0
    whole: int = 0


def kept_calls(calls: Sequence[Call]) -> tuple[list[Call], bool]:
    """The calls an answer gives: the finished ones (one still being written when the answer
    was cut is dropped), up to the first that repeats an earlier one, the same function with
    the same arguments; and whether one did (a model that repeats a call would go on repeating
    it until ``max_tokens``: the repeat ends the answer)."""
    kept: list[Call] = []
    for call in calls:
        if not call.done or call.name is None or call.arguments is None:
            break
        if any(same_call(call, earlier) for earlier in kept):
            return kept, True
        kept.append(call)
    return kept, False


def same_call(a: Call, b: Call) -> bool:
    """The same function with the same arguments (as JSON values, however they are spaced)."""
    return a.name == b.name and _value(a.arguments) == _value(b.arguments)


def _value(arguments: str | None) -> object:
    try:
        return json.loads(arguments) if arguments is not None else None
    except json.JSONDecodeError:
        return arguments


def hold(text: str, marker: str) -> str:
    """``text`` without an ending that could be the start of ``marker`` (still streaming)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return text[:-n]
    return text


def chosen(tools: Sequence[Tool], choice: ToolChoice) -> list[Tool]:
    """The tools the grammar lets the model call: the named one, or all."""
    return [t for t in tools if choice.mode != "named" or t.name == choice.name]


class Syntax:
    """How one family of models writes tool calls: which markers it uses, how its text reads
    back (``parse``) and the grammar that constrains it (``grammar``)."""

    name = "generic"
    start = ""
    end: str | None = None
    native = True  # the template itself takes ``tools`` (else they are described in the prompt)
    markers: tuple[str, ...] = ()

    def parse(self, text: str, tools: Sequence[Tool], final: bool) -> Parsed:
        raise NotImplementedError

    def scan(self, text: str, at: int, tools: Sequence[Tool]) -> Scan:
        """``parse(text, final=False)`` of the text from ``at`` (0, or where the last scan of a
        shorter text settled). A syntax that reads its answer only as a whole settles nothing:
        each scan parses it all again."""
        return Scan(self.parse(text, tools, final=False))

    # The grammar, written as Lark for llguidance.
    def grammar(
        self, tools: Sequence[Tool], choice: ToolChoice, parallel: bool, lit: Callable[[str], str]
    ) -> str:
        raise NotImplementedError


class BlockSyntax(Syntax):
    """A syntax of blocks (a start marker, a body, an optional end marker): the families share
    the splitting; each says how its body reads and is constrained."""

    def parse(self, text: str, tools: Sequence[Tool], final: bool) -> Parsed:
        return self._read(text, 0, tools, final).parsed

    def scan(self, text: str, at: int, tools: Sequence[Tool]) -> Scan:
        return self._read(text, at, tools, final=False)

    def _read(self, text: str, at: int, tools: Sequence[Tool], final: bool) -> Scan:
        """The text from ``at``. A closed block, and the content before a block or before an
        ending that may still become the start marker, stay as they are however the text goes
        on: that is what settles (``at`` is the start of the text, or such a point)."""
        content: list[str] = []
        calls: list[Call] = []
        while True:
            begin = text.find(self.start, at)
            if begin < 0:
                rest = text[at:]
                said = rest if final else hold(rest, self.start)
                content.append(said)
                return Scan(Parsed("".join(content), calls), at + len(said), len(calls))
            content.append(text[at:begin])
            body_at = begin + len(self.start)
            close = self._close(text, body_at)
            if close is None:  # the last call is still being written
                whole = len(calls)
                call = self.body(text[body_at:], tools, final)
                if final and call is None:
                    content.append(text[begin:])
                elif call is not None:
                    calls.append(call)
                return Scan(Parsed("".join(content), calls), begin, whole)
            body_end, next_at = close
            call = self.body(text[body_at:body_end], tools, True)
            if call is None:
                content.append(text[begin:next_at])
            else:
                calls.append(call)
            at = next_at

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
        opener = lit(self.start)
        rules = f"call: {opener} body\n{self.call_rule(chosen(tools, choice), lit)}"
        if choice.mode in ("required", "named"):
            top = 'start: call ("\\n"* call)*' if parallel else "start: call"
            return f"%llguidance {{}}\n{top}\n{rules}"
        if opener.startswith("<["):  # a special token: text cannot spell it
            head = f"tag: TEXT {opener} body"
        else:
            head = f"tag: trig body\ntrig[lazy]: TEXT {opener}"
        top = "start: tag* TEXT" if parallel else "start: TEXT | tag"
        return f"%llguidance {{}}\n{top}\nTEXT: /(.|\\n)*/\n{head}\n{rules}"
