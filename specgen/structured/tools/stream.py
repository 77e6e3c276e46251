"""An answer's tool calls while it streams: ``ToolStream`` turns each piece of text into an
OpenAI ``Delta`` (content, and ``tool_calls`` deltas), reading on from where the syntax left
the text settled (``Syntax.scan``), so that a piece costs what is new, not the whole answer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from specgen.structured.tools.request import Tool, ToolCall, new_call_id
from specgen.structured.tools.syntax import Call, Parsed, Syntax, kept_calls, same_call


@dataclass
class Delta:
    """What a piece of streamed text adds: content, and OpenAI ``tool_calls`` deltas."""

    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


class ToolStream:
    """The streamed text of one answer, read as it comes: content is passed on until a call may
    begin; a call's first delta carries its index, id, type and name, later ones fragments of
    its arguments. What streams is always a prefix of what the whole text parses to.

    A call that repeats an earlier one of the answer (``kept_calls``) is not sent: while it may
    still turn out the same (the same function, its arguments so far a prefix of the earlier
    one's) it is held back, and once it is the same, ``repeated`` says the answer is over (the
    caller stops the generation); the reader takes no more text."""

    def __init__(self, syntax: Syntax, tools: Sequence[Tool]) -> None:
        self.syntax, self.tools, self.text = syntax, tools, ""
        self.sent_content = 0
        self.sent: list[tuple[str, str]] = []  # per call: its id, the arguments sent so far
        self.names: list[str] = []  # per call sent: its function
        self.calls: list[ToolCall] = []
        self.repeated = False
        # The text before ``settled`` is read for good: it said ``settled_content`` characters
        # of content and the first ``settled_calls`` calls, all of which have been sent.
        self.settled = self.settled_content = self.settled_calls = 0

    def feed(self, piece: str) -> Delta:
        if self.repeated:
            return Delta()
        self.text += piece
        scan = self.syntax.scan(self.text, self.settled, self.tools)
        delta = self._diff(scan.parsed, self.settled_content, self.settled_calls)
        if scan.settled > self.settled:
            self.settled = scan.settled
            self.settled_content += len(scan.parsed.content)
            self.settled_calls += scan.whole
        return delta

    def finish(self, cut: bool = False) -> Delta:
        """The rest, from the whole text; ``self.calls`` are then the answer's calls. ``cut``:
        the answer was cut short (``max_tokens``), so a call still being written is dropped,
        as is one that repeated an earlier one."""
        ended = cut or self.repeated
        parsed = self.syntax.parse(self.text, self.tools, final=not ended)
        calls, repeated = kept_calls(parsed.calls)
        self.repeated = self.repeated or repeated
        delta = self._diff(Parsed(parsed.content, calls))
        self.calls = [  # kept calls are whole: each has its name and arguments
            ToolCall(self.sent[i][0], c.name or "", c.arguments or "")
            for i, c in enumerate(calls)
            if i < len(self.sent)
        ]
        return delta

    def _may_repeat(self, call: Call) -> bool:
        """Whether ``call`` is, or may still become, a call already sent."""
        for name, (_, arguments) in zip(self.names, self.sent, strict=True):
            if name != call.name:
                continue
            if (
                same_call(call, Call(name, arguments))
                if call.done
                else (arguments.startswith(call.arguments or ""))
            ):
                return True
        return False

    def _diff(self, parsed: Parsed, content_at: int = 0, first_call: int = 0) -> Delta:
        """What ``parsed`` (what the text says from content offset ``content_at`` and call
        ``first_call`` on) adds to what was sent."""
        delta = Delta()
        # What was sent is at least what settled (it was sent as it settled), so the slice
        # below starts inside ``parsed.content``.
        said = content_at + len(parsed.content)
        if said > self.sent_content:
            delta.content = parsed.content[self.sent_content - content_at :]
            self.sent_content = said
        for index, call in enumerate(parsed.calls, first_call):
            if call.name is None:
                break
            if index == len(self.sent):
                if self._may_repeat(call):
                    self.repeated = self.repeated or call.done
                    break
                self.sent.append((new_call_id(), ""))
                self.names.append(call.name)
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
