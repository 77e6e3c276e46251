"""What hybrid rollback and MTP drafting cost, on a synthetic qwen35 of realistic shape.

No Qwen3.5/3.6 weights can be downloaded here, so the models are written with the `gguf`
package (``tests.tiny_models.REALISTIC``: n_embd 1024, 8 trunk layers of which 6 Gated DeltaNet,
a 32k vocabulary, one MTP block; random weights, so guesses rarely survive and the figures are
costs, not speedups). All ratios are taken side by side in one run, medians of ``--repeats``:

1. one MTP draft step / one target step, beside a separate two-layer draft model of the same
   vocabulary (one DeltaNet and one attention layer, the smallest qwen35 llama.cpp runs: what an
   MTP head is "instead of");
2. prompt processing with the MTP head reading along (hidden states out of the target, the head's
   layer over the prompt) / without;
3. a rollback by llama.cpp's snapshots and by a state checkpoint, each as a share of a verify pass
   of K+1 tokens;
4. host time per MTP step outside ``llama_decode`` (the copy of the hidden state and of the
   logits row, the batch);
5. ``-k auto`` against the target alone, tokens per second, for MTP, MTP + prompt lookup, a
   hybrid draft model, and prompt lookup: the never-slower guarantee on hybrids.

    python benchmarks/hybrid_mtp_costs.py [--threads 2] [--repeats 5] [--tokens 64] [--json F]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import llama_cpp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specgen.backend import LlamaModel, ModelOptions, attach_mtp  # noqa: E402
from specgen.core.sampling import SamplingParams  # noqa: E402
from specgen.drafters import make_drafter  # noqa: E402
from specgen.engine import Finished, GenerationConfig, SpeculativeEngine  # noqa: E402
from tests.tiny_models import REALISTIC, write_qwen35  # noqa: E402

GREEDY = SamplingParams(temperature=0.0)


class DecodeClock:
    """Seconds spent inside llama_decode (every context), to tell host time from model time."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self._decode = llama_cpp.llama_decode

        def timed(ctx, batch):  # type: ignore[no-untyped-def]
            started = time.perf_counter()
            try:
                return self._decode(ctx, batch)
            finally:
                self.seconds += time.perf_counter() - started
                self.calls += 1

        llama_cpp.llama_decode = timed


def median_of(repeats: int, work) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64, help="tokens per generation")
    parser.add_argument("--prompt", type=int, default=512, help="prompt tokens")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    clock = DecodeClock()
    folder = Path(tempfile.mkdtemp(prefix="specgen-hybrid-"))
    shape = REALISTIC
    target_file = write_qwen35(folder / "target-mtp.gguf", shape, mtp=True)
    # The smallest qwen35 llama.cpp runs: one DeltaNet and one attention layer.
    small = replace(shape, n_trunk=2, interval=2)
    draft_file = write_qwen35(folder / "draft-2layer.gguf", small, seed=1)
    prompt = [(7 * i + 3) % shape.n_vocab for i in range(args.prompt)]
    n_ctx = args.prompt + 4 * args.tokens + 64

    def target(window: int = 8, mtp: bool = True) -> LlamaModel:
        return LlamaModel(
            target_file,
            ModelOptions(n_ctx=n_ctx, n_threads=args.threads, rollback_window=window, mtp=mtp),
        )

    figures: dict[str, object] = {"shape": vars(shape), "threads": args.threads}

    # 1. One MTP step / one target step, beside a two-layer draft model (each one token after
    #    a 64-token context that grows by one a step).
    model = target()
    head = attach_mtp(model)
    plain = target(mtp=False)
    draft = LlamaModel(draft_file, ModelOptions(n_ctx=n_ctx, n_threads=args.threads))
    for which in (model, plain, draft):
        which.decode(prompt[:64], 1)

    def target_step() -> None:
        plain.decode([5], 1)

    def mtp_step() -> None:
        head.catch_up()  # nothing after the first: the target decodes nothing meanwhile
        head.start(5)
        head.end()

    def draft_step() -> None:
        draft.decode([5], 1)

    for work in (target_step, mtp_step, draft_step):  # warm up
        work()
    n = 20 * args.repeats
    t_target = median_of(n, target_step)
    t_mtp = median_of(n, mtp_step)
    t_draft = median_of(n, draft_step)
    clock.seconds = clock.calls = 0
    started = time.perf_counter()
    for _ in range(n):
        mtp_step()
    host_mtp = (time.perf_counter() - started - clock.seconds) / n
    figures["step_ms"] = {
        "target": t_target * 1e3,
        "mtp": t_mtp * 1e3,
        "draft_2layer": t_draft * 1e3,
    }
    figures["mtp_over_target"] = t_mtp / t_target
    figures["draft_2layer_over_target"] = t_draft / t_target
    figures["one_layer_share"] = 1 / shape.n_trunk
    figures["mtp_host_ms_per_step"] = host_mtp * 1e3

    # 2. Prompt processing with the head reading along, and without.

    def read_prompt(which: LlamaModel) -> None:
        which.reset()
        which.decode(prompt, 1)

    def read_prompt_and_head() -> None:
        read_prompt(model)
        head.catch_up()

    read_prompt(plain)
    read_prompt_and_head()
    outputs_on, with_head, without = [], [], []
    for _ in range(args.repeats):  # side by side, round by round
        outputs_on.append(median_of(1, lambda: read_prompt(model)))
        head.catch_up()
        with_head.append(median_of(1, read_prompt_and_head))
        without.append(median_of(1, lambda: read_prompt(plain)))
    on, both, off = (statistics.median(x) for x in (outputs_on, with_head, without))
    figures["prompt_ms"] = {
        "hidden_states_on": on * 1e3,
        "and_head_reads": both * 1e3,
        "off": off * 1e3,
    }
    figures["prompt_hidden_states_on_over_off"] = on / off
    figures["prompt_and_head_over_off"] = both / off

    # 3. Rollback by snapshots and by checkpoint (K = 4, one guess kept), beside the verify
    #    pass: the snapshots' cost is inside the verify pass (llama.cpp writes a state per
    #    token), the checkpoint's in the copy before it and the restore and decode after.
    k = 4
    rollback: dict[str, object] = {"K": k}
    for name, window in (("snapshots", 8), ("checkpoint", 0), ("none", 0)):
        which = target(window=window, mtp=False)
        read_prompt(which)
        keep, verify, undo = [], [], []
        for i in range(10 * args.repeats + 3):
            t0 = time.perf_counter()
            if name != "none":
                which.keep_rollback_point(k)
            t1 = time.perf_counter()
            which.decode([1 + i % 7, 2, 3, 4, 5], k + 1)
            t2 = time.perf_counter()
            if name != "none":
                which.rollback(which.n_past - (k - 1))
            t3 = time.perf_counter()
            if i >= 3:  # after a warm-up
                keep.append(t1 - t0)
                verify.append(t2 - t1)
                undo.append(t3 - t2)
        rollback[name] = {
            "verify_ms": statistics.median(verify) * 1e3,
            "checkpoint_ms": statistics.median(keep) * 1e3,
            "rollback_ms": statistics.median(undo) * 1e3,
        }
        if name == "snapshots":
            figures["state_bytes"] = which.state_bytes()
    plain_verify = rollback["none"]["verify_ms"]  # type: ignore[index]
    for name in ("snapshots", "checkpoint"):
        row = rollback[name]
        extra = row["verify_ms"] - plain_verify + row["checkpoint_ms"] + row["rollback_ms"]  # type: ignore[index]
        row["cost_share_of_verify"] = extra / plain_verify  # type: ignore[index]
    figures["rollback"] = rollback

    # 5. -k auto against the target alone: each way on a target of its own, round by round
    #    (one generation of each per round), so a machine that slows mid-way slows all alike.
    def engine_for(drafter_of, lookahead):  # type: ignore[no-untyped-def]
        which = target(mtp=lookahead != 0)
        config = GenerationConfig(lookahead=lookahead, sampling=GREEDY, max_tokens=args.tokens)
        return SpeculativeEngine(which, drafter_of(which)), config

    def one(engine_and_config) -> float:  # type: ignore[no-untyped-def]
        engine, config = engine_and_config
        for event in engine.generate(prompt[:128], config):
            if isinstance(event, Finished):
                return event.stats.tokens_per_second or 0.0
        raise AssertionError("a generation ends with Finished")

    draft_model = LlamaModel(draft_file, ModelOptions(n_ctx=n_ctx, n_threads=args.threads))
    ways = {
        "alone": (lambda m: None, 0),
        "mtp auto": (lambda m: make_drafter(None, False, head=attach_mtp(m), target=m), "auto"),
        "mtp+ngram auto": (
            lambda m: make_drafter(None, True, head=attach_mtp(m), target=m),
            "auto",
        ),
        "hybrid draft auto": (lambda m: make_drafter(draft_model, False), "auto"),
        "ngram auto": (lambda m: make_drafter(None, True), "auto"),
        "mtp K=2": (lambda m: make_drafter(None, False, head=attach_mtp(m), target=m), 2),
    }
    engines = {name: engine_for(of, k) for name, (of, k) in ways.items()}
    by_way: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.repeats + 1):
        for name, engine in engines.items():
            by_way[name].append(one(engine))
    # The first round learns the costs (as a first `specgen run` does); the rest use them.
    rates = {name: statistics.median(found[1:]) for name, found in by_way.items()}
    figures["tokens_per_second"] = rates
    figures["over_alone"] = {name: rate / rates["alone"] for name, rate in rates.items()}

    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
