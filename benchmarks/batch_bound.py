"""What S streams can reach at most on this machine: the bound a many-streams figure is read
against where it falls short (issue 36).

It times the passes alone, nothing else: a target pass over S sequences of L tokens each
(``decode_together``, the verify of [last, L-1 guesses] for every sequence, each row read), and
the draft model's step over S sequences of one token. From those it works out, with no host,
scheduling or drafting time but the draft's steps:

- plain batching: S / V(S x 1) tokens per second (every stream one token a pass);
- speculation at K guesses a stream, each kept with probability alpha:
  S * E(alpha, K) / (K * D(S) + V(S x (K + 1))), E = (1 - alpha^(K+1)) / (1 - alpha), for the
  draft model's guesses; S * E(alpha, K) / V(S x (K + 1)) for guesses that cost nothing to make
  (prompt lookup, the suffix cache), the best K of those given;
- one stream the same way (S = 1), so a figure's "x its own one-stream rate" has its bound too.

Each time is the median of ``--repeats`` passes after a warm-up, the caches cut back after each.

    python benchmarks/batch_bound.py TARGET DRAFT [-s 1,4] [-k 1,2,4,8] [--alpha 0.8,0.9]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specgen.backend import LlamaModel, ModelOptions  # noqa: E402
from specgen.core.speculative import expected_tokens  # noqa: E402

PROMPT = "The history of the Roman Empire is long, and it begins with a small city on a river"


def timed_pass(model: LlamaModel, streams: int, tokens: list[int], repeats: int) -> float:
    """Median seconds of one pass over ``streams`` sequences of ``tokens`` each, every row
    read, after a warm-up; each sequence's cache is cut back to where it was after each."""
    sequences = [model.sequence(i) for i in range(streams)]
    starts = [s.n_past for s in sequences]
    times = []
    for attempt in range(repeats + 1):
        items = [(s, list(tokens), len(tokens)) for s in sequences]
        began = time.perf_counter()
        model.decode_together(items)
        if attempt:
            times.append(time.perf_counter() - began)
        for s, start in zip(sequences, starts, strict=True):
            s.rollback(start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target")
    parser.add_argument("draft")
    parser.add_argument("-s", "--streams", default="1,4")
    parser.add_argument("-k", "--lookahead", default="1,2,4,8")
    parser.add_argument("--alpha", default="0.8,0.9,0.95,1", help="acceptance rates to work out")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    counts = [int(s) for s in args.streams.split(",")]
    ks = [int(k) for k in args.lookahead.split(",")]
    alphas = [float(a) for a in args.alpha.split(",")]
    options = ModelOptions(n_ctx=2048, n_threads=args.threads, n_seq=max(counts))
    target, draft = LlamaModel(args.target, options), LlamaModel(args.draft, options)
    prompt = target.tokenize(PROMPT)
    for model in (target, draft):  # every sequence holds the prompt, as a generation's would
        for i in range(max(counts)):
            model.sequence(i).decode(prompt, 1)
    token = prompt[-1]
    rows = []
    for s in counts:
        verify = {k: timed_pass(target, s, [token] * (k + 1), args.repeats) for k in [0, *ks]}
        step = timed_pass(draft, s, [token], args.repeats)
        plain = s / verify[0]
        row: dict[str, object] = {
            "streams": s,
            "verify_ms": {k + 1: round(1e3 * v, 2) for k, v in verify.items()},
            "draft_step_ms": round(1e3 * step, 2),
            "plain_tok_s": round(plain, 1),
        }
        print(
            f"streams={s}: target pass over {s} x L tokens, L="
            + ", ".join(f"{k + 1}: {1e3 * v:.1f}" for k, v in verify.items())
            + f" ms; draft step over {s}: {1e3 * step:.1f} ms; plain batching at most "
            f"{plain:.1f} tok/s"
        )
        for alpha in alphas:
            drafted = {k: s * expected_tokens(alpha, k) / (k * step + verify[k]) for k in ks}
            free = {k: s * expected_tokens(alpha, k) / verify[k] for k in ks}
            row[f"draft_model_alpha_{alpha}"] = {k: round(b, 1) for k, b in drafted.items()}
            row[f"free_guesses_alpha_{alpha}"] = {k: round(b, 1) for k, b in free.items()}
            print(
                f"  alpha {alpha}: the draft model's guesses at most "
                + ", ".join(f"K={k} {b:.1f}" for k, b in drafted.items())
                + f" tok/s (best, plain included: {max(*drafted.values(), plain):.1f}); "
                f"free guesses (prompt lookup) at most {max(free.values()):.1f}"
            )
        rows.append(row)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
