"""Prompt lookup across requests, measured: a workload of related requests sent to servers side by
side, and the suffix cache's memory.

Each (pair, temperature, workload) starts fresh servers: `specgen serve` with its defaults for
a user's own files (prompt lookup and the suffix cache), the same with `--lookup-cache off`, and
llama-server with `--spec-type draft-simple,ngram-mod --spec-draft-n-max 8` (built by
`../shared/tools/llama-cpp-peer.sh`). The same requests go to each in turn, request by request
(rotating which goes first); the figure is a server's generated tokens over its generation time
over the workload (`timings.predicted_n / predicted_ms`, as each server reports it).

    python benchmarks/suffix_cache.py [--pair smollm2] [--temperature 0] [-n 128] [--no-peer]
    python benchmarks/suffix_cache.py --memory
    python benchmarks/suffix_cache.py --again [--pair smollm2]
    python benchmarks/suffix_cache.py --bound [--pair smollm2] [--workload repeating]
    python benchmarks/suffix_cache.py --aa [--pair smollm2] [--workload fresh]

``--aa`` sends the workload to two servers alike (both without the cache): the spread one row
of the table can show when nothing differs.

``--bound`` runs a workload in one process, three ways side by side: without the cache,
with it, and with an oracle in its place that knows the target's answer and guesses, wherever
the answer goes on as some earlier request's text did, as much of it as that text holds (never
wrong, no match needed): what no suffix cache, which can only guess text it holds, can beat
in this loop. Sampling (``--temperature``), the oracle guesses the target's likeliest token at
every step, the best a point-mass guess can be, its own time off the clock.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import httpx2 as httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# The demo pairs, as `specgen models pull` leaves them in this machine's cache.
PAIRS = {"smollm2": "smollm2-135m-demo", "gemma": "gemma3-270m-demo"}


def pair_files(pair: str) -> tuple[str, str]:
    """The target and draft files of a demo pair, from the registry and this machine's cache."""
    from specgen.models.registry import Registry, cached

    named = Registry.load().pairs[PAIRS[pair]]
    files = [cached(spec) for _, spec in named.members()]
    if not all(files):
        raise SystemExit(f"{PAIRS[pair]} is not here: run `specgen models pull {PAIRS[pair]}`")
    return str(files[0]), str(files[1])


CHAT = ("smollm2",)  # Gemma 3 270M (the base model) has no chat template
CODE = """def order_value(orders):
    total = 0
    for order in orders:
        if order.paid:
            total += order.price * order.quantity
    return total


def report(orders):
    total = order_value(orders)
    print(f"Paid orders: {total:.2f}")
    return total
"""
PASSAGE = (
    "The printing press, developed by Johannes Gutenberg around 1440, made books cheaper and "
    "faster to produce. Ideas spread across Europe within years instead of decades."
)
PEOPLE = [("Ada Lovelace", "London", 36), ("Alan Turing", "Wilmslow", 41),
          ("Grace Hopper", "Arlington", 85)]  # fmt: skip


def repeating() -> list[object]:
    """Related requests, as an agent or an editor sends them: a file edited twice (the second
    instruction refines the first, so its answer repeats the first answer, which its prompt
    does not hold), a tool loop whose answers are JSON of one shape (given by no prompt), a
    chat whose next turn quotes the last answer (a callable: the prompt from the answer
    before), and a request sent again (a retry)."""
    asks: list[object] = [
        f"Rename `total` to `order_sum` in this code and show the whole code.\n\n{CODE}\nCode:\n",
        f"Rename `total` to `order_sum` in this code, add a docstring to each function, and "
        f"show the whole code.\n\n{CODE}\nCode:\n",
    ]
    for name, city, age in PEOPLE:
        asks.append(
            f"Answer with a JSON object with the person's name, city and age.\n"
            f"{name} is {age} years old and lives in {city}.\nJSON:"
        )
    first = f"Summarize this passage in two sentences: {PASSAGE}"
    asks.append(first)
    asks.append(
        lambda answer: [
            {"role": "user", "content": first},
            {"role": "assistant", "content": answer},
            {
                "role": "user",
                "content": "Repeat your summary word for word, then add one sentence about "
                "its consequences.",
            },
        ]
    )
    retry = "Write a short story about a lighthouse keeper, in five sentences."
    asks += [retry, retry]
    return asks


def fresh() -> list[object]:
    """Requests that do not repeat one another."""
    return [
        "Explain in a few sentences why the sky is blue.",
        "Write a haiku about autumn leaves.",
        "List five uses of a paperclip.",
        "What is the difference between weather and climate?",
        "Give three tips for learning a new language.",
        "Describe a cat to someone who has never seen one.",
        "Why do we have leap years?",
    ]


WORKLOADS = {"repeating": repeating, "fresh": fresh}
# How every sampled request samples (the server's and the API's settings alike).
SAMPLED = {"top_k": 40, "top_p": 0.95, "min_p": 0.05}


def plain_text(conversation: list[dict[str, object]]) -> str:
    """A conversation as a base model (no chat template) reads it."""
    return "\n\n".join(str(m["content"]) for m in conversation) + "\n\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(kind: str, target: str, draft: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    if kind == "llama-server":
        server = subprocess.run(
            ["bash", str(ROOT.parent / "shared/tools/llama-cpp-peer.sh"), "--server-path"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        command = [
            server, "-m", target, "-md", draft, "--spec-type", "draft-simple,ngram-mod",
            "--spec-draft-n-max", "8", "-t", "2", "-td", "2", "-c", "4096", "--port", str(port),
        ]  # fmt: skip
    else:
        command = [
            sys.executable, "-m", "specgen", "serve", "--target", target, "--draft", draft,
            "--threads", "2", "-c", "4096", "--port", str(port),
        ]  # fmt: skip
        if kind.startswith("specgen, no cache"):
            command += ["--lookup-cache", "off"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise SystemExit(f"{kind} did not start")


def ask(
    url: str, request: object, temperature: float, seed: int, n: int, chat: bool
) -> tuple[str, int, float]:
    """One request: a chat (the pair's template) or a completion (a base model's raw text)."""
    body: dict[str, object] = {"max_tokens": n, "temperature": temperature, "seed": seed}
    if temperature:
        body.update(SAMPLED)
    if chat:
        messages = request if isinstance(request, list) else [{"role": "user", "content": request}]
        body["messages"] = messages
    else:
        body["prompt"] = plain_text(request) if isinstance(request, list) else request
    path = "/v1/chat/completions" if chat else "/v1/completions"
    reply = httpx.post(f"{url}{path}", json=body, timeout=600).json()
    choice, timings = reply["choices"][0], reply["timings"]
    text = choice["message"]["content"] if chat else choice["text"]
    return text or "", timings["predicted_n"], timings["predicted_ms"]


KINDS = ("specgen", "specgen, no cache", "llama-server")


def workload_speeds(
    pair: str, temperature: float, requests: list[object], n: int, kinds: tuple[str, ...] = KINDS
) -> dict[str, float]:
    target, draft = pair_files(pair)
    chat = pair in CHAT  # the pair's target has a chat template
    servers = {kind: start(kind, target, draft) for kind in kinds}
    totals = {kind: [0, 0.0] for kind in kinds}
    answers: dict[str, str] = {}
    try:
        for i, request in enumerate(requests):
            order = kinds[i % len(kinds) :] + kinds[: i % len(kinds)]
            for kind in order:
                prompt = request(answers.get(kind, "")) if callable(request) else request
                text, tokens, ms = ask(servers[kind][1], prompt, temperature, i, n, chat)
                answers[kind] = text
                totals[kind][0] += tokens
                totals[kind][1] += ms
    finally:
        for proc, _ in servers.values():
            proc.send_signal(signal.SIGTERM)
        for proc, _ in servers.values():
            proc.wait(timeout=60)
    return {kind: tokens / (ms / 1000) for kind, (tokens, ms) in totals.items()}


def memory() -> None:
    import numpy as np

    from specgen.drafters import SuffixCache

    rng = np.random.default_rng(0)
    for total in (10_000, 100_000):
        tracemalloc.start()
        cache = SuffixCache(max_tokens=10 * total)
        for _ in range(total // 500):  # documents of 500 tokens, a 49k vocabulary
            cache.add(rng.integers(0, 49_152, 500).tolist())
        current, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        started = time.perf_counter()
        for _ in range(1000):
            cache.candidate(rng.integers(0, 49_152, 64).tolist())
        lookup = (time.perf_counter() - started) / 1000
        print(
            f"{cache.tokens:>7} cached tokens: {current / 1e6:.1f} MB "
            f"({current / cache.tokens:.0f} bytes a token), {lookup * 1e6:.0f} us a lookup"
        )


def again(pair: str, n: int) -> None:
    """The same request three times in one process (the API, as `serve` runs it): tokens/s
    and where the guesses came from, with the cache and without."""
    from specgen.api import Specgen

    target, draft = pair_files(pair)
    prompt = "Write a short story about a lighthouse keeper, in five sentences."
    for cache in (True, False):
        sg = Specgen(target=target, draft=draft, threads=2, lookup_cache=cache)
        for i in range(3):
            stats = sg.generate(prompt, max_tokens=n, temperature=0).stats
            sources = ", ".join(f"{k} {v.accepted}/{v.drafted}" for k, v in stats.by_source.items())
            print(
                f"{pair:8} cache {'on ' if cache else 'off'} request {i + 1}: "
                f"{stats.tokens_per_second or 0:6.1f} tok/s ({sources})",
                flush=True,
            )
        sg.pair.target.close()


class Recorder:
    """A cache that guesses nothing and keeps each generation's tokens (prompt and answer)."""

    def __init__(self) -> None:
        self.docs: list[list[int]] = []
        self.changed, self.tokens, self.seconds = False, 0, 0.0

    def add(self, tokens: list[int]) -> None:
        self.docs.append(list(tokens))

    def candidate(self, context: object, guesses: object = ()) -> None:
        return None


class Oracle(Recorder):
    """The bound on a suffix cache: it knows each request's whole token sequence (a greedy run
    without the cache recorded them; greedy is the target's own output whatever guesses) and
    guesses the longest run of what comes next that occurs in the earlier requests' text."""

    def __init__(self, expected: list[list[int]], shortest: int = 1) -> None:
        super().__init__()
        self.expected, self.shortest = expected, shortest
        self.history = ""  # the earlier requests' tokens, one character each, "\0" between

    def add(self, tokens: list[int]) -> None:
        super().add(tokens)
        self.history += "\0" + "".join(chr(t + 1) for t in tokens)

    def candidate(self, context: list[int], guesses: list[int] = ()) -> object:
        from specgen.drafters.base import Candidate

        if len(self.docs) >= len(self.expected):
            return None
        doc, seen = self.expected[len(self.docs)], [*context, *guesses]
        if doc[: len(seen)] != seen:
            return None  # guesses off the answer (the engine verifies them): no oracle here
        future = "".join(chr(t + 1) for t in doc[len(seen) : len(seen) + 32])
        n = 0
        while n < len(future) and future[: n + 1] in self.history:
            n += 1
        if n < max(1, self.shortest):
            return None
        tokens = tuple(ord(c) - 1 for c in future[:n])
        return Candidate("cache", "oracle", n, tokens, match_length=64)


class ArgmaxOracle(Recorder):
    """The bound on a suffix cache when sampling: its guesses are point masses, kept with the
    target's probability of them, so none does better than the target's likeliest token at
    each step. This one guesses the target's greedy continuation (a copy of the target computes
    it) wherever it is asked, whether earlier text holds it or not; its own time is left out."""

    def __init__(self, target: str, length: int = 12) -> None:
        from specgen.backend import ModelOptions
        from specgen.session.pair import BACKEND

        super().__init__()
        self.model = BACKEND.load(Path(target), ModelOptions(n_ctx=4096, n_threads=2), False)
        self.length, self.fed = length, []
        self._last: tuple[tuple[int, ...], object] = ((), None)

    def candidate(self, context: list[int], guesses: list[int] = ()) -> object:
        from specgen.core.sampling import best
        from specgen.drafters.base import Candidate

        if guesses:
            return None  # a cycle's first candidate only: not where a model's guesses lead
        seen = tuple(context)
        if self._last[0] == seen:
            return self._last[1]
        started = time.perf_counter()
        keep = 0
        while keep < min(len(self.fed), len(seen) - 1) and self.fed[keep] == seen[keep]:
            keep += 1
        self.model.rollback(keep)
        rows = self.model.decode(list(seen[keep:]))
        chain: list[int] = []
        for _ in range(self.length):
            token = int(best(rows[-1]))
            chain.append(token)
            if self.model.is_eog(token):
                break
            rows = self.model.decode([token])
        self.fed = [*seen, *chain[:-1]]
        found = Candidate("cache", "oracle", len(chain), tuple(chain))
        self._last = (seen, found)
        self.seconds += time.perf_counter() - started
        return found


def bound(pair: str, workload: str, n: int, temperature: float = 0.0, shortest: int = 1) -> None:
    """The workload in one process, without the cache, with it and with the oracle (greedy:
    ``Oracle``; sampling: ``ArgmaxOracle``), request by request (rotating which goes first):
    tokens/s and where the guesses came from."""
    from specgen.api import Specgen

    target, draft = pair_files(pair)
    requests = WORKLOADS[workload]()
    chat = pair in CHAT
    ways = {
        way: Specgen(target=target, draft=draft, threads=2, lookup_cache=way != "off", chat=chat)
        for way in ("off", "cache", "oracle")
    }

    def prompt_of(request: object, answer: str) -> object:
        prompt = request(answer) if callable(request) else request
        return plain_text(prompt) if isinstance(prompt, list) and not chat else prompt

    recorder = Recorder()
    ways["off"].pair.lookup = recorder
    answer = ""
    settings = {"max_tokens": n, "temperature": temperature, "seed": 0}
    if temperature:
        settings.update(SAMPLED)
    for request in requests:  # a first pass records what the target answers (and warms up)
        answer = ways["off"].generate(prompt_of(request, answer), **settings).text
    ways["off"].pair.lookup = Recorder()  # (its engine, made above, keeps the first one)
    ways["cache"].pair.lookup.clear()
    oracle: Recorder = Oracle(recorder.docs, shortest) if not temperature else ArgmaxOracle(target)
    ways["oracle"].pair.lookup = oracle
    # The oracle's own time (a copy of the target's decodes) stopped on its pair's clock: it is
    # no cache's cost, so neither the policy nor the figure sees it.
    ways["oracle"].pair.clock = lambda: time.perf_counter() - oracle.seconds
    totals = {way: [0, 0.0] for way in ways}
    answers = dict.fromkeys(ways, "")
    names = list(ways)
    for i, request in enumerate(requests):
        row = []
        for way in names[i % 3 :] + names[: i % 3]:
            result = ways[way].generate(prompt_of(request, answers[way]), **{**settings, "seed": i})
            stats = result.stats
            answers[way] = result.text
            totals[way][0] += stats.n_generated
            totals[way][1] += stats.gen_seconds
            sources = ",".join(f"{k} {v.accepted}/{v.drafted}" for k, v in stats.by_source.items())
            rate = stats.n_generated / stats.gen_seconds
            row.append(f"{way} {rate:6.1f} ({stats.n_cycles} cycles; {sources})")
        texts = {answers[w] for w in names}
        print(
            f"{pair} {workload} #{i + 1}: "
            + " | ".join(sorted(row))
            + ("" if len(texts) == 1 else "  TEXTS DIFFER"),
            flush=True,
        )
    speed = {way: t / s for way, (t, s) in totals.items()}
    print(
        f"{pair:8} {workload:10} T={temperature} (oracle's shortest {shortest}), in process: "
        f"off {speed['off']:6.1f}  cache "
        f"{speed['cache']:6.1f}  oracle {speed['oracle']:6.1f} tok/s;  cache/off "
        f"{speed['cache'] / speed['off']:.2f}x, oracle/off {speed['oracle'] / speed['off']:.2f}x",
        flush=True,
    )
    for sg in ways.values():
        sg.pair.target.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", action="append", choices=sorted(PAIRS))
    parser.add_argument("--temperature", action="append", type=float)
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--again", action="store_true", help="one request sent three times")
    parser.add_argument("--no-peer", action="store_true", help="leave llama-server out")
    parser.add_argument("--bound", action="store_true", help="the cache against an oracle")
    parser.add_argument("--aa", action="store_true", help="two servers without the cache")
    parser.add_argument("--workload", action="append", choices=("repeating", "fresh"))
    parser.add_argument(
        "--shortest", type=int, default=1, help="the oracle's shortest run guessed (greedy)"
    )
    args = parser.parse_args()
    kinds = KINDS[:2] if args.no_peer else KINDS
    if args.memory:
        memory()
        return
    if args.aa:  # two servers alike: how far apart the same setting reads here
        for pair in args.pair or sorted(PAIRS):
            for temperature in args.temperature or [0.0, 0.8]:
                for name in args.workload or ["fresh"]:
                    requests = WORKLOADS[name]()
                    twins = (KINDS[1], f"{KINDS[1]}, again")
                    a, b = workload_speeds(pair, temperature, requests, args.n, twins).values()
                    print(
                        f"{pair:8} T={temperature:<4} {name:10} A/A {a:6.1f} {b:6.1f} {a / b:.2f}x",
                        flush=True,
                    )
        return
    if args.bound:
        for pair in args.pair or sorted(PAIRS):
            for workload in args.workload or ["repeating"]:
                for temperature in args.temperature or [0.0]:
                    bound(pair, workload, args.n, temperature, args.shortest)
        return
    if args.again:
        for pair in args.pair or sorted(PAIRS):
            again(pair, args.n)
        return
    rows = []
    for pair in args.pair or sorted(PAIRS):
        for temperature in args.temperature or [0.0, 0.8]:
            for name, workload in WORKLOADS.items():
                requests = workload()
                speeds = workload_speeds(pair, temperature, requests, args.n, kinds)
                cache, off = speeds[KINDS[0]], speeds[KINDS[1]]
                peer = speeds.get(KINDS[2])
                rows.append((pair, temperature, name, cache, off, peer))
                against = (
                    f"llama-server {peer:6.1f}  specgen/llama-server {cache / peer:.2f}x"
                    if peer
                    else ""
                )
                print(
                    f"{pair:8} T={temperature:<4} {name:10} specgen {cache:6.1f}  no cache "
                    f"{off:6.1f}  cache/no {cache / off:.2f}x  {against}",
                    flush=True,
                )
    print(json.dumps(rows))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
