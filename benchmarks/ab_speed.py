"""Tokens per second of two commits side by side, on the demo pairs: has a change slowed them?

Each commit is checked out into a temporary worktree; then, round by round, the same `specgen
run` commands (greedy by default, or sampled with one seed, so both commits write the same text)
run under one commit and then the other, alternating which goes first, so a machine that gets
busier or quieter mid-way weighs on both alike. Prints the median tokens per second of each and
their ratio (B / A).

    python benchmarks/ab_speed.py REV_A REV_B [--rounds 5] [-n 96] [--threads 2]
        [--temperature 0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = [
    ("smollm2-135m-demo", "4", "What is speculative decoding?"),
    ("smollm2-135m-demo", "auto", "Write a short poem about the sea."),
    ("gemma3-270m-demo", "4", "Once upon a time, in a small village,"),
    ("gemma3-270m-demo", "auto", "The history of the printing press"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("-n", "--max-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--temperature", default="0", help="0: greedy; else sampled, seed 1")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="specgen-ab-"))
    trees = {}
    for name, rev in (("A", args.a), ("B", args.b)):
        tree = work / name
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "-f", "--detach", str(tree), rev],
            check=True,
            capture_output=True,
        )
        trees[name] = tree
    models = Path(os.environ.get("SPECGEN_TEST_MODELS") or Path.home() / ".cache" / "specgen")
    rates: dict[tuple[str, int], list[float]] = {}
    try:
        for round_ in range(args.rounds):
            order = ["A", "B"] if round_ % 2 == 0 else ["B", "A"]
            for which in order:
                for i, (pair, k, prompt) in enumerate(RUNS):
                    home = work / f"home-{which}-{round_}-{i}"
                    cache = home / "cache"
                    cache.mkdir(parents=True)
                    for folder in ("pip", "derived"):
                        (cache / folder).symlink_to(models / folder, target_is_directory=True)
                    env = {
                        **os.environ,
                        "PYTHONPATH": str(trees[which]),
                        "SPECGEN_HOME": str(home),
                        "SPECGEN_CACHE": str(cache),
                    }
                    done = subprocess.run(
                        [sys.executable, "-m", "specgen", "run", "--pair", pair, "-k", k, "-n",
                         str(args.max_tokens), "--temperature", args.temperature, "--seed", "1",
                         "--threads", str(args.threads), "--json", prompt],
                        capture_output=True, text=True, env=env, cwd=home, check=True,
                    )  # fmt: skip
                    stats = json.loads(done.stdout)["stats"]
                    rates.setdefault((which, i), []).append(stats["tokens_per_second"])
    finally:
        for tree in trees.values():
            remove = ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)]
            subprocess.run(remove, capture_output=True)
    print(f"{'run':<48} {'A tok/s':>8} {'B tok/s':>8} {'B/A':>6}")
    ratios = []
    for i, (pair, k, _) in enumerate(RUNS):
        a, b = statistics.median(rates[("A", i)]), statistics.median(rates[("B", i)])
        ratios.append(b / a)
        print(f"{pair + ' -k ' + k:<48} {a:8.1f} {b:8.1f} {b / a:6.3f}")
    print(f"{'geometric mean':<48} {'':8} {'':8} {statistics.geometric_mean(ratios):6.3f}")


if __name__ == "__main__":
    main()
