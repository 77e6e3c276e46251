"""The speculative loop's own cost: host time per cycle outside llama.cpp's decodes, by pair
(vocabulary size), K, temperature and how rows are read (whole, or their top-k from llama.cpp's
backend sampling).

On a GPU a target step is a few milliseconds, so what the loop does on the host between steps
decides the speedup. This measures it where it can be measured here: a cycle's wall time less
the time spent inside ``llama_decode`` (waited for to the end), which is ``Stats.host_seconds``.
Each row is the median of ``--repeats`` generations after one warm-up, the two ways of reading
rows run side by side (alternating which goes first) on the same loaded files, so a machine that
gets busier weighs on both alike.

    python benchmarks/loop_cost.py TARGET DRAFT [TARGET DRAFT ...] [-k 4,8] [-n 96]
        [--temperatures 0,0.8] [--repeats 3] [--threads 2] [--coupling residual] [--gaps]
        [--json FILE]

Columns: host ms per cycle; host share of generation time; ms per cycle inside decodes
(target and draft); tokens per second. ``--gaps`` adds where the host time falls: the median
time between two decodes by what they were (a draft's step to its next, the last step to the
verify pass, the verify to the next cycle's first step) and their sum per cycle. The same
seed is used on both ways, and the texts are checked to be the same (the same p and q). On a
CPU build specgen reads whole rows (the first way); on a GPU, the second.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specgen.backend import LlamaModel, ModelOptions, decode_seconds, runtime  # noqa: E402
from specgen.core import sampling  # noqa: E402
from specgen.core.sampling import DEFAULT_SAMPLING, SamplingParams  # noqa: E402
from specgen.drafters import ModelDrafter  # noqa: E402
from specgen.engine import CycleDone, Finished, GenerationConfig, SpeculativeEngine  # noqa: E402

PROMPT = "The history of the Roman Empire"
# How rows are read: whole, in host memory (the host's top-k or argmax over each row in place:
# what specgen does where rows are computed on this CPU), or as their top-k (greedy: top-1)
# from llama.cpp's backend sampling (what specgen does where rows are computed on a GPU or a
# worker; forced here, on the CPU, to measure the loop's host work as a GPU would see it).
WAYS = {"whole rows": (False, False), "backend top-k": (True, True)}
# --before adds the host path as it was before either (whole rows, numpy's argpartition for the
# top-k: 2.3 ms a row of 262k logits), swapped in for its runs alone.
BEFORE = "argpartition"


@contextlib.contextmanager
def host_top_k_as_before(on: bool) -> Iterator[None]:
    if not on:
        yield
        return
    kept = sampling.top_ids
    sampling.top_ids = lambda values, k: np.argpartition(values, -k)[-k:]
    try:
        yield
    finally:
        sampling.top_ids = kept


# Each decode as (began, ended, context, tokens), while --gaps logs them.
Decodes = list[tuple[float, float, object, int]]


@contextlib.contextmanager
def decodes_logged(on: bool) -> Iterator[Decodes]:
    """Every llama.cpp decode's start and end, while ``on``."""
    log: Decodes = []
    if not on:
        yield log
        return
    kept = runtime._waited

    def waited(call, ctx, batch):  # type: ignore[no-untyped-def]
        began = time.perf_counter()
        status = kept(call, ctx, batch)
        log.append((began, time.perf_counter(), _address(ctx), batch.n_tokens))
        return status

    runtime._waited = waited
    try:
        yield log
    finally:
        runtime._waited = kept


def _address(ctx: object) -> object:
    return getattr(ctx, "value", None) or id(ctx)


def gaps(logs: list[Decodes], target: object, cycles: int) -> dict[str, tuple[float, float]]:
    """Host time between consecutive decodes of each generation (``logs``: one each), by kind:
    median us, and ms per cycle. The target's first decode is the prompt's."""
    by_kind: dict[str, list[float]] = defaultdict(list)
    for log in logs:
        for i, ((_, ended, ctx_a, n_a), (began, _, ctx_b, _)) in enumerate(zip(log, log[1:])):
            if ctx_a == target:
                a = "verify" if i else "prompt"
            else:
                a = "step" if n_a == 1 else "draft read"
            b = "verify" if ctx_b == target else "draft"
            by_kind[f"{a}->{b}"].append(began - ended)
    return {
        kind: (1e6 * statistics.median(seen), 1e3 * sum(seen) / max(cycles, 1))
        for kind, seen in sorted(by_kind.items())
    }


def generate(engine: SpeculativeEngine, prompt: list[int], config: GenerationConfig) -> dict:
    tokens: list[int] = []
    busy_before = decode_seconds()
    for event in engine.generate(prompt, config):
        if isinstance(event, CycleDone):
            tokens.extend(event.tokens)
        elif isinstance(event, Finished):
            stats = event.stats
    decoding = decode_seconds() - busy_before - stats.prompt_seconds
    cycles = max(stats.n_cycles, 1)
    return {
        "tokens": tokens,
        "host_ms_per_cycle": 1000 * (stats.host_seconds or 0.0) / cycles,
        "host_share": stats.host_share,
        "decode_ms_per_cycle": 1000 * max(decoding, 0.0) / cycles,
        "tokens_per_second": stats.tokens_per_second,
        "cycles": stats.n_cycles,
        "row_top_k": stats.row_top_k,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="TARGET DRAFT pairs")
    parser.add_argument("-k", "--lookahead", default="4,8")
    parser.add_argument("-n", "--max-tokens", type=int, default=96)
    parser.add_argument("--temperatures", default="0,0.8")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the rows here too")
    parser.add_argument("--before", action="store_true", help="add the host path as it was")
    parser.add_argument(
        "--coupling",
        default="auto",
        choices=("auto", "gumbel", "residual"),
        help="how sampled tokens are drawn (auto with the fixed seed: gumbel; residual is what "
        "a run without --seed draws with)",
    )
    parser.add_argument("--gaps", action="store_true", help="where the host time falls")
    args = parser.parse_args()
    ways_here = {**WAYS, **({BEFORE: (False, False)} if args.before else {})}
    if len(args.files) % 2:
        parser.error("give TARGET DRAFT pairs")
    ks = [int(k) for k in args.lookahead.split(",")]
    temperatures = [float(t) for t in args.temperatures.split(",")]
    rows = []
    for target_file, draft_file in zip(args.files[::2], args.files[1::2]):
        engines = {}
        for way, (backend, on_device) in ways_here.items():
            options = ModelOptions(n_ctx=1024, n_threads=args.threads, backend_sampling=backend)
            target = LlamaModel(target_file, options)
            draft = LlamaModel(draft_file, options)
            if on_device is not None:
                target.rows_on_device = draft.rows_on_device = on_device
            engines[way] = SpeculativeEngine(target, ModelDrafter(draft), busy=decode_seconds)
        vocab = engines["whole rows"].target.n_vocab
        prompt = engines["whole rows"].target.tokenize(PROMPT)
        for k in ks:
            for temperature in temperatures:
                sampling = (
                    SamplingParams(temperature=0.0)
                    if temperature <= 0
                    else SamplingParams(temperature, *_rest(DEFAULT_SAMPLING))
                )
                config = GenerationConfig(
                    lookahead=k,
                    sampling=sampling,
                    max_tokens=args.max_tokens,
                    seed=7,
                    coupling=args.coupling,
                )
                ways = list(ways_here)
                runs: dict[str, list[dict]] = {way: [] for way in ways}
                logs: dict[str, list[Decodes]] = {way: [] for way in ways}
                for way in ways:  # warm-up: graphs built, caches touched
                    with host_top_k_as_before(way == BEFORE):
                        generate(engines[way], prompt, config)
                for repeat in range(args.repeats):
                    for way in ways if repeat % 2 == 0 else ways[::-1]:
                        with host_top_k_as_before(way == BEFORE), decodes_logged(args.gaps) as log:
                            runs[way].append(generate(engines[way], prompt, config))
                        logs[way].append(log)
                texts = {way: runs[way][0]["tokens"] for way in ways}
                for way in ways:
                    got = runs[way]
                    row = {
                        "target": Path(target_file).name,
                        "n_vocab": vocab,
                        "k": k,
                        "temperature": temperature,
                        "rows": way,
                        "row_top_k": got[0]["row_top_k"],
                        **{
                            key: statistics.median(r[key] for r in got if r[key] is not None)
                            for key in (
                                "host_ms_per_cycle",
                                "host_share",
                                "decode_ms_per_cycle",
                                "tokens_per_second",
                            )
                        },
                        "same_text": texts[way] == texts["whole rows"],
                    }
                    rows.append(row)
                    print(
                        f"{row['target'][:34]:34} V={vocab:<6} K={k} T={temperature:<3} "
                        f"{way:13} host {row['host_ms_per_cycle']:6.2f} ms/cycle "
                        f"({100 * row['host_share']:4.1f}%)  decode "
                        f"{row['decode_ms_per_cycle']:7.2f} ms/cycle  "
                        f"{row['tokens_per_second']:6.1f} tok/s  same text: {row['same_text']}",
                        flush=True,
                    )
                    if args.gaps:
                        target = _address(engines[way].target.ctx_ptr)
                        cycles = sum(r["cycles"] for r in got)
                        print(
                            "    between decodes: "
                            + "; ".join(
                                f"{kind} {median:.0f} us ({per_cycle:.3f} ms/cycle)"
                                for kind, (median, per_cycle) in gaps(
                                    logs[way], target, cycles
                                ).items()
                            ),
                            flush=True,
                        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


def _rest(params: SamplingParams) -> tuple[int, float, float]:
    return params.top_k, params.top_p, params.min_p


if __name__ == "__main__":
    main()
