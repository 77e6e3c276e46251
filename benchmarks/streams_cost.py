"""The many-streams loop's own cost: host time per target pass (outside llama.cpp's decodes) and
aggregate tokens per second, at 1, 2, 4 ... streams, by K, temperature and how rows are read.

Each figure runs S generations side by side on S sequences of one target and one draft context
(``engine.streams``, as ``serve --parallel`` and ``run -f --parallel`` do), after one warm-up,
and counts the host time as ``benchmarks/loop_cost.py`` does: the wall time less the time
inside llama.cpp's decodes, per target pass (one pass verifies every stream's guesses); the
scheduler's own count (its steps less the whole of ``decode_together``, rows' reading
included) is printed beside it. One stream through the same
scheduler is the baseline the issue's bound is read against (4 streams at most 1.5x it).

    python benchmarks/streams_cost.py TARGET DRAFT [-s 1,2,4] [-k 0,4,8] [-n 64]
        [--temperatures 0,0.8] [--rows whole,backend] [--threads 2] [--rounds R]
        [--coupling auto|gumbel|residual] [--profile FILE]
    python benchmarks/streams_cost.py --tiny-pair [the same options]

Beside the whole run's host ms a pass, its steady figure: the median over the run's target
passes that held all of its streams, but its first two (the prompts' pass, the first cycle):
the cost of a cycle of the loop at that many streams, where the whole run's figure has its
start and its end in it (streams that end at different passes, a last pass with no cycle after
it), and how many streams its passes held on average.

Beside the wall time, the host's CPU time: the main thread's CPU time less its share inside
llama.cpp's decodes and compactions (it computes in them too), per target pass. The time the
shared machine takes from this one (steal) and other processes' runs between decodes enter
the wall time, not this: a ratio of CPU times is steadier from round to round.

``--rounds R`` runs every stream count R times, the counts' order flipped each round, and
prints each count's host ms against the first count's paired by round (the geometric mean of
the rounds' ratios and its 95% interval, as ``server_duel.py`` reads servers): one run's ratio
on a shared machine swings by a third.

Rows "backend" force llama.cpp's backend top-k on this CPU (the GPU way, as
``benchmarks/loop_cost.py`` forces it): the host work a GPU would see.

A CPU's decode streams the model's weights through the host's caches, so the host's work after
each decode starts on cold caches, a share of one stream's host time that a GPU's decode, which
leaves them alone, would not add. ``--tiny-pair`` runs a tiny random llama
(``tests.tiny_models``, written with the ``gguf`` package into a temporary folder: 9 MB, a
128-token vocabulary) as both target and draft: its decodes take a fraction of a millisecond and
its weights fit this CPU's last-level cache, so the host's work finds much more of its own data
warm (a proxy for a GPU host, without a GPU driver's own work). Its draft is its target, so every
guess is kept: every verify reads K + 1 rows, and each stream books K + 1 tokens a pass (the demo
pair fewer).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from paired import paired_ratio  # noqa: E402

import specgen.backend.llama as backend_llama  # noqa: E402
from specgen.backend import LlamaModel, ModelOptions, decode_seconds  # noqa: E402
from specgen.core.sampling import DEFAULT_SAMPLING, SamplingParams  # noqa: E402
from specgen.drafters import ModelDrafter  # noqa: E402
from specgen.engine import CycleDone, GenerationConfig, SpeculativeEngine  # noqa: E402
from specgen.engine.streams import Streams  # noqa: E402
from specgen.lookahead import BatchLoad, CostBook  # noqa: E402

# The first four run to 64 tokens at the settings the issue reads (K=8, T=0.8, seed 7) on the
# SmolLM2 demo pair; a prompt that ends at once (the short story: the instruct model's raw text
# ends there) would leave a batch of S streams a batch of S - 1. Each figure says how many
# streams its passes held.
PROMPTS = [
    "The history of the Roman Empire",
    "Once upon a time, in a small village,",
    "Give a step-by-step recipe for a simple tomato soup.",
    "def fibonacci(n):\n",
    "List ten countries in Europe and their capital cities.",
    "Explain in a few sentences why the sky is blue.",
    "Q: What is the speed of light?\nA:",
    "Write a short story about a lighthouse keeper.",
]


# The main thread's CPU seconds inside llama.cpp's decodes and compactions (``_count_inside``).
_INSIDE = [0.0]


def _count_inside() -> None:
    """Count the main thread's CPU time in llama.cpp's decodes and compactions: the host's CPU
    time is the rest of it."""

    def counted(call):  # type: ignore[no-untyped-def]
        def inside(*args, **kwargs):  # type: ignore[no-untyped-def]
            began = time.thread_time()
            try:
                return call(*args, **kwargs)
            finally:
                _INSIDE[0] += time.thread_time() - began

        return inside

    backend_llama.decode = counted(backend_llama.decode)
    LlamaModel.compact = counted(LlamaModel.compact)


def run(target, draft, n: int, config: GenerationConfig) -> dict[str, float | None]:
    costs = CostBook()
    load = BatchLoad(costs)
    engines = [
        SpeculativeEngine(
            target.sequence(i),
            ModelDrafter(draft.sequence(i)),
            costs=costs,
            load=load,
            slot=i,
        )
        for i in range(n)
    ]
    streams = Streams(target, [draft], load=load)
    made = [0]

    def work(engine: SpeculativeEngine, prompt: list[int]) -> None:
        for event in engine.generate(prompt, config):
            if isinstance(event, CycleDone):
                made[0] += len(event.tokens)

    for i, engine in enumerate(engines):
        prompt = target.tokenize(PROMPTS[i % len(PROMPTS)])
        streams.add(lambda e=engine, p=prompt: work(e, p))
    started, busy = time.perf_counter(), decode_seconds()
    cpu, inside = time.thread_time(), _INSIDE[0]
    # Each target pass's cycle: the wall time since the last one ended, less the decodes and
    # compactions in it (the host's own time, as the whole run's figure counts it).
    cycles: list[tuple[float, int]] = []  # (host seconds, sequences in the pass)
    mark = (started, busy, 0.0, 0)
    sizes: dict[int, int] = {}
    while streams.step():
        stats = streams.stats
        if stats.target_passes != mark[3]:
            now, decoded = time.perf_counter(), decode_seconds()
            size = next(s for s, c in stats.sequences.items() if c != sizes.get(s, 0))
            sizes = dict(stats.sequences)
            host = (now - mark[0]) - (decoded - mark[1]) - (stats.compact_seconds - mark[2])
            cycles.append((host, size))
            mark = (now, decoded, stats.compact_seconds, stats.target_passes)
    seconds = time.perf_counter() - started
    decoding = decode_seconds() - busy
    host_cpu = (time.thread_time() - cpu) - (_INSIDE[0] - inside)
    streams.close()
    stats = streams.stats
    passes = max(1, stats.target_passes)
    # Steady: the passes that held every stream, but a run's first two (the prompts' and the
    # first cycle's), by their median.
    steady = [host for host, size in cycles[2:] if size == n]
    return {
        # None where no pass held every stream (one ended at once: another K or temperature).
        "steady_host_ms": 1e3 * statistics.median(steady) if steady else None,
        "steady_passes": len(steady),
        "streams_per_pass": sum(size for _, size in cycles) / max(1, len(cycles)),
        # The wall time less the time inside llama.cpp's decodes and its caches' compactions
        # (llama.cpp's copies, printed apart): the scheduler, every stream's loop and the
        # reading of rows, as loop_cost.py counts it.
        "host_ms_per_pass": 1e3 * (seconds - decoding - stats.compact_seconds) / passes,
        # The main thread's CPU time outside llama.cpp's decodes and compactions.
        "host_cpu_ms_per_pass": 1e3 * host_cpu / passes,
        "compact_ms_per_pass": 1e3 * stats.compact_seconds / passes,
        # The scheduler's own count: its steps less the whole of decode_together (which
        # includes the batch's filling and the rows' reading).
        "scheduler_ms_per_pass": 1e3 * stats.host_seconds / passes,
        "decode_ms_per_pass": 1e3 * stats.decode_seconds / max(1, stats.target_passes),
        # Rows of the verifies picked in one pass over all of them (``PickedRows``).
        "picked_rows_per_pass": stats.picked / passes,
        "tokens_per_second": made[0] / seconds,
        "passes": stats.target_passes,
    }


def _ms(value: float | None) -> str:
    return "  n/a" if value is None else f"{value:5.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", nargs="?")
    parser.add_argument("draft", nargs="?")
    parser.add_argument(
        "--tiny-pair",
        action="store_true",
        help="a tiny random llama as target and draft (the host's caches kept warm; above)",
    )
    parser.add_argument("-s", "--streams", default="1,2,4")
    parser.add_argument("-k", "--lookahead", default="0,4,8")
    parser.add_argument("-n", "--max-tokens", type=int, default=64)
    parser.add_argument("--temperatures", default="0,0.8")
    parser.add_argument("--rows", default="whole,backend")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--coupling",
        default="auto",
        choices=["auto", "gumbel", "residual"],
        help="the sampled rule (auto: Gumbel-max, a seed is given; residual: min(1, p/q), "
        "as a request without a seed runs)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="runs of each count, alternated")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--profile", type=Path, help="write a cProfile of the runs here")
    args = parser.parse_args()
    _count_inside()
    if args.tiny_pair:
        from tests.tiny_models import LlamaShape, write_llama

        folder = Path(tempfile.mkdtemp(prefix="specgen-tiny-pair-"))
        # Its output scaled so that a sampled row's support at T=0.8 is about the demo pair's
        # (8.4 tokens against SmolLM2's 8.8, measured on the first prompt).
        shape = LlamaShape(n_ctx_train=2048)
        args.target = args.draft = str(write_llama(folder / "tiny.gguf", shape, output_scale=0.2))
    elif args.target is None or args.draft is None:
        parser.error("TARGET and DRAFT, or --tiny-pair")
    counts = [int(s) for s in args.streams.split(",")]
    most = max(counts)
    rows = []
    profile = cProfile.Profile() if args.profile else None
    for way in args.rows.split(","):
        backend = way == "backend"
        options = ModelOptions(
            n_ctx=1024, n_threads=args.threads, backend_sampling=backend, n_seq=most
        )
        target, draft = LlamaModel(args.target, options), LlamaModel(args.draft, options)
        for model in (target, draft):
            for i in range(most):
                model.sequence(i).rows_on_device = backend
        for k in [int(k) for k in args.lookahead.split(",")]:
            for temperature in [float(t) for t in args.temperatures.split(",")]:
                sampling = (
                    SamplingParams(temperature=0.0)
                    if temperature <= 0
                    else SamplingParams(
                        temperature,
                        DEFAULT_SAMPLING.top_k,
                        DEFAULT_SAMPLING.top_p,
                        DEFAULT_SAMPLING.min_p,
                    )
                )
                config = GenerationConfig(
                    lookahead=k,
                    sampling=sampling,
                    max_tokens=args.max_tokens,
                    seed=7,
                    coupling=args.coupling,
                )
                run(target, draft, 1, config)  # warm-up: graphs built
                host: dict[int, list[float | None]] = {n: [] for n in counts}
                steady: dict[int, list[float | None]] = {n: [] for n in counts}
                host_cpu: dict[int, list[float | None]] = {n: [] for n in counts}
                for round_ in range(args.rounds):
                    for n in counts if round_ % 2 == 0 else counts[::-1]:
                        if profile is not None:
                            profile.enable()
                        got = run(target, draft, n, config)
                        if profile is not None:
                            profile.disable()
                        host[n].append(got["host_ms_per_pass"])
                        steady[n].append(got["steady_host_ms"])
                        host_cpu[n].append(got["host_cpu_ms_per_pass"])
                        row = {"rows": way, "k": k, "temperature": temperature, "streams": n}
                        rows.append({**row, "round": round_, **got})
                        print(
                            f"{way:8} K={k} T={temperature:<3} streams={n}  host "
                            f"{got['host_ms_per_pass']:6.2f} ms/pass (CPU "
                            f"{got['host_cpu_ms_per_pass']:5.2f}, steady "
                            f"{_ms(got['steady_host_ms'])} over {got['steady_passes']}, "
                            f"{got['streams_per_pass']:.2f} streams a pass, scheduler's "
                            f"{got['scheduler_ms_per_pass']:5.2f})  decode "
                            f"{got['decode_ms_per_pass']:7.2f} ms/pass  compacting "
                            f"{got['compact_ms_per_pass']:5.2f} ms/pass  rows picked "
                            f"together {got['picked_rows_per_pass']:4.1f} a pass  "
                            f"{got['tokens_per_second']:6.1f} tok/s",
                            flush=True,
                        )
                if args.rounds > 1:
                    for n in counts[1:]:
                        for label, got_ms in (
                            ("host ms", host),
                            ("steady host ms", steady),
                            ("host CPU ms", host_cpu),
                        ):
                            # The rounds where both counts had a figure.
                            pairs = [
                                (a, b)
                                for a, b in zip(got_ms[counts[0]], got_ms[n], strict=True)
                                if a is not None and b is not None
                            ]
                            head = f"{way:8} K={k} T={temperature:<3} {label} {n} / {counts[0]}"
                            if len(pairs) < 2:
                                print(f"{head} streams: too few rounds with a figure", flush=True)
                                continue
                            ones, many = [a for a, _ in pairs], [b for _, b in pairs]
                            ratio, low, high = paired_ratio(ones, many)
                            print(
                                f"{head} streams over {len(pairs)} rounds: {ratio:.3f} "
                                f"(95% {low:.3f}-{high:.3f}; medians "
                                f"{statistics.median(ones):.2f} and "
                                f"{statistics.median(many):.2f})",
                                flush=True,
                            )
        target.close()
        draft.close()
    if profile is not None:
        profile.dump_stats(str(args.profile))
    if args.tiny_pair:
        shutil.rmtree(Path(args.target).parent)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
