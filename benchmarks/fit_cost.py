"""Host time ``-k auto``'s pass-cost curve takes a pass, by how many pass lengths it has seen.

A batch's target passes come in many lengths (a prompt's chunk beside the others' guesses), and
a long-running server accumulates them; ``costs.fit_passes`` takes a slope for every two
lengths. Each row times ``PairProfile.observe_pass`` and the eight ``verify`` reads ``auto``
makes between two passes, refitting after every pass (as before ``REFIT_LENGTHS``) and as
amortized now, side by side on the same synthetic timings. No model is loaded.

    python benchmarks/fit_cost.py [--lengths 20,60,150,300] [--passes 400]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from specgen.lookahead import costs
from specgen.lookahead.costs import PairProfile


def ms_per_pass(lengths: int, passes: int, every_pass: bool, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    saved = costs.REFIT_LENGTHS
    costs.REFIT_LENGTHS = 10**9 if every_pass else saved  # huge: a refit after every pass
    try:
        profile = PairProfile()
        for n in range(1, lengths + 1):
            for _ in range(3):
                profile.observe_pass(n, 0.03 + 0.002 * n * rng.uniform(0.9, 1.1))
        started = time.perf_counter()
        for _ in range(passes):
            n = int(rng.integers(1, lengths + 1))
            profile.observe_pass(n, 0.03 + 0.002 * n)
            for k in range(1, 9):
                profile.verify(8 + k)
        return 1e3 * (time.perf_counter() - started) / passes
    finally:
        costs.REFIT_LENGTHS = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="20,60,150,300", help="comma list")
    parser.add_argument("--passes", type=int, default=400)
    args = parser.parse_args()
    print("| lengths seen | refit every pass (ms/pass) | amortized (ms/pass) |")
    print("| --- | --- | --- |")
    for lengths in (int(n) for n in args.lengths.split(",")):
        before = ms_per_pass(lengths, args.passes, every_pass=True)
        after = ms_per_pass(lengths, args.passes, every_pass=False)
        print(f"| {lengths} | {before:.3f} | {after:.3f} |")


if __name__ == "__main__":
    main()
