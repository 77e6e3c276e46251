"""A round of prompts in one process (``Specgen(parallel=N).generate_many``), `-k auto` against
`-k 0` side by side: aggregate tokens per second, and where the time went, pass by pass.

Nothing joins the batch after its last prompt has started, so the round takes as long as its
slowest sequence (``BatchLoad.closed``). Each mode has its own loaded pair; the modes take turns,
``--rounds`` times, so a machine that gets busier weighs on both alike. Per run: tokens/s, the
target's passes, the tokens in them (a guess is one), the seconds inside the target's passes,
the draft model's passes (its steps and reads: tokens and seconds), and the median seconds of
each target pass shape (sequences, tokens) seen at least three times.

    python benchmarks/closed_round.py --target T.gguf --draft D.gguf [--parallel 8]
        [--prompts 8] [-n 128] [--rounds 3] [--temperature 0]

Run it with a fresh ``SPECGEN_CACHE`` to start from nothing remembered.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from concurrency import PROMPTS  # noqa: E402

from specgen.api import Specgen  # noqa: E402
from specgen.engine import streams  # noqa: E402

_passes: list[tuple[int, int, float]] = []  # each target pass: sequences, tokens, seconds
_drafts: list[tuple[int, float]] = []  # each draft pass: tokens, seconds


def _traced() -> None:
    counted = streams.Streams._count

    def count(self: Any, context: Any, batch: list[Any], seconds: float, ended: float) -> None:
        tokens = sum(len(p.tokens) for p in batch)
        if context is self.target:
            _passes.append((len(batch), tokens, seconds))
        else:
            _drafts.append((tokens, seconds))
        counted(self, context, batch, seconds, ended)

    streams.Streams._count = count  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--parallel", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=8, help="prompts in the round")
    parser.add_argument("-n", "--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    _traced()
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.prompts)]
    pairs = {
        mode: Specgen(
            target=args.target,
            draft=args.draft,
            parallel=args.parallel,
            threads=args.threads,
            lookahead=lookahead,
            lookup_cache=False,
        )
        for mode, lookahead in (("auto", "auto"), ("k0", 0))
    }
    rates: dict[str, list[float]] = defaultdict(list)
    for _ in range(args.rounds):
        for mode, pair in pairs.items():
            _passes.clear()
            _drafts.clear()
            started = time.perf_counter()
            results = pair.generate_many(
                prompts, max_tokens=args.max_tokens, temperature=args.temperature
            )
            seconds = time.perf_counter() - started
            made = sum(r.stats.n_generated for r in results)
            rates[mode].append(made / seconds)
            shapes: dict[tuple[int, int], list[float]] = defaultdict(list)
            for size, tokens, took in _passes:
                shapes[(size, tokens)].append(took)
            common = {
                shape: f"{len(times)}x {1e3 * statistics.median(times):.1f} ms"
                for shape, times in sorted(shapes.items())
                if len(times) >= 3
            }
            print(
                f"{mode:4}  {made / seconds:6.1f} tok/s  {seconds:5.2f} s  passes {len(_passes)}"
                f"  tokens in them {sum(t for _, t, _ in _passes)}"
                f"  in the target {sum(s for _, _, s in _passes):5.2f} s"
                f"  draft passes {len(_drafts)} of {sum(t for t, _ in _drafts)} tokens"
                f" in {sum(s for _, s in _drafts):4.2f} s  {common}",
                flush=True,
            )
    ratios = [a / b for a, b in zip(rates["auto"], rates["k0"], strict=True)]
    print(
        f"auto / k0 per round: {', '.join(f'{r:.3f}' for r in ratios)}; "
        f"geometric mean {statistics.geometric_mean(ratios):.3f}"
    )


if __name__ == "__main__":
    main()
