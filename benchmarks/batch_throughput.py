"""Batch throughput: N prompts in one `specgen run -f` batch against N separate `specgen run`
calls, on the same models and settings, timed side by side (wall clock, whole processes). With
`--parallel P`: the batch with `--parallel P` against the same batch one prompt at a time.

    python benchmarks/batch_throughput.py --pair smollm2-135m-demo -n 32 --prompts 20
    python benchmarks/batch_throughput.py --pair smollm2-135m-demo -n 128 --prompts 64 --parallel 4

Prints both times and their ratio; the texts must agree (greedy), or it says so.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPTS = [f"Write one sentence about the number {i}." for i in range(1000)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="smollm2-135m-demo")
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("-n", "--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--parallel", type=int, help="the batch at --parallel P against P=1")
    args = parser.parse_args()
    common = [
        "--pair",
        args.pair,
        "--temperature",
        "0",
        "-n",
        str(args.max_tokens),
        "--threads",
        str(args.threads),
        "-k",
        "auto",
    ]
    prompts = PROMPTS[: args.prompts]
    specgen = [sys.executable, "-m", "specgen", "run"]
    subprocess.run([*specgen, "warm-up", *common, "--no-stats"], check=True, capture_output=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "prompts.txt"
        path.write_text("\n".join(prompts) + "\n")
        started = time.perf_counter()
        done = subprocess.run(
            [*specgen, "-f", str(path), "--each-line", *common, "--no-stats"],
            check=True,
            capture_output=True,
            text=True,
        )
        batch_seconds = time.perf_counter() - started
        batch = [json.loads(line)["text"] for line in done.stdout.splitlines()]
        if args.parallel:
            started = time.perf_counter()
            many = subprocess.run(
                [*specgen, "-f", str(path), "--each-line", *common, "--no-stats"]
                + ["--parallel", str(args.parallel)],
                check=True,
                capture_output=True,
                text=True,
            )
            parallel_seconds = time.perf_counter() - started
            texts = [json.loads(line)["text"] for line in many.stdout.splitlines()]
            print(f"{len(prompts)} prompts, -n {args.max_tokens}, pair {args.pair}")
            print(f"one at a time:    {batch_seconds:7.1f} s")
            print(f"--parallel {args.parallel}:     {parallel_seconds:7.1f} s")
            print(f"speedup:          {batch_seconds / parallel_seconds:7.2f}")
            if texts != batch:
                print(f"texts differ on {sum(a != b for a, b in zip(batch, texts))} prompts")
            return
    started = time.perf_counter()
    single = []
    for prompt in prompts:
        one = subprocess.run(
            [*specgen, prompt, *common, "--json"], check=True, capture_output=True, text=True
        )
        single.append(json.loads(one.stdout)["text"])
    single_seconds = time.perf_counter() - started
    print(f"{len(prompts)} prompts, -n {args.max_tokens}, pair {args.pair}")
    print(f"one batch:        {batch_seconds:7.1f} s")
    print(f"separate runs:    {single_seconds:7.1f} s")
    print(f"batch / separate: {batch_seconds / single_seconds:7.2f}")
    if batch != single:
        print(f"texts differ on {sum(a != b for a, b in zip(batch, single))} prompts")


if __name__ == "__main__":
    main()
