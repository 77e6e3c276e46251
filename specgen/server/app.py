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
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from specgen.engine import DEFAULT_MAX_TOKENS, TextChunk
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
from specgen.server.queue import GenerationQueue, Generator, Job
from specgen.session import Prompt, Result

MAX_BODY = 1 << 20
# How often a non-streaming request looks for its client having gone away.
DISCONNECT_CHECK_SECONDS = 0.2


def create_app(
    generator: Generator,
    *,
    api_key: str | None = None,
    max_queue: int = 8,
    max_body: int = MAX_BODY,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
) -> FastAPI:
    """The FastAPI app over a loaded pair."""
    app = FastAPI(title="specgen", docs_url=None, redoc_url=None)
    metrics = Metrics()
    queue = GenerationQueue(generator, max_queue)
    app.state.queue, app.state.metrics = queue, metrics
    model_id = generator.name

    app.add_middleware(Guard, api_key=api_key, max_body=max_body, metrics=metrics)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0] if err.errors() else {}
        if first.get("type") == "json_invalid":
            return error_response(
                400, f"the body is not valid JSON: {first.get('msg', '')}", code="invalid_json"
            )
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return error_response(422, f"{where}: {first.get('msg', 'invalid')}", code="invalid_value")

    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError) -> JSONResponse:
        return error_response(err.status, err.message, err.kind, err.code, err.headers)

    @app.get("/health")
    async def health() -> dict[str, object]:
        return {"status": "ok", "model": model_id, "waiting": queue.waiting}

    @app.get("/v1/models")
    async def models() -> dict[str, object]:
        return {
            "object": "list",
            "data": [{"id": model_id, "object": "model", "created": 0, "owned_by": "specgen"}],
        }

    @app.get("/metrics")
    async def prometheus() -> Response:
        metrics.queue.set(queue.waiting)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def respond(
        request: Request, body: SamplingRequest, prompt: Prompt, chat: bool
    ) -> Response:
        # /v1/completions sends the prompt as it is, as OpenAI's and llama.cpp's servers do
        job = Job(prompt, body.settings(default_max_tokens), threading.Event(), chat)
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
                _sse(first, events, job, ident, model_id, chat, metrics),
                media_type="text/event-stream",
            )
        pieces, item, checked = [], first, time.monotonic()
        while not isinstance(item, Result):
            pieces.append(item.text)
            if time.monotonic() - checked > DISCONNECT_CHECK_SECONDS:
                checked = time.monotonic()
                if await request.is_disconnected():
                    job.cancelled.set()
            item = await anext(events)
        metrics.record(item.stats)
        choice = openai.choice(
            chat,
            "".join(pieces),
            openai.finish_reason(item.stats),
            openai.logprobs_of(chat, item.logprobs),
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
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        return await respond(request, body, messages, chat=True)

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
) -> AsyncIterator[bytes]:
    """Server-sent events: one chunk per piece of text, a final chunk with the finish reason,
    usage and timings, then ``[DONE]``. A client that leaves cancels the generation."""
    created = int(time.time())
    chunk_kind = "chat.completion.chunk" if chat else "text_completion"

    def chunk(
        text: str | None,
        finish: str | None,
        extra: dict[str, object] | None = None,
        role: bool = False,
        logprobs: object = None,
    ) -> bytes:
        return event(
            {
                "id": ident,
                "object": chunk_kind,
                "created": created,
                "model": model,
                "choices": [openai.chunk_choice(chat, text, finish, role, logprobs)],
                **(extra or {}),
            }
        )

    item = first
    try:
        if chat:
            yield chunk(None, None, role=True)
        while not isinstance(item, Result):
            found = openai.logprobs_of(chat, item.logprobs) if item.logprobs else None
            yield chunk(item.text, None, logprobs=found)
            item = await anext(events)
    except Exception as err:  # an error after the stream started: say so in the stream
        error = as_api_error(err)
        yield event({"error": {"message": error.message, "type": error.kind}})
        yield DONE
        return
    finally:
        job.cancelled.set()  # the client went away (or the stream ended): stop generating
    metrics.record(item.stats)
    yield chunk(
        None if chat else "",
        openai.finish_reason(item.stats),
        {"usage": openai.usage(item.stats), "timings": openai.timings(item.stats)},
    )
    yield DONE
