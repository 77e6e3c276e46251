"""The server's front door: the API key, the bound on a request's body, request counts."""

from __future__ import annotations

import time
from collections.abc import MutableMapping
from typing import Any

from specgen.server.metrics import Metrics
from specgen.server.openai import error_response


class Guard:
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

        async def send_and_note(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            if (
                self.api_key
                and path.startswith("/v1/")
                and headers.get("authorization") != f"Bearer {self.api_key}"
            ):
                await error_response(
                    401,
                    "missing or wrong API key: send Authorization: Bearer KEY",
                    code="invalid_api_key",
                )(scope, receive, send_and_note)
            elif int(headers.get("content-length") or 0) > self.max_body or (
                "content-length" not in headers
                and (receive := await self._buffered(receive)) is None
            ):
                await error_response(
                    413, f"the request body is over {self.max_body} bytes", code="request_too_large"
                )(scope, receive, send_and_note)
            else:
                await self.app(_as_json(scope, headers), receive, send_and_note)
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


def _as_json(scope: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    """A POST to the API without a JSON content type (``curl -d`` sends a form's) is read as
    JSON, as llama-server and OpenAI's API read it: the body is all the API takes."""
    kind = headers.get("content-type", "")
    if scope["method"] != "POST" or not scope["path"].startswith("/v1/") or "json" in kind:
        return scope
    kept = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-type"]
    return {**scope, "headers": [*kept, (b"content-type", b"application/json")]}
