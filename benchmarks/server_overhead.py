"""Server overhead, side by side on one machine: tokens/s through `specgen serve` (one client,
non-streaming, timed by the client) against `specgen run` on the same prompts and models (its
own prompt + generation time, so neither side pays process start or model loading); and how a
second chat turn's time to first token drops when the server reuses the first turn's cache.

    python benchmarks/server_overhead.py --target T.gguf --draft D.gguf -n 128 --rounds 4
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import statistics
import subprocess
import sys
import time

PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain in a few sentences why the sky is blue.",
    "Give a step-by-step recipe for a simple tomato soup.",
    "List ten countries in Europe and their capital cities.",
]


def main() -> None:
    import httpx2 as httpx

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("-n", "--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--ttft-only",
        action="store_true",
        help="measure only the second chat turn's time to first token",
    )
    args = parser.parse_args()
    models = ["--target", args.target, "--draft", args.draft, "--threads", str(args.threads)]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "specgen", "serve", *models, "--port", str(port)],
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    # One client for every request, as real clients keep one (a new one costs ~20 ms here).
    client = httpx.Client(timeout=600)
    while True:
        try:
            httpx.get(f"{url}/health", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.2)
    try:
        if args.ttft_only:
            ttft(url, client)
            return
        served, ran, served_gen, ran_gen = [], [], [], []
        for _ in range(args.rounds):
            for prompt in PROMPTS:  # alternate the two, so drift hits both alike
                body = {
                    "messages": [{"role": "user", "content": prompt}],
                    "temperature": 0,
                    "max_tokens": args.max_tokens,
                }
                started = time.perf_counter()
                answer = client.post(f"{url}/v1/chat/completions", json=body).json()
                served.append(
                    answer["usage"]["completion_tokens"] / (time.perf_counter() - started)
                )
                served_gen.append(answer["timings"]["predicted_per_second"])
                done = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "specgen",
                        "run",
                        prompt,
                        *models,
                        "--temperature",
                        "0",
                        "-n",
                        str(args.max_tokens),
                        "--json",
                    ],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                stats = json.loads(done.stdout)["stats"]
                ran.append(
                    stats["generated_tokens"]
                    / (stats["prompt_seconds"] + stats["generation_seconds"])
                )
                ran_gen.append(stats["tokens_per_second"])
        print(f"tokens/s, {len(served)} requests each, -n {args.max_tokens}:")
        print(f"  server (client-timed): median {statistics.median(served):.1f}")
        print(f"  specgen run:           median {statistics.median(ran):.1f}")
        print(f"  server / run:          {statistics.median(served) / statistics.median(ran):.3f}")
        print(
            f"generation alone (prompt excluded), server / run: "
            f"{statistics.median(served_gen) / statistics.median(ran_gen):.3f}"
        )
        ttft(url, client)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait()


def ttft(url: str, client: object) -> None:
    """Time to the first text of a second chat turn: with the first turn cached, and cold
    (another conversation in between replaced the cache). The second turn sends back turn one's
    answer as the model wrote it, as chat clients do."""
    context = (
        "Here are my notes from the meeting. " + "We discussed the budget, the "
        "timeline and the hiring plan for the next quarter in detail. " * 25
    )
    first = [{"role": "user", "content": context + "Summarize them in one line."}]

    def ask(messages: list[dict]) -> tuple[float, dict, str]:
        started, seen, final, text = time.perf_counter(), None, {}, []
        with client.stream(
            "POST",
            f"{url}/v1/chat/completions",  # type: ignore[attr-defined]
            json={"messages": messages, "temperature": 0, "max_tokens": 16, "stream": True},
        ) as stream:
            for line in stream.iter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    piece = chunk["choices"][0]["delta"].get("content")
                    if seen is None and piece:
                        seen = time.perf_counter() - started
                    text.append(piece or "")
                    final = chunk
        return seen or 0.0, final, "".join(text)

    warm, cold, share = [], [], []
    for _ in range(3):
        _, _, reply = ask(first)
        second = [
            *first,
            {"role": "assistant", "content": reply},
            {"role": "user", "content": "Now list the three topics."},
        ]
        seconds, final, _ = ask(second)
        warm.append(seconds)
        share.append(final["timings"]["cache_n"] / final["usage"]["prompt_tokens"])
        ask([{"role": "user", "content": "Say hello."}])  # another conversation: cache gone
        seconds, _, _ = ask(second)
        cold.append(seconds)
    w, c = statistics.median(warm), statistics.median(cold)
    print(
        f"second chat turn, time to first token (median of 3): cold {c * 1000:.0f} ms, "
        f"reusing turn one {w * 1000:.0f} ms: {1 - w / c:.0%} less; "
        f"{statistics.median(share):.0%} of its prompt was reused"
    )


if __name__ == "__main__":
    main()
