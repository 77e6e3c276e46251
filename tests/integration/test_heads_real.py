"""EAGLE3 and DFlash heads beside a real target: the SmolLM2 demo target (llama, 30 layers,
n_embd 576, a 49152-token vocabulary), with random heads of its shape written by the tests.

No trained head for SmolLM2 exists, and none could be downloaded: random heads' guesses rarely
survive, so these tests are about the plumbing at a real model's shapes (its layer states, a
reduced vocabulary mapped through d2t over a real vocabulary, a real tokenizer's prompts), not
acceptance. Greedy, the output must be the target's own, token for token, up to a near tie of
its logits where a batched verify rounds otherwise than the one-token pass
(``tests.near_ties``: one flipped once in 48 tokens under ``-k auto``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specgen.backend import LlamaModel, ModelOptions, attach_head
from specgen.core.sampling import SamplingParams
from specgen.drafters import make_drafter
from specgen.engine import GenerationConfig, SpeculativeEngine
from tests.fakes import run_to_end
from tests.near_ties import assert_same_up_to_near_ties
from tests.tiny_models import LlamaShape, write_dflash, write_eagle3

SMOLLM2 = LlamaShape(n_vocab=49152, n_embd=576, n_head=9, n_ff=1536, n_layer=30, n_ctx_train=8192)
GREEDY = SamplingParams(temperature=0.0)
NEAR_TIE = 0.01  # logits: where the kernels' rounding can decide; a real fault is far larger
PROMPTS = ["The history of the Roman Empire", "def fibonacci(n):\n"]


@pytest.fixture(scope="module")
def heads(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("smollm2-heads")
    return {
        "eagle3": write_eagle3(folder / "eagle3.gguf", SMOLLM2, layers=(2, 14, 26)),
        "eagle3-d2t": write_eagle3(
            folder / "eagle3-d2t.gguf", SMOLLM2, layers=(2, 14, 26), draft_vocab=4096
        ),
        "dflash": write_dflash(folder / "dflash.gguf", SMOLLM2, layers=(4, 14, 24), block_size=9),
    }


@pytest.mark.parametrize("name", ["eagle3", "eagle3-d2t", "dflash"])
def test_a_head_beside_the_real_target_keeps_its_text(
    smollm2_target: Path, heads: dict[str, Path], name: str
) -> None:
    kind = name.split("-")[0]
    target = LlamaModel(smollm2_target, ModelOptions(n_ctx=512, n_threads=2))
    prompts = [target.tokenize(p) for p in PROMPTS]
    alone = [
        run_to_end(
            SpeculativeEngine(target),
            GenerationConfig(lookahead=0, sampling=GREEDY, max_tokens=48),
            p,
        )[0]
        for p in prompts
    ]
    head = attach_head(target, heads[name], kind)
    for k in (4, 8, "auto"):
        engine = SpeculativeEngine(target, make_drafter(None, True, head=head, target=target))
        for prompt, want in zip(prompts, alone, strict=True):
            config = GenerationConfig(lookahead=k, sampling=GREEDY, max_tokens=48)
            got, stats = run_to_end(engine, config, prompt)
            assert_same_up_to_near_ties(target, prompt, want, got, NEAR_TIE, f"{name} at K={k}")
            assert k == "auto" or stats.by_source[kind].drafted > 0
    target.close()
