"""A draft model's rows warped in llama.cpp's sampler chain (top-k, top-p, min-p, temperature on
the backend: the GPU way, forced here on the CPU), on real llama.cpp with tiny GGUFs the tests
write: the q its guesses are drawn from, and the target's law kept with them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from specgen.backend import LlamaModel, ModelOptions
from specgen.core.coupling import PickedRows, Picking, gumbel_pick
from specgen.core.sampling import SamplingParams, TopK, warp
from specgen.drafters import ModelDrafter
from specgen.engine import GenerationConfig, SpeculativeEngine
from tests.fakes import first_two_tally
from tests.stats_helpers import pooled_chisquare_pvalue
from tests.tiny_models import write_llama

PROMPT = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38]
# A target and a draft that favour the same few tokens: q overlaps p, guesses are kept and
# rejected both.
FOCUSED = {"output_scale": 0.1, "focus": 5.0}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("rows")
    return {
        "target": write_llama(folder / "target.gguf", **FOCUSED),
        "draft": write_llama(folder / "draft.gguf", seed=1, **FOCUSED),
    }


def load(path: Path) -> LlamaModel:
    model = LlamaModel(path, ModelOptions(n_ctx=512, n_threads=1, backend_sampling=True))
    model.rows_on_device = True  # as on a GPU: rows' top-k (and a draft's warp) on the backend
    return model


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(1.0, 12, 0.9, 0.05),
        SamplingParams(0.7, 12, 1.0, 0.0),
        SamplingParams(1.3, 8, 0.5, 0.2),
    ],
)
def test_rows_warped_on_the_backend_are_the_hosts_q(
    tiny: dict[str, Path], params: SamplingParams
) -> None:
    """Each row llama.cpp's chain warped holds the support and the probabilities the host's
    warp of the whole row gives (float32 on the backend); without ``warped`` the rows are the
    top-k alone, warped on the host."""
    draft = load(tiny["draft"])
    whole = [row.copy() for row in draft.decode(PROMPT, 3)]
    draft.reset()
    assert draft.sample_top_k(params.top_k, params) == params.top_k
    rows = draft.decode(PROMPT, 3)
    assert isinstance(rows, list) and len(rows) == 3
    for row, reference in zip(rows, whole, strict=True):
        assert isinstance(row, TopK) and row.warped == params and row.dist is not None
        got, want = warp(row, params), warp(reference, params)
        np.testing.assert_array_equal(got.ids, want.ids)
        np.testing.assert_allclose(got.probs, want.probs, rtol=1e-5)
    draft.reset()
    assert draft.sample_top_k(params.top_k) == params.top_k
    plain = draft.decode(PROMPT, 1)[0]
    assert isinstance(plain, TopK) and plain.dist is None and len(plain.ids) == params.top_k
    # Greedy needs no warp: its top-1 alone.
    draft.reset()
    assert draft.sample_top_k(1, SamplingParams(temperature=0)) == 1
    assert draft._rows.warped is None
    draft.close()


@pytest.mark.parametrize("coupling", ["residual", "gumbel"])
def test_guesses_from_backend_warped_rows_keep_the_target_distribution(
    tiny: dict[str, Path], coupling: str
) -> None:
    """Chi-square over fixed seeds on the first two tokens, the draft's q from its rows warped
    in llama.cpp's chain, the target's p from its top-k warped on the host (the Gumbel-max
    rule: a seed's tokens whichever way rows are read) or in its chain too (min(1, p/q)):
    their joint law must be p(x1) p(x2 | x1), computed from the target's whole rows."""
    sampling = SamplingParams(temperature=1.0, top_k=12, top_p=0.9, min_p=0.02)
    target, draft = load(tiny["target"]), load(tiny["draft"])
    p1 = warp(target.decode(PROMPT, 1)[0].copy(), sampling)
    second = {}
    for a in p1.ids.tolist():
        target.reset()
        second[a] = warp(target.decode([*PROMPT, a], 1)[0].copy(), sampling)
    target.reset()
    ids = p1.ids.tolist()
    expected = np.array([p1.prob(a) * second[a].dense(target.n_vocab) for a in ids])
    engine = SpeculativeEngine(target, ModelDrafter(draft))
    n = 1500
    config = GenerationConfig(lookahead=2, sampling=sampling, seed=0, coupling=coupling)
    counts, rejected = first_two_tally(engine, config, PROMPT, ids, "model", n)
    assert draft._rows.warped == sampling, "the draft's rows were warped on the backend"
    # The target's too, where no seed asks its p to be the host's warp of its rows.
    assert target._rows.warped == (sampling if coupling == "residual" else None)
    assert n / 8 < rejected < n - n / 8, "guesses are kept and rejected: the residual is used"
    assert pooled_chisquare_pvalue(counts, expected * n) > 1e-3
    target.close()
    draft.close()


@pytest.mark.parametrize("way", ["whole", "top-k", "top-1", "warped"])
def test_a_one_token_decode_reads_its_row_as_asked(tiny: dict[str, Path], way: str) -> None:
    """A draft's step (``decode([token], 1)``, one batch) reads its row whole, as its top-k,
    as its argmax alone or warped on the backend: each the whole row's own, step after step
    and after a rollback."""
    params = SamplingParams(0.8, 12, 0.9, 0.05)
    reading, whole = load(tiny["draft"]), load(tiny["draft"])
    if way == "top-1":  # greedy's rows on a device: the argmax alone
        assert reading.sample_top_k(1) == 1
    elif way != "whole":
        reading.sample_top_k(params.top_k, params if way == "warped" else None)
    for model in (reading, whole):
        model.decode(PROMPT, 0)

    def same_row(token: int) -> None:
        got, row = reading.decode([token], 1)[0], np.array(whole.decode([token], 1)[0])
        assert reading.n_past == whole.n_past
        if way == "whole":
            np.testing.assert_array_equal(got, row)
            return
        assert isinstance(got, TopK)
        if way == "warped":
            q, want = warp(got, params), warp(row, params)
            np.testing.assert_array_equal(q.ids, want.ids)
            np.testing.assert_allclose(q.probs, want.probs, rtol=1e-5)
            return
        k = len(got.ids)  # the row's top-k itself: its ids and logits
        np.testing.assert_array_equal(np.sort(got.ids), np.sort(np.argsort(-row)[:k]))
        np.testing.assert_allclose(np.sort(got.logits), np.sort(row)[-k:], rtol=1e-6)

    for token in (5, 9, 5, 77):
        same_row(token)
    for model in (reading, whole):  # nothing to read (a catch-up with nothing new) is no batch
        assert len(model.decode([], 0)) == 0
    reading.rollback(len(PROMPT) + 1)
    whole.rollback(len(PROMPT) + 1)
    same_row(9)
    reading.close()
    whole.close()


@pytest.mark.parametrize("way", ["whole", "top-1", "warped"])
def test_a_one_token_step_is_decode_together_s_own(tiny: dict[str, Path], way: str) -> None:
    """``decode`` of one token takes a shorter way than ``decode_together`` (a draft's step,
    K a cycle): the same cache, the same rows, a row or none, step after step and after a
    rollback."""
    params = SamplingParams(0.8, 12, 0.9, 0.05)
    lean, general = load(tiny["draft"]), load(tiny["draft"])
    for model in (lean, general):
        if way == "top-1":
            assert model.sample_top_k(1) == 1
        elif way == "warped":
            model.sample_top_k(params.top_k, params)
        model.decode(PROMPT, 0)

    def same(token: int, n_logits: int) -> None:
        got = lean.decode([token], n_logits)
        want = general.decode_together([(general, [token], n_logits)])[0]
        assert lean.n_past == general.n_past
        assert len(got) == len(want) == n_logits
        for a, b in zip(got, want, strict=True):
            if way == "whole":
                np.testing.assert_array_equal(np.array(a), np.array(b))
            else:
                assert isinstance(a, TopK) and isinstance(b, TopK)
                np.testing.assert_array_equal(a.ids, b.ids)
                np.testing.assert_array_equal(a.logits, b.logits)

    for token, n_logits in ((5, 1), (9, 0), (5, 1), (77, 1)):
        same(token, n_logits)
    for model in (lean, general):
        model.rollback(len(PROMPT) + 1)
    same(9, 1)
    lean.close()
    general.close()


def test_a_warped_row_reads_the_same_support_sorted_or_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """llama.cpp's buffer holds a row's candidates a vocabulary apart; where the chain's -inf
    all come last only the support's ids are read, else every candidate is (the -inf spread
    out, or as many as the support's room with one inside it): the same q."""
    import ctypes

    from specgen.backend import rows as reader

    n, k = 50, 6
    params = SamplingParams(0.8, k, 0.9, 0.05)
    ids = (ctypes.c_int32 * (3 * n))()
    logits = (ctypes.c_float * (3 * n))()
    inf = float("-inf")
    rows = [([7, 3, 40, 1, 2, 9], [2.5, 1.0, 0.5, inf, inf, inf]),  # sorted: a prefix
            ([7, 1, 3, 2, 40, 9], [2.5, inf, 1.0, inf, 0.5, inf]),
            ([7, 3, 1, 40, 2, 9], [2.5, 1.0, inf, 0.5, inf, inf])]  # one inside  # fmt: skip
    for r, (row_ids, row_logits) in enumerate(rows):
        for j in range(k):
            ids[r * n + j], logits[r * n + j] = row_ids[j], row_logits[j]
    monkeypatch.setattr(reader, "_candidates_at", lambda ctx, i: ctypes.addressof(ids))
    monkeypatch.setattr(reader, "_logits_at", lambda ctx, i: ctypes.addressof(logits))
    top = reader.TopKRows(None, n, False, "fake")
    top.k, top.warped = k, params
    top._row_types = (ctypes.c_int32 * k, ctypes.c_float * k)
    got = top.rows(3, 0)
    assert len(got) == 3
    want = TopK.final(rows[0][0], rows[0][1], n, params)
    for row in got:
        assert row.dist is not None and want.dist is not None
        assert row.dist.lists() == want.dist.lists() == ([3, 7, 40], row.dist.lists()[1])
        assert warp(row, params).lists() == want.dist.lists()


def several(
    path: Path, n: int, warped: SamplingParams | None, n_logits: int
) -> tuple[LlamaModel, list[LlamaModel]]:
    """A context of ``n`` sequences, each reading its rows' top-12 from the backend (``warped``
    by its chain where given), each having decoded a prompt of its own."""
    model = LlamaModel(path, ModelOptions(n_ctx=256, n_threads=1, backend_sampling=True, n_seq=n))
    sequences = [model.sequence(i) for i in range(n)]
    for i, sequence in enumerate(sequences):
        sequence.rows_on_device = True
        assert sequence.sample_top_k(12, warped) == 12
        sequence.decode(PROMPT[i:], n_logits)
    return model, sequences


def test_a_pass_s_verifies_are_read_and_picked_in_one_block(tiny: dict[str, Path]) -> None:
    """Sequences' verifies in one decode, each asking for its rows' Gumbel-max picks
    (``Picking``), come back as ``PickedRows``: the rows that decode gives read row by row, and
    each pick ``gumbel_pick(warp(row))``'s, in two blocks (two warps) whose rows lie among
    other sequences' that asked nothing (a prompt's chunk first and last, a chunk that reads no
    row between), a seed past 2^64 among them. Too few rows are left to each rule."""
    warm, cold = SamplingParams(0.9, 12, 0.9, 0.05), SamplingParams(0.5, 12, 1.0, 0.1)
    target, sequences = several(tiny["target"], 7, None, n_logits=1)
    items = [
        (sequences[0], [21, 22, 23], 1),  # a prompt's chunk: no picks asked
        (sequences[1], [5, 9, 14, 3, 77, 8, 2, 40, 11], 9),
        (sequences[2], [31, 32, 33, 34], 0),  # a chunk that reads no row
        (sequences[3], [6, 6, 30, 12, 9, 1, 4, 18, 19], 9),
        (sequences[4], [7, 70, 13, 2, 50, 61, 8], 7),
        (sequences[5], [1, 2, 3, 4, 5, 6, 7, 8, 9], 9),
        (sequences[6], [44, 45], 1),
    ]
    pickings = [
        None,
        Picking(warm, 7, 100),
        None,
        Picking(cold, 8, 3),
        Picking(warm, 2**64 + 5, 0),
        Picking(cold, 2**40, 17),
        None,
    ]
    starts = [s.n_past for s in sequences]

    def again() -> None:
        for sequence, start in zip(sequences, starts, strict=True):
            sequence.rollback(start)

    plain = target.decode_together(items)
    again()
    picked = target.decode_together(items, pickings)
    for j, picking in enumerate(pickings):
        got, rows = picked[j], plain[j]
        if picking is None:
            assert not isinstance(got, PickedRows)
            continue
        assert isinstance(got, PickedRows) and got.picking == picking
        assert isinstance(rows, list) and len(got) == len(rows) == items[j][2]
        for a, b in zip(got, rows, strict=True):
            assert a.lists() == b.lists()
        assert got.picks == [
            gumbel_pick(warp(row, picking.params), picking.seed, picking.position + i)
            for i, row in enumerate(rows)
        ]
    again()
    few = target.decode_together(items[3:], pickings[3:4] + [None] * 3)  # 9 rows, fewer than 16
    assert not any(isinstance(rows, PickedRows) for rows in few)
    target.close()


def test_draft_steps_of_several_sequences_are_read_in_one_loop(
    tiny: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several sequences' draft steps in one decode (a row each from one warped chain, a first
    step reading a kept guess too) are read together, llama.cpp asked for the first and the
    last row's addresses alone: every row the one each sequence reads on its own from the same
    decode. Where the chains differ (another warp, a top-k alone) each is read on its own."""
    from specgen.backend import llama as backend
    from specgen.backend import rows as reader

    warm, cold = SamplingParams(0.9, 12, 0.9, 0.05), SamplingParams(0.5, 12, 1.0, 0.1)
    draft, sequences = several(tiny["draft"], 4, warm, n_logits=0)
    starts = [s.n_past for s in sequences]
    asked = [0]
    addresses = reader.TopKRows._addresses

    def counted(self: reader.TopKRows, first: int) -> tuple[int, int]:
        asked[0] += 1
        return addresses(self, first)

    monkeypatch.setattr(reader.TopKRows, "_addresses", counted)
    together = backend.read_steps

    def read(items: list[tuple[LlamaModel, list[int], int]], one_loop: bool) -> list[TopK]:
        """The batch decoded, its rows read together or each on its own; rolled back."""
        asked[0] = 0
        monkeypatch.setattr(backend, "read_steps", together if one_loop else lambda *_: None)
        rows = draft.decode_together(items)
        for sequence, start in zip(sequences, starts, strict=True):
            sequence.rollback(start)
        assert [len(got) for got in rows] == [1] * len(items)
        return [got[0] for got in rows]

    def same(got: list[TopK], want: list[TopK]) -> None:
        for row, other in zip(got, want, strict=True):
            assert isinstance(row, TopK) and row.lists() == other.lists()
            assert (row.dist is None) == (other.dist is None)
            if row.dist is not None and other.dist is not None:  # a warped row's q
                assert row.dist.lists() == other.dist.lists()

    for steps in ([5], [9], [77], [3]), ([5], [9, 40], [77], [3]), ([5, 6], [9], [1, 77], [3, 4]):
        items = [(s, list(t), 1) for s, t in zip(sequences, steps, strict=True)]
        want = read(items, one_loop=False)
        assert asked[0] == 4
        same(read(items, one_loop=True), want)
        assert asked[0] == 2, "the first and the last row's addresses, asked of llama.cpp"
    # One chain unlike the others: each read on its own.
    for way in (cold, None):
        sequences[2].sample_top_k(12, way)
        items = [(s, [t], 1) for s, t in zip(sequences, [5, 9, 77, 3], strict=True)]
        want = read(items, one_loop=False)
        same(read(items, one_loop=True), want)
        assert asked[0] == 4
        sequences[2].sample_top_k(12, warm)
    draft.close()
