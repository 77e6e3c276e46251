"""``specgen serve``: an OpenAI-compatible HTTP server over one loaded pair (FastAPI, uvicorn,
server-sent events, prometheus_client). Needs ``pip install 'specgen[server]'``.

- ``app``: the endpoints; ``openai``: the request and response shapes and error objects;
- ``queue``: one generation at a time, requests waiting in a bounded queue;
- ``metrics``: the Prometheus counters; ``guard``: the API key and the body size bound.
"""

from __future__ import annotations

from specgen.server.app import MAX_BODY, create_app

__all__ = ["MAX_BODY", "create_app"]
