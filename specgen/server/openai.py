"""The OpenAI shapes the server speaks: requests (validated by pydantic), the choices and
chunks of responses, usage and llama.cpp-server-style timings, and error objects."""

from __future__ import annotations

import json
from typing import Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from specgen.api import Settings
from specgen.core.penalties import REQUEST_FIELDS, penalties_from
from specgen.core.sampling import DEFAULT_SAMPLING, SamplingParams
from specgen.engine import MAX_TOP_LOGPROBS, TokenLogprob
from specgen.errors import UsageError, lookup
from specgen.session.prompts import MAX_SEED
from specgen.stats import Stats, StopReason
from specgen.structured import grammar as grammars
from specgen.structured.grammar import LogitBias
from specgen.structured.tools import (
    Tool,
    ToolCall,
    ToolChoice,
    choice_from_request,
    tools_from_request,
)

# How a generation's stop reason reads as an OpenAI finish_reason.
FINISH: dict[StopReason, str] = {
    "eog": "stop",
    "stop": "stop",
    "max_tokens": "length",
    "context_full": "length",
    "cancelled": "stop",
    "interrupted": "stop",
}


# -- requests -----------------------------------------------------------------------------------


# Request fields that would change the output and that specgen does not do yet: a request
# that sets one (to other than its neutral value) gets a 400 that names it, never an answer
# that quietly ignores it.
UNSUPPORTED: dict[str, tuple[object, ...]] = {
    "functions": (None, []),
    "function_call": (None, "none", "auto"),
    "best_of": (None, 1),
    "echo": (None, False),
    "suffix": (None, ""),
    "mirostat": (None, 0),
}


class SamplingRequest(BaseModel):
    """The fields both endpoints take. Others that would change the output are refused
    (``UNSUPPORTED``); the rest (``user``, ``metadata``, ...) are ignored."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=DEFAULT_SAMPLING.temperature, ge=0.0, le=10.0)
    top_p: float = Field(default=DEFAULT_SAMPLING.top_p, gt=0.0, le=1.0)
    top_k: int = Field(default=DEFAULT_SAMPLING.top_k, ge=0)
    min_p: float = Field(default=DEFAULT_SAMPLING.min_p, ge=0.0, lt=1.0)
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    stop: str | list[str] | None = None
    stream: bool = False
    n: int = Field(default=1, ge=1, le=1)
    # What the output must match (``specgen.structured.grammar.from_request``): OpenAI's, and
    # llama-server's json_schema and grammar, and Ollama's format.
    response_format: dict[str, Any] | None = None
    json_schema: dict[str, Any] | None = None
    grammar: str | None = None
    format: str | None = None
    logit_bias: dict[str, float] | None = None  # token id -> bias, -100..100
    # llama.cpp's penalties (``core.penalties``): OpenAI's two, and llama-server's two more.
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repeat_penalty: float | None = Field(default=None, gt=0.0, allow_inf_nan=False)
    repeat_last_n: int | None = Field(default=None, ge=-1)
    # Chat: a bool, with top_logprobs alternatives; completions: the number of alternatives.
    logprobs: bool | int | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)

    def wanted_logprobs(self) -> int | None:
        """How many alternatives each token's log-probability comes with (None: none)."""
        if self.logprobs is None or self.logprobs is False:
            if self.top_logprobs:
                raise ApiError(400, "top_logprobs needs logprobs: true", code="invalid_value")
            return None
        if self.logprobs is True:
            return self.top_logprobs or 0
        if not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ApiError(
                400, f"logprobs must be from 0 to {MAX_TOP_LOGPROBS}", code="invalid_value"
            )
        return int(self.logprobs)

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and (len(value) > 4 or not all(value)):
            raise ValueError("stop takes up to 4 non-empty strings")
        return value

    def settings(self, default_max: int) -> Settings:
        for name, value in (self.model_extra or {}).items():
            if name in UNSUPPORTED and value not in UNSUPPORTED[name]:
                raise ApiError(
                    400,
                    f"{name}: not supported by specgen yet (it would change the output); "
                    f"drop it from the request",
                    code="unsupported_parameter",
                )
        try:
            constraint = grammars.from_request(
                {
                    "response_format": self.response_format,
                    "json_schema": self.json_schema,
                    "grammar": self.grammar,
                    "format": self.format,
                }
            )
        except UsageError as err:
            raise ApiError(400, str(err), code="invalid_value") from err
        try:
            bias = LogitBias.from_mapping(self.logit_bias) if self.logit_bias else None
        except ValueError as err:
            raise ApiError(400, str(err), code="invalid_value") from err
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        asked = {name: getattr(self, name) for name in REQUEST_FIELDS}
        try:
            penalties = penalties_from(asked)
        except ValueError as err:
            raise ApiError(400, str(err), code="invalid_value") from err
        return Settings(
            grammar=constraint,
            logit_bias=bias,
            penalties=penalties,
            logprobs=self.wanted_logprobs(),
            max_tokens=self.max_completion_tokens or self.max_tokens or default_max,
            sampling=SamplingParams(self.temperature, self.top_k, self.top_p, self.min_p),
            seed=self.seed,
            stop=stop,
        )


class CalledFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str
    arguments: str | dict[str, Any] = "{}"  # OpenAI's JSON text (an object is taken too)


class AssistantToolCall(BaseModel):
    """A call in the history, as the answer that made it gave it."""

    model_config = ConfigDict(extra="ignore")

    id: str | None = None
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[AssistantToolCall] | None = None  # an assistant's calls
    tool_call_id: str | None = None  # a tool's result: the call it answers
    name: str | None = None

    @model_validator(mode="after")
    def _has_content(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs a 'content'")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.get("text", "") for part in self.content if part.get("type") == "text")

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates read it (``developer`` is the system's role)."""
        out: dict[str, Any] = {
            "role": "system" if self.role == "developer" else self.role,
            "content": self.text(),
        }
        if self.tool_calls:
            out["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


class ChatRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True

    def tool_request(self) -> tuple[tuple[Tool, ...], ToolChoice]:
        """The request's tools and choice; a 400 on a malformed one, or on tools asked for
        together with another constraint on the output."""
        try:
            tools = tools_from_request(self.tools or [])
            choice = choice_from_request(self.tool_choice, tools)
        except UsageError as err:
            raise ApiError(400, str(err), code="invalid_value") from err
        if choice.mode != "none" and tools:
            given = [
                k
                for k in ("response_format", "json_schema", "grammar", "format")
                if getattr(self, k)
            ]
            if given and not (given == ["response_format"] and _is_text(self.response_format)):
                raise ApiError(
                    400,
                    f"give either 'tools' or {given[0]!r}, not both (a tool call has its own "
                    f"grammar); or set tool_choice to 'none'",
                    code="invalid_value",
                )
        return tools, choice


def _is_text(response_format: dict[str, Any] | None) -> bool:
    return isinstance(response_format, dict) and response_format.get("type") == "text"


class CompletionRequest(SamplingRequest):
    prompt: str | list[str]

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and len(value) != 1:
            raise ValueError("one prompt per request")
        return value

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


# -- responses ----------------------------------------------------------------------------------


def logprobs_of(chat: bool, found: list[TokenLogprob] | tuple[TokenLogprob, ...] | None) -> object:
    """OpenAI's ``logprobs`` of a choice: a chat's ``content`` list, or a completion's
    ``tokens`` / ``token_logprobs`` / ``top_logprobs`` / ``text_offset``."""
    if found is None:
        return None
    if chat:

        def entry(text: bytes, logprob: float) -> dict[str, object]:
            return {
                "token": text.decode("utf-8", "replace"),
                "logprob": logprob,
                "bytes": list(text),
            }

        return {
            "content": [
                {**entry(f.piece, f.logprob), "top_logprobs": [entry(p, lp) for _, lp, p in f.top]}
                for f in found
            ],
            "refusal": None,
        }
    offsets, at = [], 0
    for f in found:
        offsets.append(at)
        at += len(f.piece.decode("utf-8", "replace"))
    return {
        "tokens": [f.piece.decode("utf-8", "replace") for f in found],
        "token_logprobs": [f.logprob for f in found],
        "top_logprobs": [{p.decode("utf-8", "replace"): lp for _, lp, p in f.top} for f in found],
        "text_offset": offsets,
    }


def choice(
    chat: bool,
    text: str | None,
    finish: str | None,
    logprobs: object = None,
    tool_calls: list[ToolCall] | None = None,
) -> dict[str, object]:
    """The one choice of a whole response (a chat's with its tool calls, if any)."""
    out: dict[str, object] = {"index": 0, "finish_reason": finish, "logprobs": logprobs}
    if chat:
        message: dict[str, object] = {"role": "assistant", "content": text}
        if tool_calls:
            message["tool_calls"] = [call.as_openai() for call in tool_calls]
        out["message"] = message
    else:
        out["text"] = text
    return out


def chunk_choice(
    chat: bool,
    text: str | None,
    finish: str | None,
    role: bool = False,
    logprobs: object = None,
    tool_calls: list[dict[str, Any]] | None = None,
) -> dict[str, object]:
    """The one choice of a streamed chunk: a chat's text is a delta (``role`` on the first);
    ``logprobs`` those of the tokens the text came from; ``tool_calls`` OpenAI's deltas."""
    if not chat:
        return {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": logprobs}
    delta: dict[str, object] = {"role": "assistant"} if role else {}
    if text is not None:
        delta["content"] = text
    if tool_calls:
        delta["tool_calls"] = tool_calls
    return {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}


def finish_reason(stats: Stats, called: bool = False, repeated: bool = False) -> str:
    """OpenAI's finish_reason: ``tool_calls`` when the answer ended with calls in it (or was
    ended by a call that repeated one of them), ``length`` when it was cut short (calls that
    were whole come with it; one still being written is dropped)."""
    if called and repeated:
        return "tool_calls"
    reason = FINISH[stats.stop_reason] if stats.stop_reason else "stop"
    return "tool_calls" if called and reason == "stop" else reason


def was_cut(stats: Stats) -> bool:
    """Whether the answer was cut short, by ``max_tokens`` or a full context."""
    return FINISH.get(stats.stop_reason or "eog") == "length"


def usage(stats: Stats) -> dict[str, object]:
    return {
        "prompt_tokens": stats.n_prompt,
        "completion_tokens": stats.n_generated,
        "total_tokens": stats.n_prompt + stats.n_generated,
        "prompt_tokens_details": {"cached_tokens": stats.n_prompt_cached},
    }


def timings(stats: Stats) -> dict[str, object]:
    """llama.cpp's server ``timings``, with specgen's drafting figures."""
    decoded = stats.n_prompt - stats.n_prompt_cached
    prompt_ms, predicted_ms = stats.prompt_seconds * 1000, stats.elapsed() * 1000
    return {
        "cache_n": stats.n_prompt_cached,
        "prompt_n": decoded,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / decoded if decoded else None,
        "prompt_per_second": decoded / stats.prompt_seconds if stats.prompt_seconds else None,
        "predicted_n": stats.n_generated,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / stats.n_generated if stats.n_generated else None,
        "predicted_per_second": stats.tokens_per_second,
        "draft_n": stats.n_drafted,
        # specgen's: how sampled tokens were tied to the guesses (None: greedy)
        "coupling": stats.coupling,
        "draft_n_accepted": stats.n_accepted,
        # specgen's: the loop's own host time outside the models' decodes (None: not known)
        "host_ms": None if stats.host_seconds is None else stats.host_seconds * 1000,
        # specgen's: the guesses by where they came from (the cache's apart from the text's own)
        "drafters": {
            name: {"drafted": source.drafted, "accepted": source.accepted}
            for name, source in stats.by_source.items()
        },
    }


def event(payload: object) -> bytes:
    """One server-sent event."""
    return f"data: {json.dumps(payload)}\n\n".encode()


DONE = b"data: [DONE]\n\n"


# -- errors ---------------------------------------------------------------------------------


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.code = status, message, kind, code
        self.headers = headers or {}


def error_response(
    status: int,
    message: str,
    kind: str = "invalid_request_error",
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": None, "code": code}},
        status_code=status,
        headers=headers,
    )


def as_api_error(err: Exception) -> ApiError:
    """The error table's status and message for an error a request caused (500 for a bug)."""
    entry = lookup(err)
    if entry is None:
        return ApiError(500, f"internal error: {type(err).__name__}: {err}", "server_error")
    return ApiError(
        entry.http_status,
        entry.message(err),
        "invalid_request_error" if entry.http_status < 500 else "server_error",
    )
