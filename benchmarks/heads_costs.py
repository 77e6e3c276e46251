"""What EAGLE3 and DFlash heads cost, on a synthetic llama target of realistic shape.

No EAGLE3 or DFlash weights can be downloaded here, so the target and its heads are written with
the `gguf` package (``tests.tiny_models``: a llama of n_embd 1024, 8 layers and a 32k vocabulary;
heads of one layer that share its embeddings and output layer, as most published heads do; random
weights, so guesses rarely survive and the figures are costs, not speedups). Ratios are taken side
by side in one run, medians of ``--repeats`` rounds:

1. one draft step / one target step: an EAGLE3 step, a DFlash block of K guesses (one pass), and
   a separate two-layer draft model of the same vocabulary (what a head is "instead of");
2. what the head pays to follow the target: a verify pass with the layer states handed out
   against one without, and the head's read of the K + 1 tokens verified (EAGLE3: its fusion and
   the pairs; DFlash: the states written into its cache);
3. prompt processing with the states handed out and the head reading the prompt, against none;
4. host time per cycle (everything outside llama.cpp's decodes: the rows' warping, the accept
   rule, the states' copies), at K = 8 and T = 0.8, for each head and a draft model;
5. ``-k auto`` against the target alone, greedy tokens per second, with each head: with guesses
   that rarely survive, what drafting that does not pay costs once auto has learned it.

    python benchmarks/heads_costs.py [--threads 2] [--repeats 5] [--json F]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.hybrid_mtp_costs import median_of  # noqa: E402
from specgen.backend import LlamaModel, ModelOptions, attach_head, decode_seconds  # noqa: E402
from specgen.core.sampling import SamplingParams  # noqa: E402
from specgen.drafters import make_drafter  # noqa: E402
from specgen.engine import Finished, GenerationConfig, SpeculativeEngine  # noqa: E402
from tests.tiny_models import LlamaShape, write_dflash, write_eagle3, write_llama  # noqa: E402

SHAPE = LlamaShape(n_vocab=32768, n_embd=1024, n_head=8, n_ff=2816, n_layer=8, n_ctx_train=4096)
EAGLE3_LAYERS = (1, 4, 6)
DFLASH_LAYERS = (1, 3, 5, 7)
BLOCK = 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompt", type=int, default=512, help="prompt tokens")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="specgen-heads-"))
    print("writing the models ...", file=sys.stderr)
    target_file = write_llama(folder / "target.gguf", SHAPE)
    eagle3_file = write_eagle3(folder / "eagle3.gguf", SHAPE, layers=EAGLE3_LAYERS)
    dflash_file = write_dflash(
        folder / "dflash.gguf", SHAPE, layers=DFLASH_LAYERS, block_size=BLOCK
    )
    small = LlamaShape(**{**vars(SHAPE), "n_layer": 2})
    draft_file = write_llama(folder / "draft-2layer.gguf", small, seed=1)
    prompt = [(7 * i + 3) % SHAPE.n_vocab for i in range(args.prompt)]
    n_ctx = args.prompt + 1024
    options = ModelOptions(n_ctx=n_ctx, n_threads=args.threads)

    def with_head(kind: str | None) -> LlamaModel:
        model = LlamaModel(target_file, options)
        if kind is not None:
            attach_head(model, eagle3_file if kind == "eagle3" else dflash_file, kind)
        return model

    plain, eagle3, dflash = with_head(None), with_head("eagle3"), with_head("dflash")
    draft = LlamaModel(draft_file, options)
    figures: dict[str, object] = {"shape": vars(SHAPE), "threads": args.threads}
    n = 20 * args.repeats

    # 1. One step each, after a 64-token context.
    for which in (plain, eagle3, dflash, draft):
        which.decode(prompt[:64], 1)
    e_head, d_head = eagle3.head, dflash.head
    assert e_head is not None and d_head is not None
    e_head.catch_up()  # type: ignore[union-attr]
    d_head.catch_up()  # type: ignore[union-attr]

    def target_step() -> None:
        plain.decode([5], 1)
        plain.rollback(plain.n_past - 1)

    def eagle3_step() -> None:
        e_head.start(5)  # type: ignore[union-attr]
        e_head.end()  # type: ignore[union-attr]

    def dflash_block(k: int) -> Callable[[], None]:
        def work() -> None:
            d_head.block(5, k)  # type: ignore[union-attr]
            d_head.end()  # type: ignore[union-attr]

        return work

    def draft_step() -> None:
        draft.decode([5], 1)
        draft.rollback(draft.n_past - 1)

    def verify(model: LlamaModel, k: int) -> Callable[[], None]:
        def work() -> None:
            model.decode([5] * (k + 1), k + 1)
            model.rollback(model.n_past - (k + 1))  # a head is cut back with it

        return work

    works: dict[str, Callable[[], None]] = {
        "target": target_step,
        "eagle3": eagle3_step,
        "dflash_k4": dflash_block(4),
        "dflash_k8": dflash_block(8),
        "dflash_k15": dflash_block(15),
        "draft_2layer": draft_step,
        "verify_k4": verify(plain, 4),
        "verify_k8": verify(plain, 8),
        "verify_k8_states_out": verify(dflash, 8),
    }
    for work in works.values():  # warm up
        work()
    rounds: dict[str, list[float]] = {name: [] for name in works}
    for _ in range(args.repeats):  # side by side, round by round
        for name, work in works.items():
            rounds[name].append(median_of(n // args.repeats, work))
    step = {name: statistics.median(times) for name, times in rounds.items()}
    figures["step_ms"] = {name: seconds * 1e3 for name, seconds in step.items()}
    figures["over_target_step"] = {
        name: step[name] / step["target"]
        for name in ("eagle3", "dflash_k4", "dflash_k8", "dflash_k15", "draft_2layer")
    }
    figures["verify_k8_states_out_over_plain"] = step["verify_k8_states_out"] / step["verify_k8"]
    # eight guesses: eight EAGLE3 steps or draft steps, one DFlash pass
    figures["eight_guesses_over_verify_k8"] = {
        "eagle3": 8 * step["eagle3"] / step["verify_k8"],
        "dflash": step["dflash_k8"] / step["verify_k8"],
        "draft_2layer": 8 * step["draft_2layer"] / step["verify_k8"],
    }

    # 2. The head's read of a verify pass of K + 1 = 9 tokens.
    def read_after(model: LlamaModel) -> Callable[[], None]:
        def work() -> None:
            model.decode([5] * 9, 9)
            started = time.perf_counter()
            model.head.catch_up()  # type: ignore[union-attr]
            reads.append(time.perf_counter() - started)
            model.rollback(model.n_past - 8)  # one token kept, as a cycle keeps at least one

        return work

    for name, model in (("eagle3", eagle3), ("dflash", dflash)):
        reads: list[float] = []
        for _ in range(n + 3):
            read_after(model)()
        figures[f"{name}_read_9_tokens_ms"] = statistics.median(reads[3:]) * 1e3

    # 3. Prompt processing: states handed out and the head reading, against none.
    def read_prompt(model: LlamaModel) -> Callable[[], None]:
        def work() -> None:
            model.reset()
            model.decode(prompt, 1)
            if model.head is not None:
                model.head.catch_up()  # type: ignore[union-attr]

        return work

    prompt_rounds: dict[str, list[float]] = {"off": [], "eagle3": [], "dflash": []}
    for _ in range(args.repeats):
        for name, model in (("off", plain), ("eagle3", eagle3), ("dflash", dflash)):
            prompt_rounds[name].append(median_of(1, read_prompt(model)))
    prompt_ms = {name: statistics.median(times) * 1e3 for name, times in prompt_rounds.items()}
    figures["prompt_ms"] = prompt_ms
    figures["prompt_over_off"] = {
        name: prompt_ms[name] / prompt_ms["off"] for name in ("eagle3", "dflash")
    }

    # 4. Host time per cycle at K = 8, T = 0.8 (whole rows, as on a CPU).
    sampled = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)
    host: dict[str, float] = {}
    for name, model, drafter_of in (
        ("eagle3", eagle3, lambda m: make_drafter(None, False, head=m.head, target=m)),
        ("dflash", dflash, lambda m: make_drafter(None, False, head=m.head, target=m)),
        ("draft_2layer", plain, lambda m: make_drafter(draft, False)),
    ):
        engine = SpeculativeEngine(model, drafter_of(model))
        config = GenerationConfig(lookahead=8, sampling=sampled, max_tokens=64, seed=1)
        per_cycle = []
        for _ in range(args.repeats):
            model.reset()
            draft.reset()
            busy, started = decode_seconds(), time.perf_counter()
            stats = None
            for event in engine.generate(prompt[:64], config):
                if isinstance(event, Finished):
                    stats = event.stats
            wall = time.perf_counter() - started
            assert stats is not None
            per_cycle.append((wall - (decode_seconds() - busy)) / max(stats.n_cycles, 1))
        host[name] = statistics.median(per_cycle) * 1e3
    figures["host_ms_per_cycle_k8_t08"] = host

    # 5. -k auto / the target alone, greedy, 64 tokens a generation (after one to learn).
    greedy = SamplingParams(temperature=0.0)
    engines = {
        "alone": SpeculativeEngine(plain),
        "eagle3": SpeculativeEngine(eagle3, make_drafter(None, False, head=e_head, target=eagle3)),
        "dflash": SpeculativeEngine(dflash, make_drafter(None, False, head=d_head, target=dflash)),
    }
    rates: dict[str, list[float]] = {name: [] for name in engines}
    for round_ in range(args.repeats + 1):
        for name, engine in engines.items():
            k = 0 if name == "alone" else "auto"
            config = GenerationConfig(lookahead=k, sampling=greedy, max_tokens=64)
            started = time.perf_counter()
            for event in engine.generate(prompt[:64], config):
                if isinstance(event, Finished):
                    tokens = event.stats.n_generated
            if round_:  # the first round learns the costs
                rates[name].append(tokens / (time.perf_counter() - started))
    rate = {name: statistics.median(r) for name, r in rates.items()}
    figures["auto_tok_s"] = rate
    figures["auto_over_alone"] = {n: rate[n] / rate["alone"] for n in ("eagle3", "dflash")}

    print(json.dumps(figures, indent=2, default=str))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, default=str))


if __name__ == "__main__":
    main()
