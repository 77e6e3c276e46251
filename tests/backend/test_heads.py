"""EAGLE3 and DFlash heads on real llama.cpp, beside a target they read the hidden states of.

The models are tiny random GGUFs the ``gguf`` package writes at test time
(``tests.tiny_models``): an attention target (llama), a hybrid one (qwen35), and heads for them.
No EAGLE3 or DFlash weights can be downloaded here; random ones say nothing of acceptance, but
keep greedy identity, the accept/resample law and the rollback arithmetic meaningful.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from specgen.backend import LlamaModel, ModelOptions, attach_head
from specgen.backend.heads import DFlashHead, Eagle3Head
from specgen.core.sampling import SamplingParams, warp
from specgen.drafters import Drafter, make_drafter
from specgen.engine import GenerationConfig, SpeculativeEngine
from specgen.errors import BackendError
from tests.fakes import first_two_tally, run_to_end, run_together
from tests.stats_helpers import pooled_chisquare_pvalue
from tests.tiny_models import (
    LLAMA,
    Qwen35Shape,
    write_dflash,
    write_eagle3,
    write_llama,
    write_qwen35,
)

GREEDY = SamplingParams(temperature=0.0)
PROMPT = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38]
LOOKAHEADS = [1, 2, 3, 4, 5, 6, 7, 8, "auto"]
QWEN35 = Qwen35Shape(n_trunk=4)  # layers 0..3, of which 1 and 3 attention
FOCUSED = {"output_scale": 0.1, "focus": 5.0}
# A rolled-back head against a fresh one: the target's states of a one-token decode come from
# other kernels than a batch's (llama.cpp's matrix-vector path), about 1e-3 apart on logits of
# about 25; a head that kept what it should have dropped is off by whole units, or fails.
TOLERANCE = 5e-3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("heads")
    return {
        "target": write_llama(folder / "target.gguf"),
        "eagle3": write_eagle3(folder / "eagle3.gguf"),
        "eagle3-d2t": write_eagle3(folder / "eagle3-d2t.gguf", draft_vocab=48),
        "dflash": write_dflash(folder / "dflash.gguf", block_size=9),
        "hybrid": write_qwen35(folder / "hybrid.gguf", QWEN35),
        "hybrid-eagle3": write_eagle3(folder / "hybrid-eagle3.gguf", layers=(0, 1, 3)),
        "hybrid-dflash": write_dflash(folder / "hybrid-dflash.gguf"),
        # Where q must overlap p: a target and heads that favour the same tokens.
        "focused": write_llama(folder / "focused.gguf", **FOCUSED),
        "focused-eagle3": write_eagle3(folder / "focused-eagle3.gguf", **FOCUSED),
        "focused-eagle3-d2t": write_eagle3(
            folder / "focused-eagle3-d2t.gguf", draft_vocab=48, **FOCUSED
        ),
        "focused-dflash": write_dflash(folder / "focused-dflash.gguf"),
    }


HEADS = {"eagle3": "eagle3", "eagle3-d2t": "eagle3", "dflash": "dflash"}


def load(path: Path, window: int = 0) -> LlamaModel:
    return LlamaModel(path, ModelOptions(n_ctx=512, n_threads=1, rollback_window=window))


def alone(target: LlamaModel, n: int = 40) -> list[int]:
    config = GenerationConfig(lookahead=0, sampling=GREEDY, max_tokens=n)
    return run_to_end(SpeculativeEngine(target), config, PROMPT)[0]


@pytest.mark.parametrize("name", HEADS)
def test_a_head_alone_and_beside_ngrams_is_the_target_alone(
    tiny: dict[str, Path], name: str
) -> None:
    """Greedy identity at K 1..8 and auto: each guess is kept only where it is the target's."""
    target = load(tiny["target"])
    expected = alone(target)
    head = attach_head(target, tiny[name], HEADS[name])
    assert alone(target) == expected, "the head reading the target changes nothing"
    for ngram in (False, True):
        for k in LOOKAHEADS:
            drafter = make_drafter(None, ngram, head=head, target=target)
            config = GenerationConfig(lookahead=k, sampling=GREEDY, max_tokens=40)
            tokens, stats = run_to_end(SpeculativeEngine(target, drafter), config, PROMPT)
            assert tokens == expected, (name, ngram, k)
            assert HEADS[name] in stats.by_source or k == "auto", "the head drafted"
    target.close()


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_a_head_on_a_hybrid_target_is_the_target_alone(tiny: dict[str, Path], kind: str) -> None:
    """A hybrid (DeltaNet + attention) target rolls back by snapshots; the head with it."""
    target = load(tiny["hybrid"], 8)
    expected = alone(target)
    head = attach_head(target, tiny[f"hybrid-{kind}"], kind)
    for k in (1, 4, 8):
        drafter = make_drafter(None, False, head=head, target=target)
        config = GenerationConfig(lookahead=k, sampling=GREEDY, max_tokens=40)
        tokens, stats = run_to_end(SpeculativeEngine(target, drafter), config, PROMPT)
        assert tokens == expected, (kind, k)
        assert stats.by_source[kind].drafted > 0
    assert target.rollbacks.bounded > 0
    target.close()


def test_a_dflash_block_is_one_pass_and_never_longer_than_trained(tiny: dict[str, Path]) -> None:
    target = load(tiny["target"])
    head = attach_head(target, tiny["dflash"], "dflash")
    assert isinstance(head, DFlashHead) and head.max_block == 8
    drafter = make_drafter(None, False, head=head, target=target)
    config = GenerationConfig(lookahead=12, sampling=GREEDY, max_tokens=30)
    _, stats = run_to_end(SpeculativeEngine(target, drafter), config, PROMPT)
    assert stats.by_source["dflash"].drafted > 0
    assert max(k for k, n in enumerate(stats.k_counts) if n) <= 8
    target.close()


def _first_two_law(target: LlamaModel, sampling: SamplingParams) -> tuple[list[int], np.ndarray]:
    p1 = warp(target.decode(PROMPT, 1)[0].copy(), sampling)
    p2 = {}
    for a in p1.ids.tolist():
        target.reset()
        p2[a] = warp(target.decode([*PROMPT, a], 1)[0].copy(), sampling).dense(target.n_vocab)
    target.reset()
    ids = p1.ids.tolist()
    return ids, np.array([p1.prob(a) * p2[a] for a in ids])


@pytest.mark.parametrize("coupling", ["residual", "gumbel"])
@pytest.mark.parametrize("name", HEADS)
def test_a_heads_guesses_keep_the_target_distribution(
    tiny: dict[str, Path], name: str, coupling: str
) -> None:
    """Chi-square over fixed seeds on the first two tokens: x1 from the prompt's pass, x2
    drafted by the head from its own q (an EAGLE3 row, through d2t where its vocabulary is
    reduced; a DFlash block's row) and kept by min(1, p/q), else drawn from the residual; or
    (``gumbel``) drafted as q's Gumbel-max pick and kept iff it is p's under the same noise.
    Their joint law must be p(x1) p(x2 | x1); a residual replaced by p (biased towards q) fails
    it: the focused files' q overlaps p by 0.2-0.4."""
    sampling = SamplingParams(temperature=1.0, top_k=12, top_p=1.0, min_p=0.0)
    target = load(tiny["focused"])
    ids, expected = _first_two_law(target, sampling)
    head = attach_head(target, tiny[f"focused-{name}"], HEADS[name])
    engine = SpeculativeEngine(target, make_drafter(None, False, head=head, target=target))
    n = 1500
    config = GenerationConfig(lookahead=2, sampling=sampling, seed=0, coupling=coupling)
    counts, rejected = first_two_tally(engine, config, PROMPT, ids, HEADS[name], n)
    assert n / 4 < rejected < n - n / 8, "guesses are kept and rejected: the residual is used"
    assert pooled_chisquare_pvalue(counts, expected * n) > 1e-3
    target.close()


def test_a_reduced_vocabulary_drafts_only_its_tokens(tiny: dict[str, Path]) -> None:
    """An EAGLE3 head with a reduced vocabulary (d2t): its row is the target's vocabulary, its
    tokens finite, every other -inf (q is zero there). Its first read writes the pairs of
    positions 0 to the one before last, nothing before 0."""
    import llama_cpp

    target = load(tiny["target"])
    head = attach_head(target, tiny["eagle3-d2t"], "eagle3")
    assert isinstance(head, Eagle3Head)
    target.decode(PROMPT, 1)
    head.catch_up()
    assert llama_cpp.llama_memory_seq_pos_min(head._mem, 0) == 0
    assert llama_cpp.llama_memory_seq_pos_max(head._mem, 0) == len(PROMPT) - 2
    row = np.asarray(head.start(7))
    head.end()
    assert row.shape == (LLAMA.n_vocab,)
    assert np.isfinite(row).sum() == 48 and np.isneginf(row).sum() == LLAMA.n_vocab - 48
    target.close()


def _rows_after(
    path: Path, head_path: Path, kind: str, prompt: list[int], token: int, window: int = 0
) -> list[np.ndarray]:
    """A fresh target and head: the head's rows for guesses after ``token``."""
    target = load(path, window)
    head = attach_head(target, head_path, kind)
    target.decode(prompt, 1)
    head.catch_up()
    rows = _draft(head, token)
    target.close()
    return rows


def _draft(head: Eagle3Head | DFlashHead, token: int) -> list[np.ndarray]:
    if isinstance(head, DFlashHead):
        rows = [np.asarray(r).copy() for r in head.block(token, 3)]
    else:
        rows = [np.asarray(head.start(token)).copy()]
        rows.append(np.asarray(head.step(int(np.argmax(rows[0])))).copy())
    head.end()
    return rows


@pytest.mark.parametrize("name", ["eagle3", "dflash"])
def test_after_a_rollback_the_head_drafts_as_a_fresh_one(tiny: dict[str, Path], name: str) -> None:
    """Drafted, verified, cut back by three, decoded on: the head's next rows equal those of a
    fresh target and head that read the kept text alone."""
    kind = HEADS[name]
    target = load(tiny["target"])
    head = attach_head(target, tiny[name], kind)
    target.decode(PROMPT, 1)
    head.catch_up()
    _draft(head, 40)
    target.decode([40, 5, 6, 7, 8], 5)  # a verify pass of [last, 4 guesses]
    target.rollback(len(PROMPT) + 2)  # keeps 40, 5
    target.decode([6], 1)  # the target's own next token
    head.catch_up()
    after = _draft(head, 9)
    fresh = _rows_after(tiny["target"], tiny[name], kind, [*PROMPT, 40, 5, 6], 9)
    for got, want in zip(after, fresh, strict=True):
        np.testing.assert_allclose(got, want, atol=TOLERANCE)
    target.close()


def test_bad_and_mismatched_heads_are_one_line(tiny: dict[str, Path], tmp_path: Path) -> None:
    target = load(tiny["target"])
    far = write_eagle3(tmp_path / "far.gguf", layers=(0, 1, 9))  # the target has 4 layers
    with pytest.raises(BackendError, match=r"reads layers \[0, 1, 9\].*another target"):
        attach_head(target, far, "eagle3")
    with pytest.raises(BackendError, match="is a llama model, not an EAGLE3 head"):
        attach_head(target, tiny["target"], "eagle3")
    with pytest.raises(BackendError, match="is a eagle3 model, not a DFlash head"):
        attach_head(target, tiny["eagle3"], "dflash")
    from specgen.backend import heads as backend_heads

    enabled: list[int] = []
    api = backend_heads._bound()
    real_enable = api.set_layer_inp
    api.set_layer_inp = lambda ctx, lid, on: (enabled.append(lid), real_enable(ctx, lid, on))[1]
    try:
        final = write_eagle3(tmp_path / "final.gguf", layers=(0, 1, 4))
        with pytest.raises(BackendError, match=r"final hidden state of target.gguf \(layer 4\)"):
            attach_head(target, final, "eagle3")
        wide = write_eagle3(tmp_path / "wide.gguf", replace(LLAMA, n_embd=128))
        with pytest.raises(BackendError, match="reads hidden states 128 wide and those of"):
            attach_head(target, wide, "eagle3")
        maskless = write_dflash(tmp_path / "maskless.gguf", mask=False)
        with pytest.raises(BackendError, match="names no mask token"):
            attach_head(target, maskless, "dflash")
        assert enabled == [], "a refused head has the target hand out nothing"
    finally:
        api.set_layer_inp = real_enable
    small = write_eagle3(tmp_path / "small.gguf", replace(LLAMA, n_vocab=96))
    with pytest.raises(BackendError, match="a vocabulary of 96 tokens and target.gguf one of 128"):
        attach_head(target, small, "eagle3")
    with pytest.raises(BackendError, match="unknown kind of head"):
        attach_head(target, tiny["eagle3"], "medusa")
    qwen2 = load(write_llama(tmp_path / "qwen2.gguf", arch="qwen2"))
    with pytest.raises(BackendError, match="is a qwen2 model, whose layers llama.cpp cannot"):
        attach_head(qwen2, tiny["eagle3"], "eagle3")  # llama.cpp would abort on its decode
    assert qwen2.decode(PROMPT, 1) is not None and not qwen2._shared.weights  # nothing kept
    qwen2.close()
    head = attach_head(target, tiny["eagle3"], "eagle3")
    with pytest.raises(BackendError, match="has a head already"):
        attach_head(target, tiny["dflash"], "dflash")
    assert target.head is head
    target.close()


@pytest.mark.parametrize("name", ["eagle3", "dflash"])
def test_a_cut_into_what_the_head_has_read_drops_it(tiny: dict[str, Path], name: str) -> None:
    """The head caught up with the whole prompt, then the target goes back two tokens and on
    with another: the head's next rows are a fresh head's on the text kept."""
    kind = HEADS[name]
    target = load(tiny["target"])
    head = attach_head(target, tiny[name], kind)
    target.decode(PROMPT, 1)
    head.catch_up()
    target.rollback(len(PROMPT) - 2)
    target.decode([50], 1)
    head.catch_up()
    after = _draft(head, 9)
    fresh = _rows_after(tiny["target"], tiny[name], kind, [*PROMPT[:-2], 50], 9)
    for got, want in zip(after, fresh, strict=True):
        np.testing.assert_allclose(got, want, atol=TOLERANCE)
    target.close()


PROMPTS = [PROMPT, PROMPT[::-1], [7, 8, 9, 10, 11, 12], [100, 3, 50, 51, 52, 2, 90]]
# A head beside a batch against a fresh one: the target's states come from passes over other
# sequences' tokens too (other matrix shapes), a few 1e-3 apart on logits of about 25; a head
# that read another sequence's rows is off by whole units.
BATCH_TOLERANCE = 0.05


@pytest.mark.parametrize("which", ["target", "hybrid"])
@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_four_sequences_each_draft_from_their_own_head(
    tiny: dict[str, Path], kind: str, which: str
) -> None:
    """Four generations at once, each on its own sequence of one target context with a head
    of its own (one copy of the weights), at K 1, 3, 8 and auto: each is the target alone on
    its prompt, and each head ends where a fresh head on that sequence's text alone would (it
    never read another sequence's states). On an attention target and a hybrid one."""
    window = 8 if which == "hybrid" else 0
    name = kind if which == "target" else f"hybrid-{kind}"
    options = ModelOptions(n_ctx=256, n_threads=1, n_seq=4, rollback_window=window)
    target = LlamaModel(tiny[which], options)
    heads = [attach_head(target.sequence(i), tiny[name], kind) for i in range(4)]
    assert len(target._shared.weights) == 1, "the four heads share one copy of the weights"

    def drafter_of(i: int) -> Drafter | None:
        return make_drafter(None, False, head=heads[i], target=target.sequence(i))

    done, streams = run_together(target, [], drafter_of, PROMPTS, (1, 3, 8, "auto"), kind)
    assert max(streams.stats.sequences) == 4, "verified all four at once"
    alone_target = load(tiny[which], window)
    for i, prompt in enumerate(PROMPTS):
        config = GenerationConfig(lookahead=0, sampling=GREEDY, max_tokens=30)
        want, _ = run_to_end(SpeculativeEngine(alone_target), config, prompt)
        got, stats = done[i]
        assert got == want, i
        assert i == 3 or stats.by_source[kind].drafted > 0  # type: ignore[attr-defined]
    alone_target.close()
    for i, prompt in enumerate(PROMPTS):
        sequence = target.sequence(i)
        text = [*prompt, *done[i][0]]
        heads[i].catch_up()
        after = _draft(heads[i], text[sequence.n_past])
        fresh = _rows_after(
            tiny[which], tiny[name], kind, text[: sequence.n_past], text[sequence.n_past], window
        )
        for got_row, want_row in zip(after, fresh, strict=True):
            np.testing.assert_allclose(got_row, want_row, atol=BATCH_TOLERANCE)
    target.close()


def test_the_header_check_and_the_backend_know_the_same_targets() -> None:
    """The targets whose layers a head can read: refused from the header before loading
    (``models.arch``), and by the backend for a head attached directly; one list."""
    from specgen.backend.heads import HEAD_NAMES as BACKEND_NAMES
    from specgen.backend.heads import LAYER_STATE_ARCHS as BACKEND_ARCHS
    from specgen.models.arch import HEAD_NAMES, LAYER_STATE_ARCHS

    assert BACKEND_ARCHS == LAYER_STATE_ARCHS and BACKEND_NAMES == HEAD_NAMES
