"""``specgen serve``: an OpenAI-compatible HTTP server over one loaded pair (FastAPI, uvicorn,
server-sent events, prometheus_client).

One generation runs at a time, on a worker thread; requests wait in a bounded queue (past the
bound: 503 with Retry-After). A streaming client that goes away cancels its generation at the
next cycle; a non-streaming one is checked for while it waits. Errors are OpenAI-style objects
with the error table's HTTP status, never a 500 for a request's own mistakes. A chat that goes
on reuses the cached prefix of the last request in both models' caches. Needs
``pip install 'specgen[server]'``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from pydantic import BaseModel, ConfigDict, Field, field_validator

from specgen.api import Settings, Specgen
from specgen.engine import DEFAULT_MAX_TOKENS
from specgen.errors import lookup
from specgen.prompts import MAX_SEED
from specgen.session import Result
from specgen.stats import Stats

MAX_BODY = 1 << 20
# How often a non-streaming request looks for its client having gone away.
DISCONNECT_CHECK_SECONDS = 0.2


# -- requests -----------------------------------------------------------------------------------

class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=Settings.temperature, ge=0.0, le=10.0)
    top_p: float = Field(default=Settings.top_p, gt=0.0, le=1.0)
    top_k: int = Field(default=Settings.top_k, ge=0)
    min_p: float = Field(default=Settings.min_p, ge=0.0, lt=1.0)
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    stop: str | list[str] | None = None
    stream: bool = False
    n: int = Field(default=1, ge=1, le=1)

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and (len(value) > 4 or not all(value)):
            raise ValueError("stop takes up to 4 non-empty strings")
        return value

    def settings(self, default_max: int) -> Settings:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return Settings(max_tokens=self.max_completion_tokens or self.max_tokens or default_max,
                        temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                        min_p=self.min_p, seed=self.seed, stop=stop)


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant"]
    content: str | list[dict[str, Any]]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.get("text", "") for part in self.content
                       if part.get("type") == "text")


class ChatRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)


class CompletionRequest(_Sampling):
    prompt: str | list[str]

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and len(value) != 1:
            raise ValueError("one prompt per request")
        return value

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


# -- errors ---------------------------------------------------------------------------------

class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.code = status, message, kind, code
        self.headers = headers or {}


def _error(status: int, message: str, kind: str = "invalid_request_error",
           code: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None,
                                   "code": code}}, status_code=status, headers=headers)


# -- metrics --------------------------------------------------------------------------------

class Metrics:
    """Counters named as vLLM and llama.cpp's server name theirs, in one registry per app."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.drafts = Counter("specgen_spec_decode_num_drafts", "Cycles that verified guesses",
                              registry=r)
        self.draft_tokens = Counter("specgen_spec_decode_num_draft_tokens",
                                    "Guesses drafted", registry=r)
        self.accepted_tokens = Counter("specgen_spec_decode_num_accepted_tokens",
                                       "Guesses the target accepted", registry=r)
        self.accepted_per_pos = Counter("specgen_spec_decode_num_accepted_tokens_per_pos",
                                        "Guesses accepted at each position of a cycle",
                                        ["position"], registry=r)
        self.prompt_tokens = Counter("specgen_prompt_tokens", "Prompt tokens", registry=r)
        self.prompt_tokens_cached = Counter("specgen_prompt_tokens_cached",
                                            "Prompt tokens reused from the cache", registry=r)
        self.generation_tokens = Counter("specgen_generation_tokens", "Generated tokens",
                                         registry=r)
        self.requests = Counter("specgen_requests", "Requests by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.latency = Histogram("specgen_request_latency_seconds", "Time to serve a request",
                                 ["endpoint"], registry=r)
        self.tokens_per_second = Gauge("specgen_predicted_tokens_seconds",
                                       "Generation speed of the last request (tokens/s)",
                                       registry=r)
        self.queue = Gauge("specgen_requests_waiting", "Requests waiting for the model",
                           registry=r)

    def record(self, stats: Stats) -> None:
        self.drafts.inc(_drafting_cycles(stats))
        self.draft_tokens.inc(stats.n_drafted)
        self.accepted_tokens.inc(stats.n_accepted)
        for position, accepted in enumerate(stats.accepted_at):
            self.accepted_per_pos.labels(position=str(position)).inc(accepted)
        self.prompt_tokens.inc(stats.n_prompt)
        self.prompt_tokens_cached.inc(stats.n_prompt_cached)
        self.generation_tokens.inc(stats.n_generated)
        if stats.tokens_per_second:
            self.tokens_per_second.set(stats.tokens_per_second)


def _drafting_cycles(stats: Stats) -> int:
    return sum(source.cycles for source in stats.by_source.values())


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
        "draft_n_accepted": stats.n_accepted,
    }


def usage(stats: Stats) -> dict[str, int]:
    return {"prompt_tokens": stats.n_prompt, "completion_tokens": stats.n_generated,
            "total_tokens": stats.n_prompt + stats.n_generated,
            "prompt_tokens_details": {"cached_tokens": stats.n_prompt_cached}}  # type: ignore[dict-item]


FINISH = {"eog": "stop", "stop": "stop", "max_tokens": "length", "context_full": "length",
          "cancelled": "stop", "interrupted": "stop"}


# -- the worker -------------------------------------------------------------------------------

@dataclass
class Job:
    prompt: str | list[dict[str, str]]
    settings: Settings
    cancelled: threading.Event
    chat: bool


class Worker:
    """Runs one generation at a time on its own thread; hands events to the event loop."""

    def __init__(self, generator: Specgen, max_queue: int) -> None:
        self.generator, self.max_queue = generator, max_queue
        self.lock = asyncio.Lock()
        self.waiting = 0
        self.draining = threading.Event()

    async def run(self, job: Job) -> AsyncIterator[object]:
        """Text pieces, then the Result; raises ApiError 503 when the queue is full.

        The lock is released by the worker thread itself when its generation has ended, so a
        request cancelled while its generation still runs never lets a second one start on the
        same models."""
        if self.lock.locked() and self.waiting >= self.max_queue:
            raise ApiError(503, f"the model is busy and {self.waiting} requests are waiting; "
                                f"retry shortly", "server_error", "busy", {"Retry-After": "1"})
        self.waiting += 1
        try:
            await self.lock.acquire()
        finally:
            self.waiting -= 1
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[object] = asyncio.Queue()
        done = object()

        def work() -> None:
            try:
                for item in self.generator.stream_events(
                        job.prompt, job.settings, reuse_prefix=True, chat=job.chat,
                        cancelled=lambda: job.cancelled.is_set() or self.draining.is_set()):
                    loop.call_soon_threadsafe(queue.put_nowait, item)
            except BaseException as err:  # handed to the request below
                loop.call_soon_threadsafe(queue.put_nowait, err)
            finally:  # in this order: whoever sees `done` finds the model free
                loop.call_soon_threadsafe(self.lock.release)
                loop.call_soon_threadsafe(queue.put_nowait, done)

        try:
            threading.Thread(target=work, name="specgen-generate", daemon=True).start()
        except BaseException:
            self.lock.release()
            raise
        try:
            result = None
            while (item := await queue.get()) is not done:
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, Result):
                    result = item  # handed on once the thread is done and the model free
                else:
                    yield item
            if result is not None:
                yield result
        finally:
            job.cancelled.set()  # a client gone, or an error: stop at the next cycle


# -- the app ----------------------------------------------------------------------------------

def create_app(generator: Specgen, *, api_key: str | None = None, max_queue: int = 8,
               max_body: int = MAX_BODY, default_max_tokens: int = DEFAULT_MAX_TOKENS
               ) -> FastAPI:
    """The FastAPI app over a loaded pair."""
    app = FastAPI(title="specgen", docs_url=None, redoc_url=None)
    metrics = Metrics()
    worker = Worker(generator, max_queue)
    app.state.worker, app.state.metrics = worker, metrics
    model_id = generator.name

    app.add_middleware(_Guard, api_key=api_key, max_body=max_body, metrics=metrics)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0] if err.errors() else {}
        if first.get("type") == "json_invalid":
            return _error(400, f"the body is not valid JSON: {first.get('msg', '')}",
                          code="invalid_json")
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return _error(422, f"{where}: {first.get('msg', 'invalid')}", code="invalid_value")

    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError) -> JSONResponse:
        return _error(err.status, err.message, err.kind, err.code, err.headers)

    @app.get("/health")
    async def health() -> dict[str, object]:
        return {"status": "ok", "model": model_id, "waiting": worker.waiting}

    @app.get("/v1/models")
    async def models() -> dict[str, object]:
        return {"object": "list", "data": [{"id": model_id, "object": "model",
                                            "created": 0, "owned_by": "specgen"}]}

    @app.get("/metrics")
    async def prometheus() -> Response:
        metrics.queue.set(worker.waiting)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def respond(request: Request, body: _Sampling, prompt: Any, chat: bool) -> Response:
        # /v1/completions sends the prompt as it is, as OpenAI's and llama.cpp's servers do
        job = Job(prompt, body.settings(default_max_tokens), threading.Event(), chat)
        kind = "chat.completion" if chat else "text_completion"
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        events = worker.run(job)
        try:
            first = await anext(events)
        except StopAsyncIteration as err:  # pragma: no cover - a stream always ends with a Result
            raise ApiError(500, "no result", "server_error") from err
        except ApiError:
            raise
        except Exception as err:
            raise _as_api_error(err) from err
        if body.stream:
            return StreamingResponse(_sse(first, events, job, ident, model_id, chat, metrics),
                                     media_type="text/event-stream")
        pieces, item, checked = [], first, time.monotonic()
        while not isinstance(item, Result):
            pieces.append(item.text)  # type: ignore[attr-defined]
            if time.monotonic() - checked > DISCONNECT_CHECK_SECONDS:
                checked = time.monotonic()
                if await request.is_disconnected():
                    job.cancelled.set()
            item = await anext(events)
        metrics.record(item.stats)
        text = "".join(pieces)
        choice: dict[str, object] = {"index": 0, "finish_reason": FINISH.get(
            item.stats.stop_reason or "", "stop"), "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return JSONResponse({"id": ident, "object": kind, "created": int(time.time()),
                             "model": model_id, "choices": [choice],
                             "usage": usage(item.stats), "timings": timings(item.stats)})

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, body: ChatRequest) -> Response:
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        return await respond(request, body, messages, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request, body: CompletionRequest) -> Response:
        return await respond(request, body, body.text(), chat=False)

    return app


class _Guard:
    """Plain ASGI middleware: the API key, the body size bound, request counts and latency.
    (Starlette's BaseHTTPMiddleware would wrap ``receive`` and hide a client's disconnect
    from the endpoint, which cancels a non-streaming generation on it.)"""

    def __init__(self, app: Any, api_key: str | None, max_body: int, metrics: Metrics) -> None:
        self.app, self.api_key, self.max_body, self.metrics = app, api_key, max_body, metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started, path = time.perf_counter(), scope["path"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        status = {"code": 500}

        async def send_and_note(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            if self.api_key and path.startswith("/v1/") and \
                    headers.get("authorization") != f"Bearer {self.api_key}":
                await _error(401, "missing or wrong API key: send Authorization: Bearer KEY",
                             code="invalid_api_key")(scope, receive, send_and_note)
            elif int(headers.get("content-length") or 0) > self.max_body or (
                    "content-length" not in headers
                    and (receive := await self._buffered(receive)) is None):
                await _error(413, f"the request body is over {self.max_body} bytes",
                             code="request_too_large")(scope, receive, send_and_note)
            else:
                await self.app(scope, receive, send_and_note)
        finally:
            self.metrics.requests.labels(endpoint=path, status=str(status["code"])).inc()
            self.metrics.latency.labels(endpoint=path).observe(time.perf_counter() - started)


    async def _buffered(self, receive: Any) -> Any:
        """For a body sent without Content-Length (chunked): read it up to the bound, then
        hand it on whole (and later messages, such as a disconnect, as they come); None when
        it is over the bound."""
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                break
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_body:
                return None
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return replay


def _as_api_error(err: Exception) -> ApiError:
    entry = lookup(err)
    if entry is None:
        return ApiError(500, f"internal error: {type(err).__name__}: {err}", "server_error")
    return ApiError(entry.http_status, entry.message(err),
                    "invalid_request_error" if entry.http_status < 500 else "server_error")


async def _sse(first: object, events: AsyncIterator[object], job: Job, ident: str,
               model: str, chat: bool, metrics: Metrics) -> AsyncIterator[bytes]:
    """Server-sent events: one chunk per piece of text, a final chunk with the finish reason,
    usage and timings, then ``[DONE]``. A client that leaves cancels the generation."""
    created = int(time.time())
    chunk_kind = "chat.completion.chunk" if chat else "text_completion"

    def chunk(text: str | None, finish: str | None, extra: dict[str, object] | None = None,
              role: bool = False) -> bytes:
        if chat:
            delta: dict[str, object] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice: dict[str, object] = {"index": 0, "delta": delta, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish}
        payload = {"id": ident, "object": chunk_kind, "created": created, "model": model,
                   "choices": [choice], **(extra or {})}
        return f"data: {json.dumps(payload)}\n\n".encode()

    item = first
    try:
        if chat:
            yield chunk(None, None, role=True)
        while not isinstance(item, Result):
            yield chunk(item.text, None)  # type: ignore[attr-defined]
            item = await anext(events)
    except Exception as err:  # an error after the stream started: say so in the stream
        error = _as_api_error(err)
        payload = {"error": {"message": error.message, "type": error.kind}}
        yield f"data: {json.dumps(payload)}\n\n".encode()
        yield b"data: [DONE]\n\n"
        return
    finally:
        job.cancelled.set()  # the client went away (or the stream ended): stop generating
    metrics.record(item.stats)
    finish = FINISH.get(item.stats.stop_reason or "", "stop")
    yield chunk(None if chat else "", finish, {"usage": usage(item.stats),
                                               "timings": timings(item.stats)})
    yield b"data: [DONE]\n\n"
