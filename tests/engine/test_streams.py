"""Many generations at once on fake models (``engine.streams``): each sequence's output is what
the target gives it alone (greedy), follows the target's distribution (sampled), never sees
another's tokens, and the passes are batched as the scheduler promises."""

from __future__ import annotations

import numpy as np
import pytest

from specgen.core.coupling import Keyed, PickedRows, Picking, gumbel_pick
from specgen.core.sampling import SamplingParams, TopK, warp
from specgen.drafters import ModelDrafter, NgramDrafter, Proposal
from specgen.engine import GenerationConfig, SpeculativeEngine
from specgen.engine.streams import Streams
from specgen.engine.verify import verdict_on
from specgen.lookahead import BatchLoad, CostBook
from tests.fakes import FakeClock, FakeModel, Generation, drive
from tests.stats_helpers import pooled_chisquare_pvalue

GREEDY = SamplingParams(temperature=0.0)
PROMPTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10], [11, 3, 3], [2], [9, 9, 1]]


def _models(n_seq: int, clock: FakeClock, **target: object) -> tuple[FakeModel, FakeModel]:
    params = {"sharpness": 1.5, "call_seconds": 1.0, "token_seconds": 0.1, **target}
    tgt = FakeModel(n_seq=n_seq, clock=clock, **params)  # type: ignore[arg-type]
    draft = FakeModel(n_seq=n_seq, clock=clock, sharpness=1.5, noise=0.6, salt=5, call_seconds=0.2)
    return tgt, draft


def _engines(
    target: FakeModel, draft: FakeModel | None, n: int, load: BatchLoad, costs: CostBook
) -> list[SpeculativeEngine]:
    return [
        SpeculativeEngine(
            target.sequence(i),
            ModelDrafter(draft.sequence(i), clock=target.clock) if draft else None,
            costs=costs,
            clock=target.clock,
            load=load,
            slot=i,
        )
        for i in range(n)
    ]


def _run_together(
    engines: list[SpeculativeEngine],
    configs: list[GenerationConfig],
    prompts: list[list[int]],
    streams: Streams,
) -> list[Generation]:
    done: dict[int, Generation] = {}
    for i, (engine, config, prompt) in enumerate(zip(engines, configs, prompts, strict=True)):
        streams.add(lambda i=i, e=engine, c=config, p=prompt: done.__setitem__(i, drive(e, c, p)))
    streams.run()
    return [done[i] for i in range(len(engines))]


def _six() -> tuple[FakeModel, FakeModel, list[SpeculativeEngine], Streams]:
    """Six sequences' engines on one target and one draft context, and their scheduler."""
    clock = FakeClock()
    target, draft = _models(6, clock)
    costs, load = CostBook(), BatchLoad(CostBook())
    load.costs = costs
    engines = _engines(target, draft, 6, load, costs)
    return target, draft, engines, Streams(target, [draft], load=load, clock=clock)


@pytest.mark.parametrize("lookahead", [1, 4, 8, "auto"])
def test_each_sequence_is_the_target_alone_greedy(lookahead: object) -> None:
    """Six sequences of different prompt lengths at once: each one's tokens are the target's
    own greedy continuation of its prompt, as a lone target gives them."""
    target, draft, engines, streams = _six()
    configs = [
        GenerationConfig(lookahead=lookahead, sampling=GREEDY, max_tokens=20 + 3 * i)  # type: ignore[arg-type]
        for i in range(6)
    ]
    together = _run_together(engines, configs, PROMPTS, streams)
    for i, prompt in enumerate(PROMPTS):
        alone = drive(SpeculativeEngine(FakeModel(sharpness=1.5)), configs[i], prompt)
        assert together[i].tokens == alone.tokens, f"sequence {i}"
    # One target pass served several sequences at once, and the drafts were batched too.
    assert max(len(b) for b in target.batches) > 1
    if lookahead != "auto":
        assert max(len(b) for b in draft.batches) > 1


def test_a_sequence_never_sees_another_s_tokens() -> None:
    """Each sequence's cache holds its own prompt and output and nothing else; a fake's logits
    hash the whole cache, so one stray token would change every later token."""
    clock = FakeClock()
    target, draft = _models(3, clock)
    costs = CostBook()
    load = BatchLoad(costs)
    engines = _engines(target, draft, 3, load, costs)
    streams = Streams(target, [draft], load=load, clock=clock)
    config = GenerationConfig(lookahead=4, sampling=GREEDY, max_tokens=30)
    prompts = [[1] * 5, [2] * 5, [1] * 5]  # the same prompt twice, beside another
    out = _run_together(engines, [config] * 3, prompts, streams)
    assert out[0].tokens == out[2].tokens != out[1].tokens
    for i, prompt in enumerate(prompts):
        # What the target's cache of sequence i holds: the prompt and all but the last token.
        assert (
            target.sequence(i).cache
            == [*prompt, *out[i].cycle_tokens[:-1]][: len(target.sequence(i).cache)]
        )


def test_a_long_prompt_joins_in_chunks_beside_running_streams() -> None:
    """A prompt longer than a chunk is decoded a chunk per pass, each beside another
    sequence's verify, and its output is still the target's own."""
    clock = FakeClock()
    target, draft = _models(2, clock)
    costs = CostBook()
    load = BatchLoad(costs)
    engines = _engines(target, draft, 2, load, costs)
    streams = Streams(target, [draft], load=load, clock=clock, prompt_chunk=16)
    long_prompt = [int(x) for x in np.random.default_rng(1).integers(0, 16, 100)]
    config = GenerationConfig(lookahead=3, sampling=GREEDY, max_tokens=40)
    out = _run_together(engines, [config] * 2, [[1, 2], long_prompt], streams)
    alone = drive(SpeculativeEngine(FakeModel(sharpness=1.5)), config, long_prompt)
    assert out[1].tokens == alone.tokens
    chunks = [b for b in target.batches if any(seq == 1 and n == 16 for seq, n, _ in b)]
    assert len(chunks) >= 5 and any(len(b) == 2 for b in chunks)
    assert max(sum(n for _, n, _ in b) for b in target.batches) <= target.n_batch


@pytest.mark.parametrize(
    ("lookahead", "top_k"),
    [([1, 3, 6], 0), ([2, 0, 5], 0), ([6, 4, 6], 16)],
    ids=["whole-rows", "one-alone", "picked-together"],
)
def test_every_sequence_follows_the_target_distribution(lookahead: list[int], top_k: int) -> None:
    """Chi-square per sequence on (x2, x3), three sequences in flight at different K each
    generation, against the target's sum over x1 of p(x1) p(x2 | x1) p(x3 | x1 x2). Rows whole,
    or their top-k (all 16 tokens) from the backend, the verifies' rows then picked together
    (``pick_together``: 19 rows a pass)."""
    sampling = SamplingParams(temperature=1.0, top_k=top_k, top_p=1.0, min_p=0.0)
    prompts = [[1, 2, 3], [7, 7], [4, 0, 9, 2]]
    ref = FakeModel(sharpness=0.7)

    def joint(prompt: list[int]) -> np.ndarray:
        def p(context: list[int]) -> np.ndarray:
            return warp(ref.logits_after([*prompt, *context]), sampling).dense(16)

        return sum(
            p([])[a] * np.array([p([a])[b] * p([a, b]) for b in range(16)]) for a in range(16)
        )

    clock = FakeClock()
    target, draft = _models(3, clock, sharpness=0.7)
    draft.sharpness = 0.7
    for view in (draft.sequence(1), draft.sequence(2)):
        view.sharpness = 0.7
    costs = CostBook()
    load = BatchLoad(costs)
    engines = _engines(target, draft, 3, load, costs)
    streams = Streams(target, [draft], load=load, clock=clock)
    n = 1500
    counts = [np.zeros((16, 16)) for _ in prompts]
    for seed in range(n):
        configs = [
            GenerationConfig(lookahead=k, sampling=sampling, max_tokens=k + 3, seed=seed * 3 + i)
            for i, k in enumerate(lookahead)
        ]
        for i, done in enumerate(_run_together(engines, configs, prompts, streams)):
            counts[i][done.tokens[1], done.tokens[2]] += 1
    for i, prompt in enumerate(prompts):
        assert pooled_chisquare_pvalue(counts[i], joint(prompt) * n) > 1e-3, f"sequence {i}"
    assert (streams.stats.picked > 0) == (top_k > 0)


def test_a_mutant_that_shares_one_cache_fails_identity() -> None:
    """The identity test can fail: two sequences decoded into one cache (a leak) give other
    tokens than the target alone."""
    clock = FakeClock()
    target = FakeModel(sharpness=1.5, n_seq=2, clock=clock)
    shared = target.sequence(1)
    shared.cache = target.cache  # the mutant: sequence 1 writes into sequence 0's cache
    engines = [SpeculativeEngine(m, NgramDrafter(), lookahead=2) for m in (target, shared)]
    streams = Streams(target)
    config = GenerationConfig(sampling=GREEDY, max_tokens=10)
    with pytest.raises(AssertionError):
        out = _run_together(engines, [config] * 2, [[1, 2], [3, 4]], streams)
        alone = drive(SpeculativeEngine(FakeModel(sharpness=1.5)), config, [1, 2])
        assert out[0].tokens == alone.tokens


def test_a_seed_gives_the_same_sampled_tokens_alone_and_in_a_batch() -> None:
    """Under the Gumbel-max rule (a seed given): six sequences at once, each at its own K, give
    each prompt's tokens as the target alone gives them with the same seed, their verifies'
    rows picked together (one pass over all of a pass's rows) where alone each picks its own."""
    sampling = SamplingParams(temperature=0.9, top_k=8, top_p=0.95, min_p=0.0)
    target, draft, engines, streams = _six()
    ks: list[object] = [1, 4, 8, "auto", 2, 0]
    configs = [
        GenerationConfig(lookahead=k, sampling=sampling, max_tokens=30, seed=40 + i)  # type: ignore[arg-type]
        for i, k in enumerate(ks)
    ]
    together = _run_together(engines, configs, PROMPTS, streams)
    for i, prompt in enumerate(PROMPTS):
        alone = drive(SpeculativeEngine(FakeModel(sharpness=1.5)), configs[i], prompt)
        assert together[i].tokens == alone.tokens, f"sequence {i}"
        assert together[i].finished.stats.coupling == "gumbel"
    assert max(len(b) for b in target.batches) > 1
    assert streams.stats.picked > 100


def test_every_batch_goes_in_its_sequences_order() -> None:
    """A pass lists its sequences by id, whichever parked first (a drafting sequence parks
    later, a sequence with guesses is longer): llama.cpp lays a batch's tokens in the cache in
    its order, and an interleave that changes every pass slows attention on a CPU."""
    target, draft, engines, streams = _six()
    configs = [
        GenerationConfig(lookahead=k, sampling=GREEDY, max_tokens=24)  # type: ignore[arg-type]
        for k in (8, 0, "auto", 1, 0, 4)
    ]
    _run_together(engines, configs, PROMPTS, streams)
    for batches in (target.batches, draft.batches):
        assert any(len(b) > 2 for b in batches)
        for batch in batches:
            seqs = [seq for seq, _, _ in batch]
            assert seqs == sorted(seqs), batch
    # Lengths differed within passes, so a by-length order would have differed from this one.
    assert any(len({n for _, n, _ in b}) > 1 for b in target.batches)


class _Sequence:
    def __init__(self, seq: int) -> None:
        self.seq = seq


class _Scattering:
    """A context whose every pass frees cells (as rollbacks do), and whose ``compact`` takes
    ``cost`` seconds on the clock (None: too large to)."""

    n_batch = 64

    def __init__(self, clock: FakeClock, cost: float | None, cells: int, compacts: bool = True):
        self.clock, self.cost, self.cells, self.compacts = clock, cost, cells, compacts
        self.freed, self.compactions, self.asked = 0, 0, 0

    def gather(self, gather: object) -> None:
        self.gatherer = gather

    def decode_together(
        self, items: list[tuple[object, list[int], int]], pickings: object = None
    ) -> list[np.ndarray]:
        self.clock.advance(1.0)
        self.freed += 2
        return [np.zeros((n, 4), dtype=np.float32) for _, _, n in items]

    def compact(self) -> float | None:
        self.asked += 1
        if self.cost is None:
            return None
        if self.cost < 0:
            raise RuntimeError("the copy failed")
        self.clock.advance(self.cost)
        self.freed = 0
        self.compactions += 1
        return self.cost


def _passes(context: _Scattering, clock: FakeClock, n: int, sequences: int = 3) -> Streams:
    streams = Streams(context, clock=clock)

    def task(seq: int) -> None:
        for _ in range(n):
            context.gatherer(_Sequence(seq), [1], 1)  # type: ignore[operator]

    for seq in range(sequences):
        streams.add(lambda seq=seq: task(seq))
    streams.run()
    return streams


def test_a_scattered_cache_is_compacted_within_its_share_of_the_passes() -> None:
    """Compactions where rollbacks freed cells, no more often than COMPACT_SHARE of the passes'
    time pays for: 1 s each against 1 s passes, one at most every 20 passes."""
    clock = FakeClock()
    context = _Scattering(clock, cost=1.0, cells=20)
    streams = _passes(context, clock, 100)
    assert 4 <= context.compactions <= 6
    assert streams.stats.compactions == context.compactions
    assert streams.stats.compact_seconds == pytest.approx(context.compactions * 1.0)
    cheap = _Scattering(clock, cost=0.01, cells=20)
    _passes(cheap, clock, 100)
    assert cheap.compactions > 30  # a cheap one is done whenever cells were freed enough


def test_a_cache_is_left_as_it_is_where_compacting_would_not_pay() -> None:
    """No compaction while the freed cells are under COMPACT_FREED of those held, on a context
    that does not compact (a GPU's, a recurrent model's), or where it is too large to copy (then
    it is asked again only after TOO_LARGE_WAIT seconds of passes)."""
    clock = FakeClock()
    few = _Scattering(clock, cost=0.01, cells=10_000)
    _passes(few, clock, 100)
    assert few.asked == 0
    off = _Scattering(clock, cost=0.01, cells=20, compacts=False)
    _passes(off, clock, 100)
    assert off.asked == 0
    large = _Scattering(clock, cost=None, cells=20)
    _passes(large, clock, 100)
    assert large.compactions == 0 and 4 <= large.asked <= 6


def test_an_error_in_a_compaction_reaches_the_batch_s_tasks() -> None:
    """A compaction that fails is reported where each task of the pass it came before
    decoded, as a failed decode is, and the scheduler goes on."""
    clock = FakeClock()
    context = _Scattering(clock, cost=-1.0, cells=20)
    streams = Streams(context, clock=clock)
    seen: list[str] = []

    def task(seq: int) -> None:
        try:
            for _ in range(10):
                context.gatherer(_Sequence(seq), [1], 1)  # type: ignore[operator]
        except RuntimeError as err:
            seen.append(f"{seq}: {err}")

    for seq in range(2):
        streams.add(lambda seq=seq: task(seq))
    streams.run()
    assert sorted(seen) == ["0: the copy failed", "1: the copy failed"]


def test_a_verify_reads_picks_only_made_for_its_own_rule_and_place() -> None:
    """``verdict_on`` takes a block's picks (``PickedRows``) only where they were made with its
    own warp, seed and first position; otherwise it picks the rows itself, as alone."""
    params = SamplingParams(0.8, 8, 0.95, 0.05)
    rng = np.random.default_rng(4)
    rows = [
        TopK(rng.choice(1000, 8, replace=False).tolist(), rng.standard_normal(8).tolist(), 1000)
        for _ in range(4)
    ]
    guesses = [gumbel_pick(warp(row, params), 5, 40 + i) for i, row in enumerate(rows[:3])]
    alone = verdict_on(Proposal(guesses, []), rows, params, Keyed(5, 40))
    assert alone.n_accepted == 3  # the guesses are the picks: all kept
    wrong = [(t + 1) % 1000 for t in guesses] + [0]  # picks no guess equals
    for picking in (
        Picking(params, 5, 41),
        Picking(params, 6, 40),
        Picking(SamplingParams(0.7, 8, 0.95, 0.05), 5, 40),
    ):
        verdict = verdict_on(
            Proposal(guesses, []), PickedRows(rows, picking, wrong), params, Keyed(5, 40)
        )
        assert verdict == alone
    taken = verdict_on(
        Proposal(guesses, []), PickedRows(rows, Picking(params, 5, 40), wrong), params, Keyed(5, 40)
    )
    assert taken.n_accepted == 0 and taken.next_token == wrong[0]
