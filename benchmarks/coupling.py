"""What a seed costs: the Gumbel-max rule (the text a function of seed and position) against the
min(1, p/q) rule, on one pair, side by side in one run.

For each temperature, each prompt and each seed, the two rules run one after the other at the
same K; the table gives each rule's acceptance of the draft's guesses and tokens/s, and their
ratio. Then, for the Gumbel rule, whether each seed's text is the same at K 1, 4, 8 and auto.

    python benchmarks/coupling.py --target T.gguf --draft D.gguf --seeds 4 -n 48
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specgen.api import Specgen  # noqa: E402
from specgen.bench.prompts import BUILTIN_PROMPTS  # noqa: E402

PROMPTS = [BUILTIN_PROMPTS[0], BUILTIN_PROMPTS[11], BUILTIN_PROMPTS[13]]  # explain, list, story


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("-n", "--max-tokens", type=int, default=48)
    parser.add_argument("-k", "--lookahead", default="4")
    parser.add_argument("--temperatures", default="0.7,0.8,1.0")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    k: int | str = int(args.lookahead) if args.lookahead.isdigit() else args.lookahead
    sg = Specgen(target=args.target, draft=args.draft, threads=args.threads)
    rows = []
    print("| T | rule | accept | tokens/s | accept ratio | tokens/s ratio |")
    print("| --- | --- | --- | --- | --- | --- |")
    for temperature in (float(t) for t in args.temperatures.split(",")):
        sums = {r: {"drafted": 0, "accepted": 0, "tokens": 0, "seconds": 0.0} for r in RULES}
        for prompt in PROMPTS:
            for seed in range(args.seeds):
                for rule in RULES:  # side by side: one rule, then the other
                    done = sg.generate(
                        prompt,
                        temperature=temperature,
                        seed=seed,
                        max_tokens=args.max_tokens,
                        lookahead=k,
                        coupling=rule,
                    )
                    stats = done.stats
                    assert stats.coupling == rule
                    s = sums[rule]
                    s["drafted"] += stats.n_drafted
                    s["accepted"] += stats.n_accepted
                    s["tokens"] += stats.n_generated
                    s["seconds"] += stats.elapsed()
        figures = {
            r: (s["accepted"] / max(1, s["drafted"]), s["tokens"] / s["seconds"])
            for r, s in sums.items()
        }
        for rule in RULES:
            accept, speed = figures[rule]
            ratio_a = accept / figures["residual"][0]
            ratio_s = speed / figures["residual"][1]
            print(
                f"| {temperature} | {rule} | {accept:.3f} | {speed:.1f} | {ratio_a:.3f} "
                f"| {ratio_s:.3f} |"
            )
            rows.append({"temperature": temperature, "rule": rule, "accept": accept, "tps": speed})
    same = total = 0
    started = time.monotonic()
    for prompt in PROMPTS:
        for seed in range(args.seeds):
            texts = {
                str(kk): sg.generate(
                    prompt, temperature=0.8, seed=seed, max_tokens=args.max_tokens, lookahead=kk
                ).text
                for kk in (1, 4, 8, "auto")
            }
            total += 1
            same += len(set(texts.values())) == 1
            if len(set(texts.values())) != 1:
                print(f"differs: seed {seed}, {prompt[:40]!r}: {json.dumps(texts)[:300]}")
    print(
        f"\nGumbel rule, T 0.8: the same text at K 1, 4, 8 and auto for {same} of {total} "
        f"(prompt, seed) ({time.monotonic() - started:.0f} s)"
    )
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "same": same, "total": total}, indent=1))


RULES = ("residual", "gumbel")

if __name__ == "__main__":
    main()
