"""Hybrid (DeltaNet + attention) models and the target's own MTP head, on real llama.cpp.

The models are tiny random qwen35 GGUFs the ``gguf`` package writes at test time
(``tests.tiny_models``): no 2026 weights are downloadable here, and random weights keep greedy
identity and the rollback arithmetic meaningful. Each loads in a fraction of a second.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from specgen.backend import LlamaModel, ModelOptions, attach_mtp
from specgen.core.sampling import SamplingParams, warp
from specgen.drafters import Drafter, make_drafter
from specgen.engine import GenerationConfig, SpeculativeEngine
from tests.fakes import run_to_end, run_together
from tests.stats_helpers import pooled_chisquare_pvalue
from tests.tiny_models import write_qwen35

GREEDY = SamplingParams(temperature=0.0)
PROMPT = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38]
LOOKAHEADS = [1, 2, 4, 8, "auto"]
FOUR = [PROMPT, PROMPT[::-1], [7, 8, 9, 10, 11, 12], [100, 3, 50, 51, 52, 2, 90]]
# The two ways a recurrent model rolls back: llama.cpp's snapshots (n_rs_seq 8, enough for
# K <= 8), or none at all, so every rollback restores a checkpoint.
WAYS = {"bounded": 8, "checkpoint": 0}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("qwen35")
    return {
        "target": write_qwen35(folder / "target.gguf"),
        "draft": write_qwen35(folder / "draft.gguf", seed=1),
        "mtp": write_qwen35(folder / "target-mtp.gguf", mtp=True),
    }


def load(path: Path, window: int, mtp: bool = False) -> LlamaModel:
    return LlamaModel(path, ModelOptions(n_ctx=512, n_threads=1, rollback_window=window, mtp=mtp))


def alone(target: LlamaModel, n: int = 40) -> list[int]:
    config = GenerationConfig(lookahead=0, sampling=GREEDY, max_tokens=n)
    return run_to_end(SpeculativeEngine(target), config, PROMPT)[0]


@pytest.mark.parametrize("way", WAYS)
def test_hybrid_target_with_hybrid_draft_or_ngrams_is_the_target_alone(
    tiny: dict[str, Path], way: str
) -> None:
    target, draft = load(tiny["target"], WAYS[way]), load(tiny["draft"], WAYS[way])
    assert target.recurrent and draft.recurrent
    assert target.rollback_window == WAYS[way]
    expected = alone(target)
    for ngram, with_draft in ((True, False), (False, True), (True, True)):
        for k in LOOKAHEADS:
            drafter = make_drafter(draft if with_draft else None, ngram)
            config = GenerationConfig(lookahead=k, sampling=GREEDY, max_tokens=40)
            tokens, _ = run_to_end(SpeculativeEngine(target, drafter), config, PROMPT)
            assert tokens == expected, (way, ngram, with_draft, k)
    # The way asked for is the way taken.
    if way == "bounded":
        assert target.rollbacks.bounded > 0 and target.rollbacks.checkpoint == 0
    else:
        assert target.rollbacks.checkpoint > 0 and target.rollbacks.bounded == 0
    assert draft.rollbacks.checkpoint + draft.rollbacks.bounded > 0


@pytest.mark.parametrize("way", WAYS)
def test_mtp_head_alone_and_beside_ngrams_is_the_target_alone(
    tiny: dict[str, Path], way: str
) -> None:
    target = load(tiny["mtp"], WAYS[way], mtp=True)
    expected = alone(target)
    head = attach_mtp(target)
    assert alone(target) == expected, "reading with the head changes nothing"
    for ngram in (False, True):
        for k in LOOKAHEADS:
            drafter = make_drafter(None, ngram, head=head, target=target)
            config = GenerationConfig(lookahead=k, sampling=GREEDY, max_tokens=40)
            tokens, stats = run_to_end(SpeculativeEngine(target, drafter), config, PROMPT)
            assert tokens == expected, (way, ngram, k)
            assert "mtp" in stats.by_source, "the head drafted"
    counts = target.rollbacks
    assert (counts.bounded if way == "bounded" else counts.checkpoint) > 0


def test_a_fixed_k_past_the_snapshots_takes_a_checkpoint(tiny: dict[str, Path]) -> None:
    """K beyond n_rs_seq: llama.cpp's snapshots cannot cover the cycle, a checkpoint does."""
    target = load(tiny["target"], 2)
    expected = alone(target)
    config = GenerationConfig(lookahead=6, sampling=GREEDY, max_tokens=40)
    tokens, _ = run_to_end(SpeculativeEngine(target, make_drafter(None, True)), config, PROMPT)
    assert tokens == expected
    assert target.rollbacks.checkpoints > 0


def test_auto_asks_for_no_more_than_the_snapshots_cover(tiny: dict[str, Path]) -> None:
    target = load(tiny["target"], 3)
    draft = load(tiny["draft"], 3)
    config = GenerationConfig(lookahead="auto", sampling=GREEDY, max_tokens=60)
    _, stats = run_to_end(SpeculativeEngine(target, make_drafter(draft, True)), config, PROMPT)
    assert stats.n_drafted > 0
    assert max(stats.k_counts) <= 3
    assert target.rollbacks.checkpoints == 0


def _fresh_logits(path: Path, tokens: list[int]) -> np.ndarray:
    fresh = load(path, 0)
    return fresh.decode(tokens, 1)[0].copy()


@pytest.mark.parametrize("way", WAYS)
def test_logits_after_a_rollback_are_a_fresh_contexts(tiny: dict[str, Path], way: str) -> None:
    """Verify-pass shape (one batch, rolled back by 3) and draft shape (one token a decode,
    rolled back over several decodes): the next logits equal a fresh context's."""
    model = load(tiny["target"], WAYS[way])
    model.decode(PROMPT, 0)
    model.keep_rollback_point(4)
    model.decode([5, 6, 7, 8, 9], 5)
    model.rollback(len(PROMPT) + 2)
    after = model.decode([40], 1)[0].copy()
    np.testing.assert_allclose(after, _fresh_logits(tiny["target"], [*PROMPT, 5, 6, 40]), atol=1e-3)

    model.keep_rollback_point(3, one_decode=False)
    for token in (11, 12, 13):
        model.decode([token], 1)
    model.rollback(len(PROMPT) + 4)
    after = model.decode([41], 1)[0].copy()
    expected = _fresh_logits(tiny["target"], [*PROMPT, 5, 6, 40, 11, 41])
    np.testing.assert_allclose(after, expected, atol=1e-3)


def test_a_rollback_nothing_covers_fails_clearly(tiny: dict[str, Path]) -> None:
    from specgen.errors import BackendError

    model = load(tiny["target"], 0)
    model.decode(PROMPT, 0)
    with pytest.raises(BackendError, match="cannot roll back its cache by 3 tokens"):
        model.rollback(len(PROMPT) - 3)


def test_a_recurrent_target_reads_a_reused_prefix_again(tiny: dict[str, Path]) -> None:
    """A chat that goes on reuses an attention model's cache; a recurrent state cannot go back
    to the shared prefix, so the prompt is read again, and the text is the same."""
    target = load(tiny["target"], 8)
    engine = SpeculativeEngine(target, make_drafter(None, True))
    config = GenerationConfig(lookahead=4, sampling=GREEDY, max_tokens=20)
    first = list(engine.generate(PROMPT, config))
    again = list(engine.generate([*PROMPT, 1, 2], config, reuse_prefix=True))
    assert again[-1].stats.n_prompt_cached == 0
    assert first[-1].stats.n_generated == 20


@pytest.mark.parametrize("coupling", ["residual", "gumbel"])
@pytest.mark.parametrize("on_device", [False, True])
def test_mtp_guesses_keep_the_target_distribution(
    tiny: dict[str, Path], on_device: bool, coupling: str
) -> None:
    """Chi-square over fixed seeds on the first two tokens: x1 from the prompt's own pass, x2
    drafted by the MTP head from its own full-vocabulary q and kept by min(1, p/q), else drawn
    from the residual; or (``gumbel``) drafted as q's Gumbel-max pick and kept iff it is p's
    under the same noise. Their joint law must be p(x1) p(x2 | x1). (A residual replaced by p,
    which biases towards q, fails this: the head's q overlaps p by about 10% here.) Rows read
    whole (here) and as their top-k from the backend (as on a GPU)."""
    sampling = SamplingParams(temperature=2.0, top_k=12, top_p=1.0, min_p=0.0)
    target = load(tiny["mtp"], 8, mtp=True)
    target.rows_on_device = on_device
    p1 = warp(target.decode(PROMPT, 1)[0].copy(), sampling)
    p2 = {}
    for a in p1.ids.tolist():
        target.reset()
        p2[a] = warp(target.decode([*PROMPT, a], 1)[0].copy(), sampling).dense(target.n_vocab)
    expected = np.array([p1.prob(a) * p2[a] for a in p1.ids.tolist()])
    target.reset()
    head = attach_mtp(target)
    engine = SpeculativeEngine(target, make_drafter(None, False, head=head, target=target))
    n, rows = 1500, {a: i for i, a in enumerate(p1.ids.tolist())}
    counts, rejected = np.zeros_like(expected), 0
    for seed in range(n):
        config = GenerationConfig(
            lookahead=2, sampling=sampling, max_tokens=3, seed=seed, coupling=coupling
        )
        tokens, stats = run_to_end(engine, config, PROMPT)
        assert stats.coupling == coupling
        counts[rows[tokens[0]], tokens[1]] += 1
        mtp = stats.by_source["mtp"]
        rejected += mtp.accepted < min(mtp.drafted, 1)
    assert rejected > n / 2, "the head's q differs from p: the residual is exercised"
    assert pooled_chisquare_pvalue(counts, expected * n) > 1e-3
    assert head.top_k == target.top_k == (12 if on_device else 0)


def test_the_heads_rows_from_the_backend_give_the_same_q(tiny: dict[str, Path]) -> None:
    """The MTP head's guesses' q, from its whole rows and from its backend top-k, agree."""
    sampling = SamplingParams(temperature=1.0, top_k=12, top_p=0.95, min_p=0.02)
    target = load(tiny["mtp"], 8, mtp=True)
    head = attach_mtp(target)
    target.decode(PROMPT, 1)
    head.catch_up()
    whole = [head.start(5).copy(), head.step(7).copy()]
    head.end()
    assert head.sample_top_k(12) == 12
    top = [head.start(5), head.step(7)]
    head.end()
    for got, want in zip(top, whole):
        a, b = warp(got, sampling), warp(want, sampling)
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_allclose(a.probs, b.probs, rtol=1e-6)


def test_the_head_reads_at_most_its_window_of_a_long_prompt(tiny: dict[str, Path]) -> None:
    """A prompt longer than READ_WINDOW: the head reads only its end, once, when first asked
    for guesses, and the output is still the target's own."""
    from specgen.backend.mtp import READ_WINDOW

    prompt = [(7 * i + 3) % 128 for i in range(READ_WINDOW + 44)]
    target = load(tiny["mtp"], 8, mtp=True)
    config = GenerationConfig(lookahead=0, sampling=GREEDY, max_tokens=24)
    expected, _ = run_to_end(SpeculativeEngine(target), config, prompt)
    head = attach_mtp(target)
    target.reset()
    target.decode(prompt, 1)
    assert head.catch_up() == READ_WINDOW and head.catch_up() == 0
    engine = SpeculativeEngine(target, make_drafter(None, False, head=head, target=target))
    tokens, stats = run_to_end(engine, replace(config, lookahead=3), prompt)
    assert tokens == expected and stats.by_source["mtp"].drafted > 0


@pytest.mark.parametrize("way", WAYS)
def test_hybrid_sequences_of_one_context_are_each_the_target_alone(
    tiny: dict[str, Path], way: str
) -> None:
    """Three sequences of a hybrid target (and a hybrid draft) at once, each rolling back its
    own state (by snapshot or checkpoint): each gives what the target alone gives its prompt."""
    from specgen.engine.streams import Streams
    from specgen.lookahead import BatchLoad, CostBook

    options = ModelOptions(n_ctx=256, n_threads=1, rollback_window=WAYS[way], n_seq=3)
    target, draft = LlamaModel(tiny["target"], options), LlamaModel(tiny["draft"], options)
    lone = load(tiny["target"], WAYS[way])
    prompts = [PROMPT, PROMPT[3:], [7, 7, 7, 1, 2]]
    config = GenerationConfig(lookahead=4, sampling=GREEDY, max_tokens=30)
    expected = [
        run_to_end(SpeculativeEngine(lone), replace(config, lookahead=0), p)[0] for p in prompts
    ]
    costs = CostBook()
    load_ = BatchLoad(costs)
    streams = Streams(target, [draft], load=load_)
    done: dict[int, list[int]] = {}
    for i, prompt in enumerate(prompts):
        engine = SpeculativeEngine(
            target.sequence(i),
            make_drafter(draft.sequence(i), ngram=True),
            costs=costs,
            load=load_,
            slot=i,
        )
        streams.add(
            lambda i=i, e=engine, p=prompt: done.__setitem__(i, run_to_end(e, config, p)[0])
        )
    streams.run()
    streams.close()
    assert [done[i] for i in range(3)] == expected
    assert max(streams.stats.sequences) == 3
    if way == "bounded":
        assert target.rollbacks.bounded > 0 and target.rollbacks.checkpoint == 0
    else:
        assert target.rollbacks.checkpoint > 0


def test_a_seed_gives_the_same_tokens_with_the_mtp_head_at_any_k(tiny: dict[str, Path]) -> None:
    """The Gumbel-max rule with the MTP head drafting: the target alone's keyed sample."""
    sampling = SamplingParams(temperature=1.0, top_k=12, top_p=1.0, min_p=0.0)
    target = load(tiny["mtp"], 8, mtp=True)
    for seed in range(4):
        target.reset()
        alone, _ = run_to_end(
            SpeculativeEngine(target), GenerationConfig(0, sampling, 12, seed=seed), PROMPT
        )
        for k in (1, 2, 3):
            target.reset()
            head = attach_mtp(target)
            engine = SpeculativeEngine(target, make_drafter(None, False, head=head, target=target))
            tokens, stats = run_to_end(engine, GenerationConfig(k, sampling, 12, seed=seed), PROMPT)
            assert stats.by_source["mtp"].drafted > 0
            assert tokens == alone, (seed, k)


def test_four_sequences_each_draft_from_the_mtp_head(tiny: dict[str, Path]) -> None:
    """Four generations at once on one hybrid target context with its MTP head, at K 1, 3, 4
    and auto: an MTP context a sequence, each head reading its own rows of the batched pass.
    Each is the target alone on its prompt (the passes' uneven lengths need checkpoints:
    ``test_uneven_passes_of_a_hybrid_batch_roll_back_by_checkpoint``)."""
    options = ModelOptions(n_ctx=256, n_threads=1, n_seq=4, rollback_window=8, mtp=True)
    target = LlamaModel(tiny["mtp"], options)
    heads = [attach_mtp(target.sequence(i)) for i in range(4)]

    def drafter_of(i: int) -> Drafter | None:
        return make_drafter(None, False, head=heads[i], target=target.sequence(i))

    done, streams = run_together(target, [], drafter_of, FOUR, (1, 3, 4, "auto"), "mtp")
    assert max(streams.stats.sequences) == 4, "verified all four at once"
    alone_target = load(tiny["mtp"], 8, mtp=True)
    for i, prompt in enumerate(FOUR):
        config = GenerationConfig(lookahead=0, sampling=GREEDY, max_tokens=30)
        assert done[i][0] == run_to_end(SpeculativeEngine(alone_target), config, prompt)[0], i
    alone_target.close()
    target.close()


@pytest.mark.parametrize("lookaheads", [(1, 3, 4, "auto"), (3, 3, 3, 3)])
def test_uneven_passes_of_a_hybrid_batch_roll_back_by_checkpoint(
    tiny: dict[str, Path], lookaheads: tuple[int | str, ...]
) -> None:
    """A hybrid target's batch of four sequences drafting from a hybrid draft model: llama.cpp
    cuts a pass whose sequences bring unequal lengths into several ubatches, and then a
    sequence's snapshots do not hold (a rollback by them left a wrong state: the K=1 sequence
    diverged at its 5th token where the target's margin was 4 logits). Such a rollback restores
    a checkpoint; an even pass still rolls back by snapshots. Each is the target alone."""
    options = ModelOptions(n_ctx=256, n_threads=1, n_seq=4, rollback_window=8)
    target = LlamaModel(tiny["target"], options)
    draft = LlamaModel(tiny["draft"], ModelOptions(n_ctx=256, n_threads=1, n_seq=4))

    def drafter_of(i: int) -> Drafter | None:
        return make_drafter(draft.sequence(i), False)

    done, _ = run_together(target, [draft], drafter_of, FOUR, lookaheads)
    alone_target = load(tiny["target"], 8)
    for i, prompt in enumerate(FOUR):
        config = GenerationConfig(lookahead=0, sampling=GREEDY, max_tokens=30)
        assert done[i][0] == run_to_end(SpeculativeEngine(alone_target), config, prompt)[0], i
    counts = target.rollbacks  # every sequence's, together
    if len(set(lookaheads)) > 1:
        assert counts.checkpoint > 0
    else:
        assert counts.bounded > 0
    alone_target.close()
    target.close()
    draft.close()
