"""`-k auto` against fixed K's with no timing noise: the policy replayed on real greedy acceptance.

Greedy, guess j of a cycle that starts at text position m survives exactly when the draft's own
choice after the target's text so far matches the target's token at m, m+1, ..., m+j-1 (a kept
guess is the target's token, so the draft reads the same prefix either way). So one target run
per prompt and one draft pass over its text tell how many guesses any cycle at any K keeps, and
a policy can be replayed over them cycle by cycle. Each cycle is charged what `-k auto` measured
on this machine for these models (the costs it remembers: seconds per draft guess, the verify
pass by length), and the policy learns from those same figures. What is left is the policy's
own choice: the K it picks from what it has seen, against each fixed K, prompt by prompt, with
none of the timing noise of real runs (on a shared 2-core machine the same K measured twice read
0.94-1.14 of itself prompt by prompt). Draft-model guesses only (no prompt lookup); the 13
built-in bench prompts.

    python benchmarks/replay_policy.py TARGET.gguf DRAFT.gguf [-k 2,4,8,12,16] [--chat]
        [--threads 2] [-n 128] [--costs FILE]

The costs are those `specgen run -k auto` or `specgen bench` left for these models with these
threads (run one of them first), or a JSON file as `-k auto` keeps them (`--costs`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from specgen.bench.prompts import BUILTIN_KINDS, BUILTIN_PROMPTS
from specgen.core.sampling import DEFAULT_SAMPLING
from specgen.drafters import TARGET_ALONE, Candidate
from specgen.engine import CycleDone, GenerationConfig, SpeculativeEngine
from specgen.lookahead import (
    AdaptiveLookahead,
    CostBook,
    FixedLookahead,
    LookaheadPolicy,
    PairProfile,
)
from specgen.session.generate import prompt_tokens
from specgen.session.pair import PairOptions, load_pair

MODEL = Candidate("model", "model", 1_000_000)


def survivals(target, draft, prompt: list[int], max_tokens: int) -> list[int]:
    """The target's greedy text after ``prompt``; for each position m, how many guesses a cycle
    that starts there keeps at most (the draft's run of right choices from m on)."""
    greedy = replace(DEFAULT_SAMPLING, temperature=0.0)
    text: list[int] = []
    config = GenerationConfig(lookahead=0, sampling=greedy, max_tokens=max_tokens, seed=0)
    for event in SpeculativeEngine(target).generate(prompt, config):
        if isinstance(event, CycleDone):
            text.extend(event.tokens)
    draft.reset()
    rows = draft.decode(prompt + text[:-1], len(text))
    right = [int(np.argmax(rows[i])) == text[i] for i in range(len(text))]
    runs = [0] * (len(text) + 1)
    for m in range(len(text) - 1, -1, -1):
        runs[m] = runs[m + 1] + 1 if right[m] else 0
    return runs[:-1]


def replay(
    policy: LookaheadPolicy, runs: list[int], world: PairProfile, max_tokens: int
) -> tuple[float, list[int]]:
    """Tokens per second of ``policy`` over one prompt's text, and the K of each cycle."""
    policy.begin()
    guess = world.guess("model") or 0.0
    m, seconds, chosen = 1, 0.0, []  # the prompt's own pass gives the first token
    while m < len(runs):
        budget = max_tokens - m - 1
        plan = policy.plan([MODEL], budget) if budget > 0 else TARGET_ALONE
        k = plan.lookahead
        kept = min(k, runs[m])
        draft_s, verify_s = k * guess, world.verify(k + 1) or 0.0
        policy.observe(plan, k, kept, draft_s, verify_s)
        seconds += draft_s + verify_s
        chosen.append(k)
        m += kept + 1
    return len(runs) / seconds, chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target")
    parser.add_argument("draft")
    parser.add_argument("-k", "--lookaheads", default="2,4,6,8,10,12,16")
    parser.add_argument("-n", "--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--chat", action="store_true", help="wrap prompts in the chat template")
    parser.add_argument("--costs", type=Path, help="costs as -k auto keeps them (JSON)")
    args = parser.parse_args()
    pair = load_pair(
        args.target,
        args.draft,
        PairOptions(target_threads=args.threads, draft_threads=args.threads),
    )
    path = args.costs or pair.costs_file
    try:
        world = CostBook.restore(json.loads(path.read_text())).greedy
    except (OSError, ValueError):
        sys.exit(
            f"no costs at {path}: run `specgen run -k auto --threads {args.threads}` (or "
            "bench) on these models first, or give --costs"
        )
    if world.guess("model") is None or world.verify(1) is None:
        sys.exit(f"{path} holds no greedy costs for a draft model")
    fixed = [int(k) for k in args.lookaheads.split(",")]
    prompts = [prompt_tokens(pair.target, p, args.chat) for p in BUILTIN_PROMPTS]
    texts = [survivals(pair.target, pair.draft, p, args.max_tokens) for p in prompts]
    alone = 1.0 / (world.verify(1) or 1.0)
    # The policy starts from what the costs file holds (as every run after the first does),
    # and carries what it learns from prompt to prompt, as one process would.
    learned = PairProfile.restore(world.snapshot())
    rows: dict[str, list[float]] = {**{str(k): [] for k in fixed}, "auto": [], "auto/best": []}
    for kind, runs in zip(BUILTIN_KINDS, texts, strict=True):
        speed = {
            str(k): replay(FixedLookahead(k), runs, world, args.max_tokens)[0] / alone
            for k in fixed
        }
        auto, chosen = replay(AdaptiveLookahead(learned), runs, world, args.max_tokens)
        speed["auto"] = auto / alone
        best = max(speed[str(k)] for k in fixed)
        speed["auto/best"] = speed["auto"] / best
        for name, value in speed.items():
            rows[name].append(value)
        kept = sum(1 for r in runs if r) / len(runs)
        print(
            f"{kind:10s} {len(runs):3d} tokens, draft right {kept:4.0%}  "
            + " ".join(f"{k}:{speed[str(k)]:.2f}" for k in fixed)
            + f"  auto:{speed['auto']:.2f} (mean K {statistics.mean(chosen):.1f})"
            + f"  auto/best {speed['auto/best']:.2f}",
            flush=True,
        )
    print("mean   " + " ".join(f"{name}:{statistics.mean(v):.3f}" for name, v in rows.items()))
    print(
        f"auto/best per prompt: median {statistics.median(rows['auto/best']):.3f}, "
        f"worst {min(rows['auto/best']):.3f}"
    )


if __name__ == "__main__":
    main()
