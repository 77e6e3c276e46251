"""What the layout of a shared cache costs a target pass (issue 36).

llama.cpp puts a batch's tokens in the shared cache's free cells in the batch's order, and a
rollback frees cells that the next pass gives to whichever sequence comes first in it. On a
CPU, attention reads each token's own cells by skipping the others', so the way the sequences
interleave in the cache decides what every later pass costs. Contexts of the same model, side
by side in one process (a pass of each in turn, so the machine's noise falls on all alike),
each with S sequences after the same prompt:

  - ``plain``: one token a sequence every pass, in the sequences' order (``-k 0``);
  - ``shuffled``: the same, in an order that changes every pass (as tasks park in ``Streams``
    where some draft first and it kept their order);
  - ``guesses``: the same passes, but a share of the sequences verify 1-3 guesses and keep a
    random part of them (a rollback frees the rest), in the sequences' order;
  - ``compacted``: ``guesses``, and ``LlamaModel.compact`` every ``--compact-every`` passes;
  - with ``--no-fa``, ``plain`` and ``guesses`` again with llama.cpp's flash attention off.

Reported: the median milliseconds of the passes where no sequence guessed (the same tokens in
every context) and of those with guesses, the first's ratio to ``plain``'s, and what a
compaction took.

    python benchmarks/kv_layout.py --model T.gguf --sequences 7 --passes 200
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specgen.backend.llama import LlamaModel, ModelOptions  # noqa: E402

LAYOUTS = ("plain", "shuffled", "guesses", "compacted")
NO_FA = ("plain, no FA", "guesses, no FA")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a GGUF (the target)")
    parser.add_argument("--sequences", type=int, default=7)
    parser.add_argument("--passes", type=int, default=200)
    parser.add_argument("--prompt-tokens", type=int, default=20, help="each sequence's prompt")
    parser.add_argument("--guessing", type=float, default=0.25, help="share of sequences a pass")
    parser.add_argument("--compact-every", type=int, default=32, help="passes, for compacted")
    parser.add_argument("--no-fa", action="store_true", help="also with flash attention off")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the figures to this file too")
    args = parser.parse_args()
    n = args.sequences
    layouts = LAYOUTS + (NO_FA if args.no_fa else ())
    contexts = {
        layout: LlamaModel(
            args.model,
            ModelOptions(
                n_ctx=max(4096, args.prompt_tokens + 4 * args.passes),
                n_seq=n,
                n_threads=args.threads,
                flash_attn=0 if "no FA" in layout else -1,
            ),
        )
        for layout in layouts
    }
    sequences = {layout: [m.sequence(i) for i in range(n)] for layout, m in contexts.items()}
    text = "Write a short story about a lighthouse keeper who finds a map in a bottle. " * 400
    prompt = contexts["plain"].tokenize(text)[: args.prompt_tokens]
    for layout, model in contexts.items():
        for sequence in sequences[layout]:
            for start in range(0, len(prompt), 256):
                model.decode_together([(sequence, prompt[start : start + 256], 1)])
    rng = random.Random(args.seed)
    seconds = {layout: {"plain": [], "guessed": []} for layout in layouts}
    compacting: list[float] = []
    warm = min(20, args.passes // 5)
    for step in range(args.passes):
        extra = [rng.choice((1, 2, 3)) if rng.random() < args.guessing else 0 for _ in range(n)]
        keep = [rng.randint(0, e) for e in extra]
        shuffled = rng.sample(range(n), n)
        token = 300 + step % 50
        kind = "guessed" if any(extra) else "plain"
        for layout, model in contexts.items():
            guesses = extra if layout.startswith(("guesses", "compacted")) else [0] * n
            order = shuffled if layout == "shuffled" else range(n)
            seqs = sequences[layout]
            items = [(seqs[i], [token] * (1 + guesses[i]), 1 + guesses[i]) for i in order]
            began = time.perf_counter()
            model.decode_together(items)
            if step >= warm:
                seconds[layout][kind].append(time.perf_counter() - began)
            for i, sequence in enumerate(seqs):
                if guesses[i] > keep[i]:
                    sequence.rollback(sequence.n_past - (guesses[i] - keep[i]))
            if layout == "compacted" and step % args.compact_every == args.compact_every - 1:
                took = model.compact()
                if took is not None:
                    compacting.append(took)
    base = statistics.median(seconds["plain"]["plain"])
    print(
        f"{n} sequences after {len(prompt)} prompt tokens, {args.passes} passes, "
        f"{args.guessing:.0%} of the sequences guessing a pass"
    )
    print(f"{'layout':<16} {'no guess (ms)':>14} {'ratio':>6} {'with guesses (ms)':>18}")
    rows = {}
    for layout in layouts:
        plain = statistics.median(seconds[layout]["plain"])
        guessed = seconds[layout]["guessed"]
        guessing = layout.startswith(("guesses", "compacted"))
        with_guesses = statistics.median(guessed) * 1e3 if guessing else None
        rows[layout] = {"plain_ms": plain * 1e3, "guessed_ms": with_guesses}
        cell = f"{with_guesses:18.2f}" if with_guesses is not None else f"{'-':>18}"
        print(f"{layout:<16} {plain * 1e3:14.2f} {plain / base:6.2f} {cell}")
    if compacting:
        took = statistics.median(compacting) * 1e3
        print(f"a compaction: {took:.2f} ms (median of {len(compacting)})")
    if args.json:
        out = {"args": vars(args), "rows": rows, "compact_ms": compacting}
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
