"""The FastAPI app: the OpenAI endpoints over one loaded pair, health, models and metrics.

Errors are OpenAI-style objects with the error table's HTTP status, never a 500 for a request's
own mistakes. A chat that goes on reuses the cached prefix of the last request in both models'
caches. A streaming client that goes away cancels its generation at the next cycle; a
non-streaming one is checked for while it waits.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from specgen.engine import DEFAULT_MAX_TOKENS, TextChunk, TokenLogprob
from specgen.errors import UsageError
from specgen.server import openai
from specgen.server.guard import Guard
from specgen.server.metrics import Metrics
from specgen.server.openai import (
    DONE,
    ApiError,
    ChatRequest,
    CompletionRequest,
    SamplingRequest,
    as_api_error,
    error_response,
    event,
)
from specgen.server.queue import GenerationQueue, Generator, Job, SlotQueue
from specgen.session.generate import Prompt, Result
from specgen.stats import Stats
from specgen.structured.tools import Delta, ToolCall, ToolPlan

MAX_BODY = 1 << 20
# How often a non-streaming request looks for its client having gone away.
DISCONNECT_CHECK_SECONDS = 0.2


SHUT_DOWN = "the server shut down before the answer ended; send the request again"


def access_line(
    method: str,
    path: str,
    status: int,
    what: str,
    stats: Stats | None = None,
    seconds: float | None = None,
) -> str:
    """One request on the console: status, tokens, speed and acceptance (or what failed)."""
    parts = [f"{method} {path}", str(status)]
    if stats is not None:
        parts.append(f"{stats.n_prompt} prompt + {stats.n_generated} new tokens")
        if stats.tokens_per_second is not None:
            parts.append(f"{stats.tokens_per_second:.1f} tok/s")
        if stats.speculative and stats.accept_rate is not None:
            parts.append(f"accept {stats.accept_rate * 100:.0f}%")
        if stats.stop_reason:
            parts.append(f"stop: {stats.stop_reason}")
    if what and what != "stream":
        parts.append(what)
    if seconds is not None:
        parts.append(f"{seconds:.2f}s")
    return "  ".join(parts)


def create_app(
    generator: Generator,
    *,
    api_key: str | None = None,
    max_queue: int = 8,
    max_body: int = MAX_BODY,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    parallel: int = 1,
    n_ctx: int | None = None,
    max_tokens_limit: int | None = None,
    access_log: Callable[[str], None] | None = None,
    balance: bool = True,
) -> FastAPI:
    """The FastAPI app over a loaded pair; ``parallel`` > 1 (a pair loaded with that many
    sequences) serves that many requests side by side. A request's ``max_tokens`` past the
    context (``n_ctx``) is refused, past ``max_tokens_limit`` lowered to it; ``access_log``
    gets one line per request; ``balance``: requests sent together end together
    (``SlotQueue``)."""
    app = FastAPI(title="specgen", docs_url=None, redoc_url=None)
    metrics = Metrics()
    queue: GenerationQueue | SlotQueue = (
        SlotQueue(generator, max_queue, balance)
        if parallel > 1
        else GenerationQueue(generator, max_queue)
    )
    app.state.queue, app.state.metrics = queue, metrics
    model_id = generator.name

    app.add_middleware(Guard, api_key=api_key, max_body=max_body, metrics=metrics)

    def logged(request: Request, status: int, what: str, stats: Stats | None = None) -> None:
        if access_log is not None:
            started = getattr(request.state, "started", None)
            took = time.monotonic() - started if started is not None else None
            access_log(access_line(request.method, request.url.path, status, what, stats, took))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0] if err.errors() else {}
        if first.get("type") == "json_invalid":
            message = f"the body is not valid JSON: {first.get('msg', '')}"
            logged(request, 400, message)
            return error_response(400, message, code="invalid_json")
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        logged(request, 422, f"{where}: {first.get('msg', 'invalid')}")
        return error_response(422, f"{where}: {first.get('msg', 'invalid')}", code="invalid_value")

    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError) -> JSONResponse:
        logged(request, err.status, err.message)
        return error_response(err.status, err.message, err.kind, err.code, err.headers)

    @app.get("/health")
    async def health() -> dict[str, object]:
        return {
            "status": "ok",
            "model": model_id,
            "waiting": queue.waiting,
            "slots": {"total": queue.size, "busy": queue.busy, "waiting": queue.waiting},
        }

    @app.get("/v1/models")
    async def models() -> dict[str, object]:
        return {
            "object": "list",
            "data": [{"id": model_id, "object": "model", "created": 0, "owned_by": "specgen"}],
        }

    @app.get("/metrics")
    async def prometheus() -> Response:
        metrics.queue.set(queue.waiting)
        metrics.slots_busy.set(queue.busy)
        if isinstance(queue, SlotQueue):
            metrics.batches(queue.slots.streams.stats)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def respond(
        request: Request,
        body: SamplingRequest,
        prompt: Prompt,
        chat: bool,
        plan: ToolPlan | None = None,
    ) -> Response:
        # /v1/completions sends the prompt as it is, as OpenAI's and llama.cpp's servers do
        request.state.started = time.monotonic()
        settings = body.settings(default_max_tokens)
        if n_ctx is not None and settings.max_tokens > n_ctx:
            raise ApiError(
                400,
                f"max_tokens {settings.max_tokens} is more than the context holds ({n_ctx} "
                f"tokens, the prompt's included): ask for at most {n_ctx}",
                code="context_length_exceeded",
            )
        if max_tokens_limit is not None and settings.max_tokens > max_tokens_limit:
            settings = replace(settings, max_tokens=max_tokens_limit)
        if plan is not None and plan.active:
            try:
                constraint = plan.grammar()
            except UsageError as err:
                raise ApiError(400, str(err), code="invalid_value") from err
            settings = replace(settings, grammar=constraint, keep_text=plan.keep_text())
        tools = plan.template_tools() if plan is not None else None
        job = Job(prompt, settings, threading.Event(), chat, tools)
        kind = "chat.completion" if chat else "text_completion"
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        events = queue.run(job)
        try:
            first = await anext(events)
        except StopAsyncIteration as err:  # pragma: no cover - a stream always ends with a Result
            raise ApiError(500, "no result", "server_error") from err
        except ApiError:
            raise
        except Exception as err:
            raise as_api_error(err) from err
        if body.stream:
            return StreamingResponse(
                _sse(
                    first,
                    events,
                    job,
                    ident,
                    model_id,
                    chat,
                    metrics,
                    plan,
                    queue.draining,
                    lambda stats, error: logged(request, 200, error or "stream", stats),
                ),
                media_type="text/event-stream",
            )
        # With tools, the text is read as it comes, so that a repeated call ends the answer.
        reader = plan.stream() if plan is not None and plan.active else None
        pieces, item, checked = [], first, time.monotonic()
        while not isinstance(item, Result):
            if reader is None:
                pieces.append(item.text)
            elif not reader.repeated:
                pieces.append(reader.feed(item.text).content)
                if reader.repeated:
                    job.cancelled.set()
            if time.monotonic() - checked > DISCONNECT_CHECK_SECONDS:
                checked = time.monotonic()
                if await request.is_disconnected():
                    job.cancelled.set()
            item = await anext(events)
        metrics.record(item.stats)
        if item.stats.stop_reason == "cancelled" and queue.draining.is_set():
            raise ApiError(503, SHUT_DOWN, "server_error", "server_shutdown")
        logged(request, 200, "", item.stats)
        calls: list[ToolCall] = []
        if reader is not None:
            pieces.append(reader.finish(cut=openai.was_cut(item.stats)).content)
            calls = reader.calls
        whole = "".join(pieces)
        text = None if calls and not whole.strip() else whole
        choice = openai.choice(
            chat,
            text,
            openai.finish_reason(item.stats, bool(calls), reader is not None and reader.repeated),
            openai.logprobs_of(chat, item.logprobs),
            calls,
        )
        return JSONResponse(
            {
                "id": ident,
                "object": kind,
                "created": int(time.time()),
                "model": model_id,
                "choices": [choice],
                "usage": openai.usage(item.stats),
                "timings": openai.timings(item.stats),
            }
        )

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, body: ChatRequest) -> Response:
        messages = [m.for_template() for m in body.messages]
        tools, choice = body.tool_request()
        plan = None
        if tools or any(m.role == "tool" or m.tool_calls for m in body.messages):
            plan = generator.tool_plan(tools, choice, body.parallel_tool_calls).after(messages)
            messages = plan.messages(messages)
        return await respond(request, body, messages, chat=True, plan=plan)

    @app.post("/v1/completions")
    async def completions(request: Request, body: CompletionRequest) -> Response:
        return await respond(request, body, body.text(), chat=False)

    return app


async def _sse(
    first: TextChunk | Result,
    events: AsyncIterator[TextChunk | Result],
    job: Job,
    ident: str,
    model: str,
    chat: bool,
    metrics: Metrics,
    plan: ToolPlan | None = None,
    draining: threading.Event | None = None,
    done: Callable[[Stats | None, str | None], None] | None = None,
) -> AsyncIterator[bytes]:
    """Server-sent events: one chunk per piece of text (with tools: content until a call
    begins, then the calls' deltas), a final chunk with the finish reason, usage and timings,
    then ``[DONE]``. A client that leaves cancels the generation. A stream cut by the server
    shutting down (``draining``) ends with an error event instead of a finish reason, so the
    client can tell a cut answer from a finished one. ``done`` hears how it ended."""
    created = int(time.time())
    chunk_kind = "chat.completion.chunk" if chat else "text_completion"

    def chunk(
        text: str | None,
        finish: str | None,
        extra: dict[str, object] | None = None,
        role: bool = False,
        logprobs: object = None,
        tool_calls: list[dict[str, object]] | None = None,
    ) -> bytes:
        return event(
            {
                "id": ident,
                "object": chunk_kind,
                "created": created,
                "model": model,
                "choices": [openai.chunk_choice(chat, text, finish, role, logprobs, tool_calls)],
                **(extra or {}),
            }
        )

    reader = plan.stream() if plan is not None and plan.active else None
    pending: list[TokenLogprob] = []  # held with the text a tool reader holds back

    def said(delta: Delta) -> bytes:
        nonlocal pending
        found = openai.logprobs_of(chat, pending) if pending else None
        pending = []
        return chunk(delta.content or None, None, logprobs=found, tool_calls=delta.tool_calls)

    item = first
    try:
        if chat:
            yield chunk(None, None, role=True)
        while not isinstance(item, Result):
            if reader is None:
                found = openai.logprobs_of(chat, item.logprobs) if item.logprobs else None
                yield chunk(item.text, None, logprobs=found)
            elif not reader.repeated:
                pending.extend(item.logprobs or ())
                delta = reader.feed(item.text)
                if delta.content or delta.tool_calls:
                    yield said(delta)
                if reader.repeated:  # the answer is over: stop generating
                    job.cancelled.set()
            item = await anext(events)
        if reader is not None:
            delta = reader.finish(cut=openai.was_cut(item.stats))
            if delta.content or delta.tool_calls or pending:
                yield said(delta)
    except Exception as err:  # an error after the stream started: say so in the stream
        error = as_api_error(err)
        if done is not None:
            done(None, error.message)
        yield event({"error": {"message": error.message, "type": error.kind}})
        yield DONE
        return
    finally:
        job.cancelled.set()  # the client went away (or the stream ended): stop generating
    metrics.record(item.stats)
    cut = item.stats.stop_reason == "cancelled" and draining is not None and draining.is_set()
    if done is not None:
        done(item.stats, SHUT_DOWN if cut else None)
    if cut:
        yield event(
            {"error": {"message": SHUT_DOWN, "type": "server_error", "code": "server_shutdown"}}
        )
        yield DONE
        return
    yield chunk(
        None if chat else "",
        openai.finish_reason(
            item.stats, bool(reader and reader.calls), reader is not None and reader.repeated
        ),
        {"usage": openai.usage(item.stats), "timings": openai.timings(item.stats)},
    )
    yield DONE
