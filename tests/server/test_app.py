"""The server's app in this process, over fake models: the official `openai` client and plain
HTTP through httpx's ASGI transport (no socket), and the queue on its own. The server over
uvicorn is in test_serve.py (on fakes) and tests/integration/test_server.py (the real demo pair)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx2 as httpx
import pytest

from tests.conftest import FakePair
from tests.invoke import specgen_here

openai = pytest.importorskip("openai")
KEY = "sk-specgen-test"


def run_cli(fakes: FakePair, *args: str) -> dict:
    done = specgen_here("run", *args, *fakes.args("--temperature", "0", "--json"))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def generator(fake_pair: FakePair):
    from specgen.api import Specgen

    return Specgen(target=fake_pair.target, draft=fake_pair.draft, threads=2)


@pytest.fixture
def app(generator):
    from specgen.server import create_app

    return create_app(generator, api_key=KEY, max_queue=0)


class AppClient:
    """Requests to the app in this process (no socket), all on one event loop, as a server's
    requests are: plain HTTP (``request``) or the official async `openai` client (``openai``)."""

    def __init__(self, app) -> None:
        self.loop = asyncio.new_event_loop()
        self.http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://specgen"
        )

    def request(
        self,
        method: str,
        path: str,
        key: str | None = KEY,
        headers: dict[str, str] | None = None,
        **kwargs,
    ) -> httpx.Response:
        auth = {"Authorization": f"Bearer {key}"} if key else {}
        return self.loop.run_until_complete(
            self.http.request(method, path, headers={**auth, **(headers or {})}, **kwargs)
        )

    def post(self, path: str, **kwargs) -> httpx.Response:
        return self.request("POST", path, **kwargs)

    def openai(self, work):
        """``work(client)`` with the official async `openai` client, run to the end."""
        client = openai.AsyncOpenAI(
            base_url="http://specgen/v1", api_key=KEY, http_client=self.http, max_retries=0
        )
        return self.loop.run_until_complete(work(client))

    def metric(self, name: str) -> float:
        text = self.request("GET", "/metrics", key=None).text
        return sum(
            float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith(name + " ") or line.startswith(name + "{")
        )

    def close(self) -> None:
        self.loop.run_until_complete(self.http.aclose())
        self.loop.close()


@pytest.fixture
def http(app) -> Iterator[AppClient]:
    client = AppClient(app)
    yield client
    client.close()


def test_greedy_chat_and_completions_equal_specgen_run(http, fake_pair: FakePair) -> None:
    async def work(client):
        chat = await client.chat.completions.create(
            model="x",
            messages=[{"role": "user", "content": "What is the capital?"}],
            temperature=0,
            max_tokens=24,
        )
        completion = await client.completions.create(
            model="x", prompt="The capital is", temperature=0, max_tokens=24
        )
        pieces = [
            c.choices[0].text
            async for c in await client.completions.create(
                model="x", prompt="The capital is", temperature=0, max_tokens=24, stream=True
            )
        ]
        streamed = [
            c.choices[0].delta.content or ""
            async for c in await client.chat.completions.create(
                model="x",
                messages=[{"role": "user", "content": "What is the capital?"}],
                temperature=0,
                max_tokens=24,
                stream=True,
            )
            if c.choices
        ]
        return chat, completion, pieces, streamed

    chat, completion, pieces, streamed = http.openai(work)
    assert (
        chat.choices[0].message.content
        == run_cli(fake_pair, "What is the capital?", "-n", "24")["text"]
    )
    assert chat.choices[0].finish_reason == "length" and chat.object == "chat.completion"
    assert (
        completion.choices[0].text
        == run_cli(fake_pair, "The capital is", "-n", "24", "--raw")["text"]
    )
    assert "".join(pieces) == completion.choices[0].text
    assert "".join(streamed) == chat.choices[0].message.content


def test_timings_usage_and_metrics_agree(http) -> None:
    names = (
        "specgen_spec_decode_num_draft_tokens_total",
        "specgen_spec_decode_num_accepted_tokens_total",
        "specgen_generation_tokens_total",
        "specgen_spec_decode_num_accepted_tokens_per_pos_total",
    )
    before = {name: http.metric(name) for name in names}
    body = http.post(
        "/v1/completions",
        json={"prompt": "Once upon a time", "temperature": 0.7, "seed": 3, "max_tokens": 40},
    ).json()
    timings, usage = body["timings"], body["usage"]
    assert timings["predicted_n"] == usage["completion_tokens"] == 40
    assert 0 < timings["draft_n_accepted"] <= timings["draft_n"]
    assert timings["prompt_n"] + timings["cache_n"] == usage["prompt_tokens"]
    after = {name: http.metric(name) for name in names}
    assert after[names[2]] - before[names[2]] == usage["completion_tokens"]
    assert after[names[0]] - before[names[0]] == timings["draft_n"]
    accepted = after[names[1]] - before[names[1]]
    assert accepted == timings["draft_n_accepted"]
    assert after[names[3]] - before[names[3]] == accepted
    assert http.metric("specgen_request_latency_seconds_count") > 0


def test_a_second_chat_turn_reuses_the_first(http) -> None:
    first = [{"role": "user", "content": "Name a colour."}]
    answer = http.post(
        "/v1/chat/completions", json={"messages": first, "temperature": 0, "max_tokens": 16}
    ).json()
    reply = answer["choices"][0]["message"]["content"]
    turn_two = [
        *first,
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "And another one?"},
    ]
    two = http.post(
        "/v1/chat/completions", json={"messages": turn_two, "temperature": 0, "max_tokens": 16}
    ).json()
    cached = two["timings"]["cache_n"]
    assert cached >= answer["usage"]["prompt_tokens"]  # all of turn one's prompt, at least
    assert two["timings"]["prompt_n"] == two["usage"]["prompt_tokens"] - cached
    assert two["usage"]["prompt_tokens_details"]["cached_tokens"] == cached


def test_bad_requests_get_openai_errors(http) -> None:
    url = "/v1/chat/completions"
    hi = [{"role": "user", "content": "hi"}]
    cases = [
        (b"{not json", 400, "invalid_json"),
        (json.dumps({"messages": "hi"}).encode(), 422, "invalid_value"),
        (json.dumps({"messages": hi, "temperature": "hot"}).encode(), 422, "invalid_value"),
        (json.dumps({"messages": hi, "top_p": 2}).encode(), 422, "invalid_value"),
        (
            json.dumps({"messages": [{"role": "robot", "content": "hi"}]}).encode(),
            422,
            "invalid_value",
        ),
        (
            json.dumps({"messages": [{"role": "user", "content": "x" * (2 << 20)}]}).encode(),
            413,
            "request_too_large",
        ),
        (
            json.dumps(
                {"messages": [{"role": "user", "content": "word " * 500}], "max_tokens": 4}
            ).encode(),
            400,
            None,
        ),
    ]
    for body, status, code in cases:
        response = http.post(url, content=body, headers={"Content-Type": "application/json"})
        assert response.status_code == status, (body[:60], response.text)
        error = response.json()["error"]
        assert error["message"] and (code is None or error["code"] == code)
    too_long = http.post(url, json={"messages": [{"role": "user", "content": "word " * 500}]})
    assert "does not fit the context" in too_long.json()["error"]["message"]
    unknown = http.post(
        url, json={"messages": hi, "max_tokens": 2, "frequency_penalty": 0, "user": "me"}
    )
    assert unknown.status_code == 200  # fields other clients send are ignored

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(40):
            yield b"x" * 65536

    chunked = http.post(
        url,
        content=chunks(),  # no Content-Length
        headers={"Content-Type": "application/json"},
    )
    assert chunked.status_code == 413 and chunked.json()["error"]["code"] == "request_too_large"
    assert http.post(url, key=None, json={"messages": []}).status_code == 401
    assert http.post(url, key="wrong", json={}).status_code == 401
    assert http.request("GET", "/health", key=None).status_code == 200  # no key off /v1
    assert http.request("GET", "/v1/models").json()["data"][0]["object"] == "model"


def test_back_to_back_requests_never_find_the_model_busy(http) -> None:
    """With --queue 0, a request sent the moment the last answer arrived still gets the model:
    an answer is only sent once its generation has given the model back; an error is an answer
    too."""
    for i in range(12):
        answer = http.post(
            "/v1/completions", json={"prompt": f"Number {i}:", "max_tokens": 2, "temperature": 0}
        )
        assert answer.status_code == 200
        assert answer.json()["choices"][0]["finish_reason"] in ("length", "stop")
        refused = http.post("/v1/completions", json={"prompt": "word " * 500})
        assert refused.status_code == 400, refused.text  # too long for the context, not busy


class Held:
    """A generator whose generations wait, after their first piece, until ``go`` is set, and
    say how they ended."""

    name = "held"

    def __init__(self) -> None:
        self.go = threading.Event()
        self.started = threading.Event()
        self.ended: list[str] = []

    def stream_events(
        self,
        prompt,
        settings=None,
        *,
        system=None,
        reuse_prefix=False,
        cancelled=None,
        chat=None,
        tools=None,
    ) -> Iterator[object]:
        from specgen.engine import TextChunk
        from specgen.session.generate import Result
        from specgen.stats import Stats

        stats = Stats(lookahead=4, seed=0)
        yield TextChunk("first ")
        self.started.set()
        for _ in range(200):  # one "cycle" each 10 ms, as a generation checks between cycles
            if cancelled is not None and cancelled():
                stats.finish("cancelled")
                break
            if self.go.wait(0.01):
                stats.finish("max_tokens")
                break
        self.ended.append(stats.stop_reason or "")
        yield Result("first ", stats)


def test_a_full_queue_answers_503_and_a_request_that_goes_away_cancels() -> None:
    from specgen.api import Settings
    from specgen.server.openai import ApiError
    from specgen.server.queue import GenerationQueue, Job

    held = Held()

    async def main() -> None:
        queue = GenerationQueue(held, max_queue=0)
        first = Job("a", Settings(), threading.Event(), False)
        events = queue.run(first)
        assert (await anext(events)).text == "first "
        await asyncio.to_thread(held.started.wait, 5)
        with pytest.raises(ApiError) as busy:  # one generating, none may wait
            await anext(queue.run(Job("b", Settings(), threading.Event(), False)))
        assert busy.value.status == 503 and busy.value.headers["Retry-After"] == "1"
        await events.aclose()  # the request went away: its generation stops at the next cycle
        async with queue.lock:  # given back once that generation has ended, not before
            assert held.ended == ["cancelled"]
        second = queue.run(Job("c", Settings(), threading.Event(), False))
        assert (await anext(second)).text == "first "
        held.go.set()
        result = await anext(second)
        assert result.stats.stop_reason == "max_tokens"

    asyncio.run(main())


def test_pieces_handed_together_wake_the_loop_once_and_arrive_in_order() -> None:
    """The slots' thread hands a pass's pieces for every request (``_Mailbox``): the loop is
    woken once for all those handed before it looks, each request gets its own in the order
    handed, and a piece handed after a delivery wakes it again."""
    from specgen.server.queue import _Mailbox

    async def main() -> None:
        loop = asyncio.get_running_loop()
        wakes = []
        wake = loop.call_soon_threadsafe

        def counted(callback, *args):  # type: ignore[no-untyped-def]
            wakes.append(callback)
            return wake(callback, *args)

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
        mailbox = _Mailbox(loop)
        queues: list[asyncio.Queue[object]] = [asyncio.Queue() for _ in range(3)]

        def one_pass(start: int) -> None:
            for step in range(start, start + 4):
                for i, queue in enumerate(queues):
                    mailbox.hand(queue, (i, step))

        def handed_while_the_loop_is_busy(start: int) -> None:
            thread = threading.Thread(target=one_pass, args=(start,))
            thread.start()
            thread.join()  # the loop, blocked here, cannot look in between

        handed_while_the_loop_is_busy(0)
        assert len(wakes) == 1
        got = [[await queue.get() for _ in range(4)] for queue in queues]
        assert got == [[(i, step) for step in range(4)] for i in range(3)]
        handed_while_the_loop_is_busy(4)
        assert len(wakes) == 2
        assert [await queues[2].get() for _ in range(4)] == [(2, step) for step in range(4, 8)]

    asyncio.run(main())


def test_the_python_api_generates_as_run_does(generator, fake_pair: FakePair) -> None:
    from specgen.engine import TextChunk
    from specgen.session.generate import Result

    result = generator.generate("What is the capital?", temperature=0, max_tokens=16)
    assert isinstance(result, Result) and result.stats.n_generated == 16
    assert result.text == run_cli(fake_pair, "What is the capital?", "-n", "16")["text"]
    pieces = list(
        generator.stream(
            [{"role": "user", "content": "What is the capital?"}], temperature=0, max_tokens=16
        )
    )
    assert "".join(pieces) == result.text and generator.last is not None
    events = list(generator.stream_events("Once upon a time", chat=False))
    assert isinstance(events[-1], Result)
    assert all(isinstance(e, TextChunk) for e in events[:-1])


def test_serve_takes_the_k_bench_found(fake_pair: FakePair) -> None:
    from specgen.api import Specgen
    from specgen.models.registry import Registry
    from specgen.session.choice import choose
    from specgen.session.memo import MEMO_VERSION, memo_path

    choice = choose(Registry.load(), None, str(fake_pair.target), str(fake_pair.draft))
    memo = memo_path(choice, 2, -1)
    memo.parent.mkdir(parents=True, exist_ok=True)
    memo.write_text(
        json.dumps(
            {
                "schema": MEMO_VERSION,
                "sampled": {"variant": 3, "speedup": 1.3, "temperature": 0.8, "date": "2026-11-29"},
            }
        )
    )
    sg = Specgen(target=fake_pair.target, draft=fake_pair.draft, threads=2, from_bench=True)
    assert sg.lookahead == 3 and "specgen bench" in sg.note
    assert Specgen(target=fake_pair.target, draft=fake_pair.draft, threads=2).lookahead == "auto"
    assert Path(sg.target_path) == fake_pair.target


def test_a_json_body_sent_as_a_form_is_read_as_json(http) -> None:
    """``curl -d`` sends a JSON body with a form's content type; the API reads it as JSON."""
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    reply = http.post("/v1/chat/completions", content=body, headers=form)
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"]


def test_parallel_slots_answer_side_by_side_as_one_at_a_time_does(fake_pair: FakePair) -> None:
    """``serve --parallel 2``: three chats sent at once each get what the pair alone gives them
    (greedy), two verified in one target pass at a time; ``/health`` shows the slots and
    ``/metrics`` the passes by how many sequences each held and the lookahead chosen there. A
    chat that goes on lands on the slot that holds its start, and reuses it."""
    from specgen.api import Specgen
    from specgen.server import create_app

    alone = Specgen(target=fake_pair.target, draft=fake_pair.draft, threads=2)
    many = Specgen(target=fake_pair.target, draft=fake_pair.draft, threads=2, parallel=2)
    http = AppClient(create_app(many, api_key=KEY, parallel=2))
    questions = ["Name a colour.", "Count to five.", "Say something about the sea."]
    bodies = [
        {"messages": [{"role": "user", "content": q}], "temperature": 0, "max_tokens": 24}
        for q in questions
    ]
    try:
        health = http.request("GET", "/health", key=None).json()
        assert health["slots"] == {"total": 2, "busy": 0, "waiting": 0}

        async def all_at_once() -> list[httpx.Response]:
            auth = {"Authorization": f"Bearer {KEY}"}
            sent = [http.http.post("/v1/chat/completions", json=b, headers=auth) for b in bodies]
            return list(await asyncio.gather(*sent))

        answers = [r.json() for r in http.loop.run_until_complete(all_at_once())]
        for body, answer in zip(bodies, answers, strict=True):
            expected = alone.generate(body["messages"], max_tokens=24, temperature=0).text
            assert answer["choices"][0]["message"]["content"] == expected
        assert http.metric('specgen_batch_target_passes{sequences="2"}') > 0
        assert (
            'specgen_batch_mean_lookahead{sequences="2"}'
            in http.request("GET", "/metrics", key=None).text
        )
        # The last chat to start goes on (its slot ran nothing since): on that slot, its first
        # turn is in the caches.
        last = bodies[2]["messages"]
        turn_two = [
            *last,
            {"role": "assistant", "content": answers[2]["choices"][0]["message"]["content"]},
            {"role": "user", "content": "And another one?"},
        ]
        two = http.post(
            "/v1/chat/completions", json={"messages": turn_two, "temperature": 0, "max_tokens": 8}
        ).json()
        assert two["timings"]["cache_n"] >= answers[2]["usage"]["prompt_tokens"]
    finally:
        http.close()


def _watched_burst(
    fake_pair: FakePair, balance: bool, sizes: list[int], parallel: int, next_at_once: bool
) -> tuple[list[float], list[tuple[int, int, bool, bool, int]]]:
    """``serve --parallel`` with ``sizes``' requests (their ``max_tokens``) sent at once, with
    none waiting; once the first has its answer, a next one sent at once (``next_at_once``:
    it takes the freed place), or none for longer than ``REFILL_SECONDS`` (the place stays
    free). Returns when each started, and at each pass: requests started, busy slots,
    ``waves``, ``closed``, and how many running sequences are off the critical path (they plan
    no guesses)."""
    from specgen.api import Specgen
    from specgen.server import create_app
    from specgen.session.parallel import REFILL_SECONDS

    many = Specgen(target=fake_pair.target, draft=fake_pair.draft, threads=2, parallel=parallel)
    app = create_app(many, api_key=KEY, parallel=parallel, balance=balance)
    http = AppClient(app)
    queue, slots = app.state.queue, app.state.queue.slots
    seen: list[tuple[int, int, bool, bool, int]] = []
    step, start = slots.step, slots.start
    started: list[float] = []
    burst = len(sizes)

    def watched_step() -> bool:
        # The pass waits for what the client sends at once (the burst; its next when the first
        # has ended), so that no pass runs before it comes.
        ended = len(started) - slots.busy
        need = burst + (1 if next_at_once and ended else 0)
        deadline = time.monotonic() + 10
        while len(started) + queue.waiting < need:
            if time.monotonic() > deadline:
                raise AssertionError("the client's request never came")
            time.sleep(0.001)
        if ended and not next_at_once and not paused:
            fake_pair.clock.advance(2 * REFILL_SECONDS)  # the place stays free
            paused.append(True)
        load = slots.load
        behind = sum(not load.on_critical_path(slot) for slot in load._left)
        seen.append((len(started), slots.busy, load.waves, load.closed, behind))
        return step()

    paused: list[bool] = []

    def watched_start(work, key=(), arrived=None) -> bool:  # noqa: ANN001
        started.append(arrived)
        return start(work, key, arrived)

    slots.step, slots.start = watched_step, watched_start
    auth = {"Authorization": f"Bearer {KEY}"}

    def send(n: int) -> asyncio.Future[httpx.Response]:
        body = {"prompt": f"Count to {n}.", "temperature": 0, "max_tokens": n}
        return asyncio.ensure_future(http.http.post("/v1/completions", json=body, headers=auth))

    async def run() -> list[httpx.Response]:
        sent = [send(n) for n in sizes]
        first = await sent[0]
        after = [await send(12)] if next_at_once else []
        return [first, *after, *[await s for s in sent[1:]]]

    try:
        answers = http.loop.run_until_complete(run())
        assert [a.status_code for a in answers] == [200] * len(answers)
    finally:
        http.close()
    return started, seen


@pytest.mark.parametrize("balance", [True, False])
def test_a_burst_ends_together_once_a_place_it_freed_stays_free(
    fake_pair: FakePair, balance: bool
) -> None:
    """``serve --parallel 3`` (``--balance``, the default): three requests sent at once are one
    wave (each stamped with when it came), but nothing says yet that their sender waits for
    all of them, so each guesses for itself. Once the short one has its answer and its place
    stays free, the other two end together (``BatchLoad.waves``: the one with fewer tokens
    left guesses nothing until the other catches up). ``--no-balance``: never."""
    from specgen.lookahead.batch import WAVE_SECONDS

    started, seen = _watched_burst(fake_pair, balance, [4, 200, 150], 3, next_at_once=False)
    assert len(started) == 3 and max(started) - min(started) <= WAVE_SECONDS
    assert not any(closed for *_, closed, _ in seen)
    first = [(w, b) for _, busy, w, _, b in seen if busy == 3]
    # After the short one ended (a pass may run before the third request was started, with
    # two). The pass that frees the place tells only the next one that it stayed free.
    last = max(i for i, (_, busy, *_) in enumerate(seen) if busy == 3)
    rest = [(w, b) for _, busy, w, _, b in seen[last + 1 :] if busy == 2][1:]
    assert first and rest
    assert not any(w or b for w, b in first), "a first burst guesses for itself"
    assert all(w == balance for w, _ in rest)
    # Balanced, the one with 150 tokens to go (ahead of the one with 200) plans no guesses,
    # but where the slowest's pace would bring it level (``BatchLoad.on_critical_path``): how
    # often depends on how many of the slowest's guesses survive, which a float's order in the
    # tiny models' passes moves, so most of the round is asserted, not every pass.
    if balance:
        assert sum(b for _, b in rest) >= len(rest) / 2, [b for _, b in rest]
    else:
        assert not any(b for _, b in rest)


@pytest.mark.parametrize("balance", [True, False])
def test_a_burst_whose_client_sends_its_next_at_once_is_never_balanced(
    fake_pair: FakePair, balance: bool
) -> None:
    """Two requests sent at once, and a third sent as soon as the short one has its answer: it
    takes the freed place at once (a client's next starts sooner), so every request guesses
    for itself throughout, balanced or not."""
    started, seen = _watched_burst(fake_pair, balance, [4, 200], 2, next_at_once=True)
    assert len(started) == 3
    # (Once the third has ended too and its place stays free, the last is a wave's again,
    # alone in it.)
    both = [(w, closed) for _, busy, w, closed, _ in seen if busy == 2]
    assert both and not any(w or closed for w, closed in both)
    assert not any(b for *_, b in seen), "none held back"


def test_penalties_from_a_real_client_are_run_s(http, fake_pair: FakePair) -> None:
    """OpenAI's presence and frequency penalties (the client's own keywords) and llama-server's
    repeat_penalty give the text `specgen run` gives with the same flags; out of range: 422."""
    penalties = {"presence_penalty": 0.8, "frequency_penalty": 0.4}

    async def work(client):
        return await client.completions.create(
            model="x",
            prompt="The capital is",
            temperature=0,
            max_tokens=24,
            extra_body={"repeat_penalty": 1.3, "repeat_last_n": 16},
            **penalties,
        )

    completion = http.openai(work)
    flags = ("--presence-penalty", "0.8", "--frequency-penalty", "0.4", "--repeat-penalty", "1.3")
    shown = run_cli(
        fake_pair, "The capital is", "-n", "24", "--raw", *flags, "--repeat-last-n", "16"
    )
    plain = run_cli(fake_pair, "The capital is", "-n", "24", "--raw")
    assert completion.choices[0].text == shown["text"] != plain["text"]
    hi = [{"role": "user", "content": "hi"}]
    for field, value in (("presence_penalty", 3), ("repeat_penalty", 0), ("repeat_last_n", -2)):
        bad = http.post("/v1/chat/completions", json={"messages": hi, field: value})
        assert bad.status_code == 422 and field in bad.text
