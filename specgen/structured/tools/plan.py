"""One request's tools (``ToolPlan``): the syntax its model writes, what the chat template and
the prompt get, the grammar the output must match, and how the answer is read back, whole or
as it streams."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from specgen.errors import UsageError
from specgen.structured.grammar import Grammar, checked
from specgen.structured.tools.generic import Generic
from specgen.structured.tools.request import Tool, ToolCall, ToolChoice, new_call_id
from specgen.structured.tools.stream import ToolStream
from specgen.structured.tools.syntax import Syntax, kept_calls


@dataclass(frozen=True)
class ToolPlan:
    """One request's tools: the syntax, what the prompt gets, what the output must match, and
    how the text is read back. ``markers``: the syntax's markers that the vocabulary holds as
    single special tokens (text -> token id), which the grammar writes as those tokens and the
    output keeps as their text. ``answer``: the model must answer now, without calling
    (``after``)."""

    syntax: Syntax
    tools: tuple[Tool, ...]
    choice: ToolChoice
    parallel: bool = True
    markers: Mapping[str, int] = field(default_factory=dict)
    answer: bool = False

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
            if self.answer and isinstance(self.syntax, Generic):
                return checked(Grammar("lark", self.syntax.answer_grammar()))
            return checked(
                Grammar("lark", self.syntax.grammar(self.tools, self.choice, self.parallel, lit))
            )
        except UsageError as err:
            raise UsageError(f"the tools' schemas give no usable grammar: {err}") from err

    def after(self, messages: Sequence[Mapping[str, Any]]) -> ToolPlan:
        """This plan for the answer that follows ``messages``. Under ``auto``, with a template
        without tools: when the last turn of calls repeats an earlier turn word for word and
        got the same results, the model is looping (a third call can tell it nothing new), so
        it is told to answer and its grammar allows only an answer. With a fixed seed the same
        prompt would give the same call every turn, past any turn limit."""
        if self.syntax.native or not self.active or self.choice.mode != "auto":
            return self
        _, repeated = _once(*self._rendered(messages))
        return replace(self, answer=True) if repeated else self

    def messages(self, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The conversation as the chat template takes it: tool calls with their arguments as
        objects and a null content as "". A template without tools (the generic form) gets them
        described in the system message, calls written as the JSON the model answers with, and
        results as the user's turn (one turn for results in a row); a turn of calls that repeats
        an earlier one and got the same results is shown once (``_once``)."""
        if self.syntax.native:
            out = [_for_template(m, {}) for m in messages]
        else:
            out, _ = _once(*self._rendered(messages))
        if self.active and isinstance(self.syntax, Generic):
            if self.answer:
                text = self.syntax.answer_instructions(self.tools)
            else:
                text = self.syntax.instructions(self.tools, self.choice)
            if out and out[0]["role"] == "system":
                out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{text}"}
            else:
                out.insert(0, {"role": "system", "content": text})
        return out

    def _rendered(
        self, messages: Sequence[Mapping[str, Any]]
    ) -> tuple[list[dict[str, Any]], list[bool]]:
        """The conversation for a template without tools (``_as_text``), with whether each
        message holds tool results."""
        out: list[dict[str, Any]] = []
        results: list[bool] = []
        names: dict[str, str] = {}  # a call's id -> its function's name
        for message in messages:
            item = _for_template(message, names)
            result = item.get("role") == "tool"
            item = _as_text(item, names)
            if result and results and results[-1]:
                out[-1]["content"] += "\n" + item["content"]
                continue
            out.append(item)
            results.append(result)
        return out, results

    def parse(self, text: str, cut: bool = False) -> tuple[str | None, list[ToolCall]]:
        """The final text's content (None when it is only calls) and its calls, with new ids:
        the finished calls up to any repeat of an earlier one (``kept_calls``; ``cut``: the
        answer was cut short, so a call still being written is dropped)."""
        if not self.active:
            return text, []
        parsed = self.syntax.parse(text, self.tools, final=not cut)
        kept, _ = kept_calls(parsed.calls)
        calls = [ToolCall(new_call_id(), c.name or "", c.arguments or "") for c in kept]
        content = parsed.content if parsed.content.strip() or not calls else None
        return content, calls

    def stream(self) -> ToolStream:
        return ToolStream(self.syntax, self.tools)


def _once(out: list[dict[str, Any]], results: list[bool]) -> tuple[list[dict[str, Any]], bool]:
    """The conversation less each turn of calls, with its results, that repeats an earlier turn
    and its results word for word: it told nothing new, and a small model that sees itself
    call twice calls again (``benchmarks/tool_results.py``: the SmolLM2 demo pair answered 25
    times in 30 after one call and its result, 0 in 30 after the same call and result twice).
    A call whose result changed (polling) is kept. Also: whether the last turn of calls was
    such a repeat."""
    seen: set[tuple[str, str]] = set()
    kept: list[dict[str, Any]] = []
    repeated = False
    i = 0
    while i < len(out):
        if out[i]["role"] == "assistant" and i + 1 < len(out) and results[i + 1]:
            turn = (out[i]["content"], out[i + 1]["content"])
            repeated = turn in seen
            if not repeated:
                seen.add(turn)
                kept.extend(out[i : i + 2])
            i += 2
            continue
        kept.append(out[i])
        i += 1
    return kept, repeated


def _for_template(message: Mapping[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """A message as a template takes it: a null content as "", tool calls' arguments as
    objects (their ids and functions' names noted in ``names``)."""
    item = dict(message)
    if item.get("content") is None:
        item["content"] = ""
    if item.get("tool_calls"):
        item["tool_calls"] = [_call_for_template(c) for c in item["tool_calls"]]
        names.update(_names_of(item["tool_calls"]))
    return item


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


def _names_of(calls: list[Any]) -> dict[str, str]:
    """Each call's id -> its function's name (what a result names when it comes back)."""
    return {
        c["id"]: c["function"]["name"]
        for c in calls
        if isinstance(c, dict)
        and isinstance(c.get("id"), str)
        and isinstance(c.get("function"), dict)
        and isinstance(c["function"].get("name"), str)
    }


def _as_text(item: dict[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
    """A message for a template without tools: calls as the generic JSON, results as user text
    named by their function (a client's call id means nothing to the model)."""
    if item.get("role") == "tool":
        called = names.get(item.get("tool_call_id") or "")
        name = item.get("name") or called or item.get("tool_call_id") or "the tool"
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
