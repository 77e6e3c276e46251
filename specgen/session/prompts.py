"""Prompts as users give them: an argument, a file, piped stdin, or a batch file of many.

Reading them (a file, ``-`` or piped stdin) and text handling, no models and no terminal:
escapes as llama.cpp processes them, the one trailing newline a file or ``echo`` adds, and batch
files (one prompt per line, or JSON lines with a ``prompt`` or ``messages`` and optional
per-prompt settings). A bad batch line becomes a ``BadLine`` with its number, never an
exception: the rest of the batch goes on.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specgen.core.penalties import REQUEST_FIELDS, penalties_from
from specgen.errors import UsageError
from specgen.structured import grammar
from specgen.structured.grammar import LogitBias

MAX_SEED = 2**32 - 1
CHAT_ROLES = ("system", "user", "assistant")

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'"}
_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|.)", re.DOTALL)


def unescape(text: str) -> str:
    """``\\n``, ``\\t``, ``\\r``, ``\\\\``, ``\\"``, ``\\'`` and ``\\xNN``, as llama.cpp's
    ``-e`` does; any other backslash is kept as it is."""

    def one(match: re.Match[str]) -> str:
        code = match.group(1)
        if code.startswith("x") and len(code) == 3:
            return chr(int(code[1:], 16))
        return _ESCAPES.get(code, match.group(0))

    return _ESCAPE.sub(one, text)


def strip_final_newline(text: str) -> str:
    """Drop the one newline a file or ``echo`` ends with, as llama.cpp's ``-f`` does."""
    if text.endswith("\r\n"):
        return text[:-2]
    return text[:-1] if text.endswith("\n") else text


def stdin_is_piped() -> bool:
    """Whether stdin is a pipe or a file (never a terminal, /dev/null or a closed stream)."""
    try:
        mode = stat.S_IFMT(os.fstat(sys.stdin.fileno()).st_mode)
    except (OSError, ValueError, AttributeError):
        return False
    return mode in (stat.S_IFIFO, stat.S_IFREG, stat.S_IFSOCK)


def read_file(file: Path) -> str:
    """A prompt file's text (``-``: stdin)."""
    if str(file) == "-":
        return sys.stdin.read()
    if file.is_dir():
        raise UsageError(f"{file} is a folder: give a text file to --file")
    return file.read_text(encoding="utf-8")


def combine(argument: str | None, piped: str | None) -> str | None:
    """The prompt argument, then the piped text on the next line (either may be missing)."""
    parts = [p for p in (argument, piped) if p]
    return "\n".join(parts) if parts else None


Message = dict[str, Any]  # role and content, and a tool call's fields


@dataclass(frozen=True)
class BatchPrompt:
    """One prompt of a batch, with the settings its line overrides (``max_tokens``, ...)."""

    id: int | str
    line: int
    prompt: str | None = None
    messages: tuple[Message, ...] | None = None
    system: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BadLine:
    """A batch line that cannot be run, and why (said with its line number)."""

    id: int | str
    line: int
    error: str


BatchItem = BatchPrompt | BadLine


def parse_lines(text: str) -> list[BatchItem]:
    """One prompt per non-blank line; the id is the line number."""
    return [
        BatchPrompt(id=number, line=number, prompt=line.rstrip("\r"))
        for number, line in enumerate(text.split("\n"), start=1)
        if line.strip()
    ]


def parse_jsonl(text: str) -> list[BatchItem]:
    """JSON lines: ``prompt`` or ``messages``, and optionally ``id``, ``system``,
    ``max_tokens``, ``temperature``, ``seed``, ``stop``, ``logprobs``, ``logit_bias``, the
    penalties (``repeat_penalty``, ``frequency_penalty``, ``presence_penalty``,
    ``repeat_last_n``), and what the output must match (``response_format``, ``json_schema``,
    ``grammar`` or ``format``); other fields are ignored."""
    items: list[BatchItem] = []
    for number, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            items.append(parse_record(line, number))
    return items


def parse_record(line: str, number: int) -> BatchItem:
    """One JSON line of a batch: a ``BatchPrompt``, or a ``BadLine`` saying what is wrong."""
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, RecursionError) as err:
        message = err.msg if isinstance(err, json.JSONDecodeError) else "nested too deeply"
        return BadLine(number, number, f"line {number}: not valid JSON ({message})")
    if not isinstance(record, dict):
        return BadLine(
            number, number, f'line {number}: expected a JSON object like {{"prompt": "..."}}'
        )
    raw_id = record.get("id", number)
    if isinstance(raw_id, bool) or not isinstance(raw_id, int | str):
        return BadLine(number, number, f"line {number}: 'id' must be a string or a number")
    try:
        return _prompt(record, raw_id, number)
    except ValueError as err:
        return BadLine(raw_id, number, f"line {number}: {err}")


def _prompt(record: dict[str, Any], id_: int | str, number: int) -> BatchPrompt:
    prompt, messages = record.get("prompt"), record.get("messages")
    if (prompt is None) == (messages is None):
        raise ValueError("give exactly one of 'prompt' (a string) or 'messages' (a list)")
    if prompt is not None and (not isinstance(prompt, str) or not prompt.strip()):
        raise ValueError("'prompt' must be a non-empty string")
    checked = None if messages is None else tuple(_messages(messages))
    system = record.get("system")
    if system is not None and not isinstance(system, str):
        raise ValueError("'system' must be a string")
    settings: dict[str, Any] = {}
    if "max_tokens" in record:
        settings["max_tokens"] = _whole(record["max_tokens"], "max_tokens", 1, None)
    if "seed" in record:
        settings["seed"] = _whole(record["seed"], "seed", 0, MAX_SEED)
    if "temperature" in record:
        value = record["temperature"]
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
            raise ValueError("'temperature' must be a number >= 0")
        settings["temperature"] = float(value)
    try:
        constraint = grammar.from_request(record)
    except UsageError as err:
        raise ValueError(str(err)) from err
    if constraint is not None:
        settings["grammar"] = constraint
    if "logprobs" in record:
        settings["logprobs"] = _whole(record["logprobs"], "logprobs", 0, 20)
    if "logit_bias" in record:
        bias = record["logit_bias"]
        if not isinstance(bias, dict):
            raise ValueError("'logit_bias' must be an object of token id: bias")
        settings["logit_bias"] = LogitBias.from_mapping(bias)
    asked = {name: record[name] for name in REQUEST_FIELDS if name in record}
    if asked:
        penalties_from(asked)  # said here, on its line; the run's own fill in the rest
        settings["penalties"] = asked
    if "stop" in record:
        stop = record["stop"]
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise ValueError("'stop' must be a string or a list of non-empty strings")
        settings["stop"] = tuple(stops)
    return BatchPrompt(id_, number, prompt, checked, system, settings)


def _messages(value: Any) -> list[Message]:
    if not isinstance(value, list) or not value:
        raise ValueError('\'messages\' must be a non-empty list of {"role", "content"}')
    out = []
    for message in value:
        if (
            not isinstance(message, dict)
            or message.get("role") not in CHAT_ROLES
            or not isinstance(message.get("content"), str)
        ):
            raise ValueError(
                f"each message needs a 'role' ({', '.join(CHAT_ROLES)}) and a 'content' string"
            )
        out.append({"role": message["role"], "content": message["content"]})
    return out


def _whole(value: Any, name: str, low: int, high: int | None) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        upper = f" and <= {high}" if high is not None else ""
        raise ValueError(f"'{name}' must be a whole number >= {low}{upper}")
    return value
