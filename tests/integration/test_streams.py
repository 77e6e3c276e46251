"""Many streams at once on real llama.cpp models: each sequence of a batch gives what the target
alone gives its prompt (greedy), through the engine, the API and a batch file.

Batch composition can move a float: the target's pass over four sequences' tokens runs other
matrix shapes than its pass over one, so two tokens whose logits nearly tie may swap. A
divergence is therefore checked where it happens: the lone target's two best logits there must
be within ``NEAR_TIE`` of each other (a float's doing), else it is a bug (a leak, a stale cache
row, a wrong rollback), which moves whole distributions, not the last digits.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from specgen.backend import LlamaModel, ModelOptions
from specgen.core.sampling import SamplingParams
from specgen.drafters import HybridDrafter, ModelDrafter, NgramDrafter
from specgen.engine import GenerationConfig, SpeculativeEngine
from specgen.engine import streams as streams_module
from specgen.engine.streams import Streams
from specgen.lookahead import BatchLoad, CostBook
from tests.fakes import drive, run_to_end
from tests.invoke import specgen_process
from tests.near_ties import assert_same_up_to_near_ties

GREEDY = SamplingParams(temperature=0)
NEAR_TIE = 0.05  # logits: far below what a real difference between contexts moves
PROMPTS = [
    "The history of the Roman Empire",
    "def fibonacci(n):\n",
    "Here is a list of fruits: apple, banana,",
    "Q: Why is the sky blue?\nA:",
]


@pytest.fixture(scope="module")
def four(smollm2_target: Path, smollm2_draft: Path):
    options = ModelOptions(n_ctx=256, n_threads=2, n_seq=4)
    target, draft = LlamaModel(smollm2_target, options), LlamaModel(smollm2_draft, options)
    yield target, draft
    target.close()
    draft.close()


def _four_alone(smol, four, lookahead) -> Streams:
    """Four sequences at once, each checked against the target alone; their scheduler."""
    alone_target, _ = smol
    target, draft = four
    for i in range(4):
        target.sequence(i).reset()
        draft.sequence(i).reset()
    costs = CostBook()
    load = BatchLoad(costs)
    engines = [
        SpeculativeEngine(
            target.sequence(i),
            HybridDrafter(ModelDrafter(draft.sequence(i)), NgramDrafter()),
            costs=costs,
            load=load,
            slot=i,
        )
        for i in range(4)
    ]
    streams = Streams(target, [draft], load=load)
    prompts = [target.tokenize(p) for p in PROMPTS]
    config = GenerationConfig(lookahead=lookahead, sampling=GREEDY, max_tokens=40)
    done: dict[int, list[int]] = {}
    for i, engine in enumerate(engines):
        streams.add(lambda i=i, e=engine: done.__setitem__(i, drive(e, config, prompts[i]).tokens))
    try:
        streams.run()
    finally:
        streams.close()
    assert max(size for size in streams.stats.sequences) == 4  # verified all four at once
    for i, prompt in enumerate(prompts):
        want, _ = run_to_end(
            SpeculativeEngine(alone_target),
            GenerationConfig(lookahead=0, sampling=GREEDY, max_tokens=40),
            prompt,
        )
        assert_same_up_to_near_ties(alone_target, prompt, want, done[i], NEAR_TIE)
    return streams


@pytest.mark.parametrize("lookahead", [0, 3, "auto"])
def test_each_of_four_sequences_is_the_target_alone(smol, four, lookahead) -> None:
    _four_alone(smol, four, lookahead)


@pytest.mark.parametrize("lookahead", [3, 8])
def test_each_sequence_is_the_target_alone_with_its_cache_compacted(
    smol, four, lookahead, monkeypatch
) -> None:
    """Compacting the caches whenever any cell was freed (``Streams._compact``, made eager
    here) changes no sequence's tokens: the same keys and values at the same positions."""
    monkeypatch.setattr(streams_module, "COMPACT_FREED", 0.0)
    monkeypatch.setattr(streams_module, "COMPACT_SHARE", 1e6)
    streams = _four_alone(smol, four, lookahead)
    assert streams.stats.compactions > 10


def test_compacting_keeps_every_sequence_s_cache(four) -> None:
    """``LlamaModel.compact`` after passes of guesses and rollbacks that scattered four
    sequences' cells: each sequence's next rows are the same (to a float's reordering), its
    positions too, and the freed cells are counted afresh."""
    target, _ = four
    assert target.compacts and not LlamaModel(target.path, ModelOptions(n_ctx=64)).compacts
    sequences = [target.sequence(i) for i in range(4)]
    for sequence, prompt in zip(sequences, PROMPTS, strict=True):
        sequence.reset()
        target.decode_together([(sequence, target.tokenize(prompt), 1)])
    rng = np.random.default_rng(0)
    for step in range(30):
        extra = [int(e) for e in rng.integers(0, 3, size=4)]
        target.decode_together(
            [(s, [100 + step] * (1 + e), 1 + e) for s, e in zip(sequences, extra, strict=True)]
        )
        for s, e in zip(sequences, extra, strict=True):
            s.rollback(s.n_past - int(rng.integers(0, e + 1)))
    assert target.freed > 0

    def probe() -> list[np.ndarray]:
        rows = target.decode_together([(s, [42], 1) for s in sequences])
        out = [np.array(r[-1], dtype=np.float64) for r in rows]
        for s in sequences:
            s.rollback(s.n_past - 1)
        return out

    before, positions = probe(), [s.cache_last_position() for s in sequences]
    assert target.compact() is not None
    assert target.freed == 0
    assert [s.cache_last_position() for s in sequences] == positions
    for old, new in zip(before, probe(), strict=True):
        assert int(np.argmax(old)) == int(np.argmax(new))
        np.testing.assert_allclose(new, old, rtol=0, atol=1e-3)


def test_a_batch_file_with_parallel_writes_every_line_in_order(
    smollm2_target: Path, smollm2_draft: Path, tmp_path: Path
) -> None:
    """``run -f prompts.jsonl --parallel 3``: every line, in the file's order, each the text
    the same line gives run one at a time."""
    lines = [{"id": f"p{i}", "prompt": p} for i, p in enumerate(PROMPTS + PROMPTS[:2])]
    file = tmp_path / "prompts.jsonl"
    file.write_text("".join(json.dumps(line) + "\n" for line in lines))
    common = [
        "run", "-f", str(file), "--target", str(smollm2_target), "--draft", str(smollm2_draft),
        "--temperature", "0", "-n", "24", "-t", "2", "--raw", "-c", "256",
    ]  # fmt: skip
    one = specgen_process(*common, "-k", "0", "--parallel", "1")
    many = specgen_process(*common, "--parallel", "3")
    assert one.returncode == many.returncode == 0, many.stderr
    alone = [json.loads(line) for line in one.stdout.splitlines()]
    together = [json.loads(line) for line in many.stdout.splitlines()]
    assert [r["id"] for r in together] == [line["id"] for line in lines]
    # Near ties aside (see the module's docstring), the texts are the same: most lines must be.
    same = sum(a["text"] == b["text"] for a, b in zip(alone, together, strict=True))
    assert same >= len(lines) - 1, [(a["text"], b["text"]) for a, b in zip(alone, together)]
