"""`-k auto` against fixed K's, prompt by prompt, with the draft model alone (with --ngram: the
draft model and prompt lookup together, the hybrid, at every K): the 13 built-in bench prompts,
each at K=0, each fixed K and auto, one after the other on the same loaded models. Each auto run
learns its costs afresh, as the first `specgen run` on a pair does; with --remember it starts
from what the previous auto run left, as every later one does (the costs are kept between
processes). Greedy by default, where every variant writes the same text, so the ratios compare
like with like (at T > 0 the sampled texts differ with K, and one prompt's ratio says more about
the text than the policy).

    python benchmarks/auto_vs_fixed.py TARGET.gguf DRAFT.gguf -k 4,8 [--chat] [--remember]
        [--ngram] [--trace] [--only 0,5]
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

from specgen.bench.prompts import BUILTIN_KINDS, BUILTIN_PROMPTS
from specgen.core.sampling import DEFAULT_SAMPLING
from specgen.engine import CycleDone, Finished, GenerationConfig, SpeculativeEngine
from specgen.lookahead import CostBook
from specgen.session.generate import prompt_tokens
from specgen.session.pair import PairOptions, load_pair


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target")
    parser.add_argument("draft")
    parser.add_argument("-k", "--lookaheads", default="4,8", help="fixed K's to compare")
    parser.add_argument("-n", "--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--chat", action="store_true", help="wrap prompts in the chat template")
    parser.add_argument("--trace", action="store_true", help="print auto's cycles (K/kept)")
    parser.add_argument("--only", help="prompt numbers to run (0-based, comma-separated)")
    parser.add_argument(
        "--ngram",
        action="store_true",
        help="draft with the model and prompt lookup together (the hybrid)",
    )
    parser.add_argument(
        "--remember",
        action="store_true",
        help="auto starts from the costs the previous auto run left, as "
        "`specgen run` does once it has run on these models here",
    )
    args = parser.parse_args()
    pair = load_pair(
        args.target, args.draft, PairOptions.for_both(threads=args.threads), ngram=args.ngram
    )
    drafter = pair.drafter()  # the model alone, or with prompt lookup (the hybrid)
    sampling = replace(DEFAULT_SAMPLING, temperature=args.temperature)
    prompts = [prompt_tokens(pair.target, p, args.chat) for p in BUILTIN_PROMPTS]
    fixed = [int(k) for k in args.lookaheads.split(",")]

    remembered: dict = {}

    def run(k: int | str, prompt: list[int]) -> tuple[float, list[str]]:
        nonlocal remembered
        costs = CostBook.restore(remembered) if args.remember and k == "auto" else CostBook()
        engine = SpeculativeEngine(pair.target, drafter if k != 0 else None, costs=costs)
        cycles = []
        config = GenerationConfig(
            lookahead=k, sampling=sampling, max_tokens=args.max_tokens, seed=0
        )
        for event in engine.generate(prompt, config):
            if isinstance(event, CycleDone):
                cycles.append(f"{event.drafted}/{event.accepted}")
            if isinstance(event, Finished):
                if k == "auto":
                    remembered = engine.costs.snapshot()
                return float(event.stats.tokens_per_second or 0.0), cycles
        raise AssertionError("the engine always finishes")

    run(max(fixed), prompts[0])  # warm-up
    if args.remember:
        run("auto", prompts[0])  # what an earlier `specgen run` on these models left
    ratios: dict[str, list[float]] = {str(k): [] for k in fixed}
    ratios["auto"], ratios["auto/best"] = [], []
    chosen = {int(i) for i in args.only.split(",")} if args.only else set(range(len(prompts)))
    for number, (kind, prompt) in enumerate(zip(BUILTIN_KINDS, prompts, strict=True)):
        if number not in chosen:
            continue
        alone, _ = run(0, prompt)
        if not alone:  # the target ended at once (often a base-style prompt without --chat)
            print(f"{kind:10s} skipped: the target alone wrote nothing", flush=True)
            continue
        speedups = {str(k): run(k, prompt)[0] / alone for k in fixed}
        auto, cycles = run("auto", prompt)
        speedups["auto"] = auto / alone
        best = max(speedups[str(k)] for k in fixed)
        for name, value in speedups.items():
            ratios[name].append(value)
        ratios["auto/best"].append(speedups["auto"] / best)
        print(
            f"{kind:10s} "
            + " ".join(f"{name}:{value:.2f}x" for name, value in speedups.items())
            + f"  auto/best {speedups['auto'] / best:.2f}",
            flush=True,
        )
        if args.trace:
            print("    " + " ".join(cycles))
    for average in (statistics.median, statistics.mean):
        if not ratios["auto"]:
            break
        print(
            f"{average.__name__:6s} "
            + " ".join(f"{name}:{average(values):.3f}" for name, values in ratios.items())
        )
    if ratios["auto/best"]:
        print(f"auto/best: min {min(ratios['auto/best']):.2f}")


if __name__ == "__main__":
    main()
