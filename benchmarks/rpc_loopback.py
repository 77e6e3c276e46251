"""The target over RPC against the target here, side by side on one machine (a `specgen worker`
on 127.0.0.1): tokens/s of the target alone and of speculative K=8 (the draft model alone, no
n-grams), each locally and over one worker (output layer here, and on the worker), alternated
round by round so drift hits all alike; and the bytes each verify moves, with and without the
target's output layer kept on this machine (a counting proxy in front of the worker; per verify
= the difference between a long and a short run over their cycles, so loading cancels out).

    python benchmarks/rpc_loopback.py --pair smollm2-135m-demo -n 128 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.rpc_helpers import CountingProxy, worker  # noqa: E402

PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain in a few sentences why the sky is blue.",
    "List ten countries in Europe and their capital cities.",
]


def run(pair: str, k: int, n: int, prompt: str, threads: int, *extra: str) -> dict:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "specgen",
            "run",
            "--pair",
            pair,
            "-k",
            str(k),
            "--no-ngram",
            "--temperature",
            "0",
            "-n",
            str(n),
            "--threads",
            str(threads),
            "--json",
            *extra,
            prompt,
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise SystemExit(done.stderr)
    return json.loads(done.stdout)["stats"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="smollm2-135m-demo")
    parser.add_argument("-n", "--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {}
    with worker(threads=args.threads) as (endpoint, _):
        for _ in range(args.rounds):
            for prompt in PROMPTS:
                whole = ("--rpc", endpoint, "--no-rpc-local-head")
                for name, k, extra in (
                    ("local, target alone", 0, ()),
                    ("local, K=8", 8, ()),
                    ("RPC, target alone", 0, ("--rpc", endpoint)),
                    ("RPC, K=8", 8, ("--rpc", endpoint)),
                    ("RPC head there, alone", 0, whole),
                    ("RPC head there, K=8", 8, whole),
                ):
                    stats = run(args.pair, k, args.max_tokens, prompt, args.threads, *extra)
                    rates.setdefault(name, []).append(stats["tokens_per_second"])
        traffic = {}
        for head in ("--rpc-local-head", "--no-rpc-local-head"):
            moved = []
            for n in (16, 16 + args.max_tokens):
                proxy = CountingProxy(endpoint)
                try:
                    stats = run(
                        args.pair, 8, n, PROMPTS[0], args.threads, "--rpc", proxy.endpoint, head
                    )
                    moved.append((*proxy.counts(), stats["cycles"]))
                finally:
                    proxy.close()
            (sent0, got0, cycles0), (sent1, got1, cycles1) = moved
            traffic[head] = (
                (sent1 - sent0) / (cycles1 - cycles0),
                (got1 - got0) / (cycles1 - cycles0),
            )
    median = {name: statistics.median(values) for name, values in rates.items()}
    print(
        f"{args.pair}, {args.max_tokens} tokens, greedy, {args.threads} threads, "
        f"{args.rounds} rounds x {len(PROMPTS)} prompts (medians):"
    )
    for name, value in median.items():
        print(f"  {name:22s} {value:6.1f} tok/s")
    print(f"  K=8 over RPC / K=8 locally:        {median['RPC, K=8'] / median['local, K=8']:.2f}")
    print(
        f"  speedup of K=8, locally:           "
        f"{median['local, K=8'] / median['local, target alone']:.2f}x"
    )
    print(
        f"  speedup of K=8, over RPC:          "
        f"{median['RPC, K=8'] / median['RPC, target alone']:.2f}x"
    )
    print(
        f"  the same, output layer on the worker: "
        f"{median['RPC head there, K=8'] / median['local, K=8']:.2f} of local K=8, speedup "
        f"{median['RPC head there, K=8'] / median['RPC head there, alone']:.2f}x"
    )
    for head, (sent, got) in traffic.items():
        print(f"  per verify {head:20s} {sent / 1024:8.1f} KiB sent, {got / 1024:8.1f} KiB back")


if __name__ == "__main__":
    main()
