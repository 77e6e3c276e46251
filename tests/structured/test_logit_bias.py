"""A logit bias, added to the target's logits and the draft's alike: the output follows the
biased target exactly (greedy: the biased target alone's; sampled: chi-square), on fakes."""

from __future__ import annotations

import numpy as np
import pytest

from specgen.core.sampling import SamplingParams, warp
from specgen.drafters import HybridDrafter, ModelDrafter
from specgen.engine import GenerationConfig, SpeculativeEngine
from specgen.structured.grammar import LogitBias
from tests.fakes import FakeModel, run_to_end
from tests.invoke import one_line_error, specgen_here
from tests.stats_helpers import pooled_chisquare_pvalue

GREEDY = SamplingParams(temperature=0)
SAMPLING = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
PROMPT = [1, 2, 3]


def test_greedy_under_a_bias_is_the_biased_target_alone() -> None:
    plain, _ = run_to_end(SpeculativeEngine(FakeModel()), GenerationConfig(0, GREEDY, 24), PROMPT)
    banned = plain[0]
    bias = LogitBias.from_mapping({banned: -100, str((banned + 1) % 16): 2.5})
    config = GenerationConfig(0, GREEDY, 24, logit_bias=bias)
    alone, _ = run_to_end(SpeculativeEngine(FakeModel()), config, PROMPT)
    assert banned not in alone
    ways = [
        (ModelDrafter(FakeModel(noise=0.5, salt=3)), 4),
        (HybridDrafter(ModelDrafter(FakeModel(noise=0.5, salt=3))), "auto"),
    ]
    for drafter, k in ways:
        config = GenerationConfig(k, GREEDY, 24, logit_bias=bias)
        spec, stats = run_to_end(SpeculativeEngine(FakeModel(), drafter), config, PROMPT)
        assert spec == alone and stats.n_drafted > 0


def test_the_drafts_q_is_biased_as_the_targets_p_is() -> None:
    draft = FakeModel(noise=1.0, salt=9)
    bias = LogitBias.from_mapping({4: 3.0, 7: -100})
    drafter = ModelDrafter(draft)
    drafter.constrain(None, bias)
    drafter.begin([*PROMPT, 5])
    rng = np.random.default_rng(0)
    proposal = drafter.propose([*PROMPT, 5], None, 1, SAMPLING, rng)  # type: ignore[arg-type]
    expected = warp(bias.apply(FakeModel(noise=1.0, salt=9).logits_after([*PROMPT, 5])), SAMPLING)
    np.testing.assert_allclose(proposal.q[0].dense(16), expected.dense(16), atol=1e-12)
    assert proposal.q[0].prob(7) == pytest.approx(0.0, abs=1e-30)


def test_sampled_output_follows_the_biased_target() -> None:
    """Chi-square over fixed seeds on (x1, x2), x2 drafted by a draft that disagrees."""
    bias = LogitBias.from_mapping({4: 2.0, 7: -100, 9: 1.0})
    ref = FakeModel(sharpness=0.7)

    def p(context: list[int]) -> np.ndarray:
        return warp(bias.apply(ref.logits_after([*PROMPT, *context])), SAMPLING).dense(16)

    joint = np.array([p([])[a] * p([a]) for a in range(16)])
    engine = SpeculativeEngine(
        FakeModel(sharpness=0.7), ModelDrafter(FakeModel(sharpness=0.7, noise=1.0, salt=9))
    )
    n, counts = 3000, np.zeros((16, 16))
    for seed in range(n):
        config = GenerationConfig(2, SAMPLING, 3, seed=seed, logit_bias=bias)
        tokens, _ = run_to_end(engine, config, PROMPT)
        counts[tokens[0], tokens[1]] += 1
    assert counts[:, 7].sum() == counts[7].sum() == 0
    assert pooled_chisquare_pvalue(counts, joint * n) > 1e-3


@pytest.mark.parametrize(
    ("value", "said"),
    [("12", "give ID=BIAS"), ("x=1", "not a token id"), ("3=500", "outside [-100, 100]")],
)
def test_a_bad_logit_bias_is_one_line(fake_pair, value: str, said: str) -> None:
    one_line_error(
        specgen_here("run", *fake_pair.args("--logit-bias", value), "hello"), said, code=2
    )


def test_run_applies_the_bias(fake_pair) -> None:
    import json

    from tests.fakes import PIECES

    flags = ("--temperature", "0", "-n", "8", "--json", "--raw")
    base = json.loads(specgen_here("run", *fake_pair.args(*flags), "hello").stdout)
    first = base["text"][0]
    token = PIECES.index(first.encode())
    biased = specgen_here("run", *fake_pair.args(*flags, "--logit-bias", f"{token}=-100"), "hello")
    assert biased.returncode == 0, biased.stderr
    assert first not in json.loads(biased.stdout)["text"]
