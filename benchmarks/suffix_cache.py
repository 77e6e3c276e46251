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
    from specgen.registry import Registry, cached

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
        if kind == "specgen, no cache":
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
        body.update(top_k=40, top_p=0.95, min_p=0.05)
    if chat:
        messages = request if isinstance(request, list) else [{"role": "user", "content": request}]
        body["messages"] = messages
    else:
        if isinstance(request, list):  # a base model: the conversation as plain text
            request = "\n\n".join(str(m["content"]) for m in request) + "\n\n"
        body["prompt"] = request
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", action="append", choices=sorted(PAIRS))
    parser.add_argument("--temperature", action="append", type=float)
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--again", action="store_true", help="one request sent three times")
    parser.add_argument("--no-peer", action="store_true", help="leave llama-server out")
    args = parser.parse_args()
    kinds = KINDS[:2] if args.no_peer else KINDS
    if args.memory:
        memory()
        return
    if args.again:
        for pair in args.pair or sorted(PAIRS):
            again(pair, args.n)
        return
    rows = []
    for pair in args.pair or sorted(PAIRS):
        for temperature in args.temperature or [0.0, 0.8]:
            for name, requests in (("repeating", repeating()), ("fresh", fresh())):
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
