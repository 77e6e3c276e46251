"""One generation at a time: requests wait in a bounded queue for the loaded pair.

The generation runs on a thread of its own (llama.cpp holds it for the length of a decode) and
hands its events to the event loop. Past the bound, a request is refused with 503 and
Retry-After. A request that goes away (or fails) cancels its generation at the next cycle.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from specgen.api import Settings
from specgen.engine import TextChunk
from specgen.server.openai import ApiError
from specgen.session.generate import Prompt, Result
from specgen.structured.tools import Tool, ToolChoice, ToolPlan


class Generator(Protocol):
    """What the server serves: ``specgen.api.Specgen`` (a loaded pair)."""

    @property
    def name(self) -> str: ...

    def stream_events(
        self,
        prompt: Prompt,
        settings: Settings = ...,
        *,
        system: str | None = None,
        reuse_prefix: bool = False,
        cancelled: Callable[[], bool] | None = None,
        chat: bool | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> Iterator[TextChunk | Result]: ...

    def tool_plan(
        self, tools: Sequence[Tool], choice: ToolChoice, parallel: bool = True
    ) -> ToolPlan: ...


@dataclass
class Job:
    prompt: Prompt
    settings: Settings
    cancelled: threading.Event
    chat: bool
    tools: list[dict[str, Any]] | None = None  # for the chat template


class GenerationQueue:
    """Runs one generation at a time on its own thread; hands events to the event loop."""

    def __init__(self, generator: Generator, max_queue: int) -> None:
        self.generator, self.max_queue = generator, max_queue
        self.lock = asyncio.Lock()
        self.waiting = 0
        self.draining = threading.Event()

    async def run(self, job: Job) -> AsyncIterator[TextChunk | Result]:
        """Text pieces, then the Result; raises ApiError 503 when the queue is full.

        The lock is released by the worker thread itself when its generation has ended, so a
        request cancelled while its generation still runs never lets a second one start on the
        same models."""
        if self.lock.locked() and self.waiting >= self.max_queue:
            raise ApiError(
                503,
                f"the model is busy and {self.waiting} requests are waiting; retry shortly",
                "server_error",
                "busy",
                {"Retry-After": "1"},
            )
        self.waiting += 1
        try:
            await self.lock.acquire()
        finally:
            self.waiting -= 1
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[object] = asyncio.Queue()  # pieces, the Result, an error, done
        done = object()

        def work() -> None:
            try:
                for item in self.generator.stream_events(
                    job.prompt,
                    job.settings,
                    reuse_prefix=True,
                    chat=job.chat,
                    tools=job.tools,
                    cancelled=lambda: job.cancelled.is_set() or self.draining.is_set(),
                ):
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
            # The result, or the error, is handed on once the thread is done and the model free:
            # a client that sends its next request the moment it has an answer finds the model
            # free (an error is an answer too).
            result: Result | None = None
            error: BaseException | None = None
            while (item := await queue.get()) is not done:
                if isinstance(item, BaseException):
                    error = item
                elif isinstance(item, Result):
                    result = item
                elif isinstance(item, TextChunk):
                    yield item
            if error is not None:
                raise error
            if result is not None:
                yield result
        finally:
            job.cancelled.set()  # a client gone, or an error: stop at the next cycle
