"""Requests wait in a bounded queue for the loaded pair: one generation at a time
(``GenerationQueue``), or up to ``--parallel`` side by side on its slots (``SlotQueue``).

Generations run on a thread of their own (llama.cpp holds it for the length of a decode) and
hand their events to the event loop. Past the bound, a request is refused with 503 and
Retry-After. A request that goes away (or fails) cancels its generation at the next cycle.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from specgen.api import Settings
from specgen.engine import SpeculativeEngine, TextChunk
from specgen.server.openai import ApiError
from specgen.session import parallel
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
        engine: SpeculativeEngine | None = None,
    ) -> Iterator[TextChunk | Result]: ...

    def slots(self) -> parallel.Slots: ...

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


def _events(
    generator: Generator,
    job: Job,
    draining: threading.Event,
    engine: SpeculativeEngine | None = None,
) -> Iterator[TextChunk | Result]:
    """A job's generation: the chat goes on from the cached prefix; it stops at the next
    cycle once its client goes away or the server drains."""
    slot: dict[str, Any] = {} if engine is None else {"engine": engine}  # a slot of the pair
    return generator.stream_events(
        job.prompt,
        job.settings,
        reuse_prefix=True,
        chat=job.chat,
        tools=job.tools,
        cancelled=lambda: job.cancelled.is_set() or draining.is_set(),
        **slot,
    )


def _busy(waiting: int) -> ApiError:
    return ApiError(
        503,
        f"the model is busy and {waiting} requests are waiting; retry shortly",
        "server_error",
        "busy",
        {"Retry-After": "1"},
    )


async def _handed(queue: asyncio.Queue[object], done: object) -> AsyncIterator[TextChunk | Result]:
    """A generation's pieces, then its Result (or its error), from the thread that runs it,
    handed on once that thread is done with the models: a client that sends its next request
    the moment it has an answer finds the model free (an error is an answer too)."""
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


class GenerationQueue:
    """Runs one generation at a time on its own thread; hands events to the event loop."""

    def __init__(self, generator: Generator, max_queue: int) -> None:
        self.generator, self.max_queue = generator, max_queue
        self.lock = asyncio.Lock()
        self.waiting = 0
        self.draining = threading.Event()
        self.size = 1

    @property
    def busy(self) -> int:
        return 1 if self.lock.locked() else 0

    async def run(self, job: Job) -> AsyncIterator[TextChunk | Result]:
        """Text pieces, then the Result; raises ApiError 503 when the queue is full.

        The lock is released by the worker thread itself when its generation has ended, so a
        request cancelled while its generation still runs never lets a second one start on the
        same models."""
        if self.lock.locked() and self.waiting >= self.max_queue:
            raise _busy(self.waiting)
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
                for item in _events(self.generator, job, self.draining):
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
            async for item in _handed(queue, done):
                yield item
        finally:
            job.cancelled.set()  # a client gone, or an error: stop at the next cycle


class _Mailbox:
    """What the slots' thread hands to the requests waiting on one event loop: one wake-up of
    the loop for everything handed since it last looked, not one for each piece. A pass of
    eight sequences hands eight pieces at once, and each wake-up is a write to the loop's pipe
    and the GIL handed to the loop's thread while the passes wait for it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._items: deque[tuple[asyncio.Queue[object], object]] = deque()
        self._lock = threading.Lock()
        self._called = False  # a delivery is on its way to the loop

    def hand(self, queue: asyncio.Queue[object], item: object) -> None:
        """``item`` to ``queue`` on the loop, after everything handed before it."""
        with self._lock:
            self._items.append((queue, item))
            if self._called:
                return
            self._called = True
        self.loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._lock:
            items, self._items = self._items, deque()
            self._called = False
        for queue, item in items:
            queue.put_nowait(item)


class SlotQueue:
    """Runs up to the pair's ``parallel`` generations side by side on one thread of its own
    (``session.parallel``: one batched pass per cycle for all of them); requests past the
    slots wait, in order, in a queue of ``max_queue``. ``balance``: while none waits and the
    places that free up are not taken again at once, requests that arrived together end
    together (``session.parallel.balance``)."""

    def __init__(self, generator: Generator, max_queue: int, balance: bool = True) -> None:
        self.generator, self.max_queue = generator, max_queue
        self.ends: parallel.Ends = "waves" if balance else "open"
        self.slots = generator.slots()
        self.size = self.slots.size
        self.draining = threading.Event()
        # Each waiting request's work, its key for the slot that ran its start, when it came.
        self._inbox: deque[tuple[Callable[[SpeculativeEngine], None], Sequence[Any], float]] = (
            deque()
        )
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._mailboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Mailbox] = (
            weakref.WeakKeyDictionary()
        )
        threading.Thread(target=self._serve, name="specgen-slots", daemon=True).start()

    @property
    def waiting(self) -> int:
        return len(self._inbox)

    @property
    def busy(self) -> int:
        return self.slots.busy

    async def run(self, job: Job) -> AsyncIterator[TextChunk | Result]:
        """Text pieces, then the Result; raises ApiError 503 when the queue is full."""
        if not self.slots.free and self.waiting >= self.max_queue:
            raise _busy(self.waiting)
        loop = asyncio.get_running_loop()
        mailbox = self._mailboxes.get(loop)
        if mailbox is None:
            mailbox = self._mailboxes[loop] = _Mailbox(loop)
        queue: asyncio.Queue[object] = asyncio.Queue()
        done = object()

        def hand(item: object) -> None:
            mailbox.hand(queue, item)

        def work(engine: SpeculativeEngine) -> None:
            try:
                for item in _events(self.generator, job, self.draining, engine):
                    hand(item)
            except Exception as err:  # handed to the request below
                hand(err)
            finally:
                hand(done)

        with self._lock:
            self._inbox.append((work, _key(job.prompt), self.slots.pair.clock()))
        self._wake.set()
        try:
            async for item in _handed(queue, done):
                yield item
        finally:
            job.cancelled.set()  # a client gone, or an error: stop at the next cycle

    def _serve(self) -> None:
        """The slots' thread: admit waiting requests to free slots, then one batched pass."""
        slots, clock, refills = self.slots, self.slots.pair.clock, parallel.Refills()
        while True:
            with self._lock:
                while self._inbox and slots.free:
                    work, key, arrived = self._inbox.popleft()
                    refills.arrive(arrived)
                    slots.start(work, key, arrived)
                waiting = bool(self._inbox)
            if not slots.busy:
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            began = clock()
            parallel.balance(slots.load, self.ends, waiting, refills.refilled(began))
            busy = slots.busy
            slots.step()
            if slots.busy < busy:
                refills.free(began, clock(), busy - slots.busy)


def _key(prompt: Prompt) -> Sequence[Any]:
    """What a request is put on a slot by: a chat's messages (one that goes on shares the
    earlier turns), a prompt's text."""
    if isinstance(prompt, str):
        return prompt
    return [repr(sorted(message.items())) for message in prompt]
