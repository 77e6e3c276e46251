"""The speculative loop on fake models: exactness, rollback, stops, reproducibility."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from specgen.core.coupling import Picking
from specgen.core.penalties import Penalties
from specgen.core.sampling import SamplingParams, warp
from specgen.drafters import ModelDrafter
from specgen.engine import (
    CycleDone,
    GenerationConfig,
    SpeculativeEngine,
    TextChunk,
)
from specgen.errors import PromptTooLong
from tests.fakes import FakeClock, FakeModel, drive
from tests.stats_helpers import pooled_chisquare_pvalue

GREEDY = SamplingParams(temperature=0)
PROMPT = [1, 2, 3]


def pair(noise: float = 0.8, **kw) -> tuple[FakeModel, FakeModel]:
    """A target and a draft that agrees with it most of the time, on one fake clock: a target
    pass costs 10 ms plus 1 ms a token, a draft step 2 ms (so ``-k auto`` finds drafting pays)."""
    clock = FakeClock()
    return (
        FakeModel(call_seconds=0.010, token_seconds=0.001, clock=clock, **kw),
        FakeModel(noise=noise, salt=7, call_seconds=0.002, clock=clock, **kw),
    )


def spec(target: FakeModel, draft: FakeModel, p_min: float = 0.0) -> SpeculativeEngine:
    """The engine with a draft model as its drafter, timed by the models' clock."""
    return SpeculativeEngine(target, ModelDrafter(draft, p_min, target.clock), clock=target.clock)


@pytest.mark.parametrize("lookahead", [1, 2, 3, 4, 6, 8])
def test_greedy_speculative_equals_target_alone(lookahead: int) -> None:
    target, draft = pair()
    alone, _, _ = drive(
        SpeculativeEngine(FakeModel()),
        GenerationConfig(lookahead=0, sampling=GREEDY, max_tokens=60),
        PROMPT,
    )
    tokens, _, done = drive(
        spec(target, draft),
        GenerationConfig(lookahead=lookahead, sampling=GREEDY, max_tokens=60),
        PROMPT,
    )
    assert tokens[:60] == alone[:60]
    assert done.stats.n_generated == 60
    assert 0 < done.stats.n_accepted < done.stats.n_drafted  # the fakes disagree sometimes


def test_target_verifies_all_guesses_in_one_decode() -> None:
    target, draft = pair()
    drive(
        spec(target, draft), GenerationConfig(lookahead=4, sampling=GREEDY, max_tokens=40), PROMPT
    )
    # After the prompt, every target decode is [last, x1..xK] with logits on every row.
    cycles = target.decode_calls[1:]
    assert all(n == n_logits for n, n_logits in cycles)
    assert max(n for n, _ in cycles) == 5


def test_caches_are_rolled_back_to_the_accepted_prefix() -> None:
    target, draft = pair()
    engine = spec(target, draft)
    tokens = list(PROMPT)
    config = GenerationConfig(
        lookahead=5, sampling=SamplingParams(temperature=1.0), max_tokens=80, seed=3
    )
    for event in engine.generate(PROMPT, config):
        if isinstance(event, CycleDone):
            tokens.extend(event.tokens)
            # Invariant: the target holds all tokens but the newest; the draft a prefix of that.
            assert target.cache == tokens[:-1]
            assert draft.cache == tokens[: draft.n_past]


def test_sampling_reproducible_with_seed() -> None:
    config = GenerationConfig(
        lookahead=4, sampling=SamplingParams(temperature=1.0), max_tokens=50, seed=42
    )
    first, _, _ = drive(spec(*pair()), config, PROMPT)
    again, _, _ = drive(spec(*pair()), config, PROMPT)
    other, _, _ = drive(
        spec(*pair()),
        GenerationConfig(
            lookahead=4, sampling=SamplingParams(temperature=1.0), max_tokens=50, seed=43
        ),
        PROMPT,
    )
    assert first == again
    assert first != other


@pytest.mark.parametrize("coupling", ["residual", "gumbel"])
@pytest.mark.parametrize(
    "lookahead, p_min, top_k", [(0, 0.0, 0), (3, 0.0, 0), (3, 0.2, 0), (0, 0.0, 6), (3, 0.0, 6)]
)
def test_tokens_two_and_three_follow_target_distribution(
    lookahead: int, p_min: float, top_k: int, coupling: str
) -> None:
    """Chi-square on (x2, x3), the first cycle's guess positions (x1 comes from the prompt's own
    pass), against the target's sum over x1 of p(x1) p(x2 | x1) p(x3 | x1 x2). With a top-k,
    rows come as their top-k from the (fake) backend; the reference warps whole rows."""
    sampling = SamplingParams(temperature=1.0, top_k=top_k, top_p=1.0, min_p=0.0)
    ref = FakeModel(sharpness=0.7)

    def p(context: list[int]) -> np.ndarray:
        return warp(ref.logits_after([*PROMPT, *context]), sampling).dense(16)

    joint = sum(p([])[a] * np.array([p([a])[b] * p([a, b]) for b in range(16)]) for a in range(16))
    target, draft = FakeModel(sharpness=0.7), FakeModel(sharpness=0.7, noise=1.0, salt=9)
    config = GenerationConfig(
        lookahead=lookahead, sampling=sampling, max_tokens=lookahead + 3, coupling=coupling
    )
    counts = second_and_third(spec(target, draft, p_min), config)
    assert pooled_chisquare_pvalue(counts, joint * N_SEEDS) > 1e-3


N_SEEDS = 3000


def second_and_third(engine: SpeculativeEngine, config: GenerationConfig) -> np.ndarray:
    """How often each (x2, x3) came, over seeds 0 .. N_SEEDS - 1."""
    counts = np.zeros((16, 16))
    for seed in range(N_SEEDS):
        tokens, _, _ = drive(engine, replace(config, seed=seed), PROMPT)
        counts[tokens[1], tokens[2]] += 1
    return counts


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(0.8, 6, 0.95, 0.05)])
def test_rows_from_the_backend_or_whole_give_the_same_tokens(sampling: SamplingParams) -> None:
    """The same seed gives the same tokens whether rows come as their top-k from the backend
    or whole: the same p and q, so the same draws."""
    config = GenerationConfig(lookahead=4, sampling=sampling, max_tokens=60, seed=5)
    target, draft = pair()
    on_backend, _, done = drive(spec(target, draft), config, PROMPT)
    assert done.stats.row_top_k == (1 if sampling.greedy else 6)
    assert draft.top_k == done.stats.row_top_k
    target, draft = pair(backend_sampling=False)
    whole, _, done = drive(spec(target, draft), config, PROMPT)
    assert done.stats.row_top_k == 0 and draft.top_k == 0
    assert on_backend == whole


def test_whole_rows_where_something_reads_the_whole_vocabulary() -> None:
    """Log-probabilities, a logit bias, and a draft's p_min under greedy read whole rows."""
    from specgen.structured.grammar import LogitBias

    target, draft = pair()
    _, _, done = drive(
        spec(target, draft), GenerationConfig(lookahead=3, logprobs=2, seed=1), PROMPT
    )
    assert done.stats.row_top_k == 0 and target.top_k == 0
    bias = LogitBias.from_mapping({"3": -2.0})
    _, _, done = drive(
        spec(target, draft), GenerationConfig(lookahead=3, logit_bias=bias, seed=1), PROMPT
    )
    assert done.stats.row_top_k == 0 and draft.top_k == 0
    _, _, done = drive(spec(target, draft, p_min=0.3), GenerationConfig(sampling=GREEDY), PROMPT)
    assert done.stats.row_top_k == 1 and target.top_k == 1 and draft.top_k == 0
    target, draft = pair(rows_on_device=False)  # rows the CPU computed: read in place
    _, _, done = drive(spec(target, draft), GenerationConfig(sampling=GREEDY), PROMPT)
    assert done.stats.row_top_k == 0 and draft.top_k == 0
    _, _, done = drive(spec(target, draft), GenerationConfig(lookahead=3, seed=1), PROMPT)
    assert done.stats.row_top_k == 0 and draft.top_k == 0  # sampled: the host's top-k too


def test_the_first_token_is_out_before_the_drafter_reads_the_prompt() -> None:
    """Time to first token is the target's prompt pass alone: the draft model catches up on the
    prompt after the first token is yielded, and the output is the target's all the same."""
    prompt = PROMPT * 10
    alone, _, _ = drive(SpeculativeEngine(FakeModel()), GenerationConfig(0, GREEDY, 30), prompt)
    target, draft = pair()
    events = spec(target, draft).generate(prompt, GenerationConfig(4, GREEDY, 30))
    first = next(events)
    assert isinstance(first, CycleDone) and first.drafted == 0 and first.tokens == (alone[0],)
    assert target.decode_calls == [(len(prompt), 1)] and draft.decode_calls == []
    rest = [t for e in events if isinstance(e, CycleDone) for t in e.tokens]
    assert [alone[0], *rest][:30] == alone
    assert draft.decode_calls[0] == (len(prompt), 0)  # the whole prompt, in one batch


def test_stop_string_spanning_tokens_is_not_printed() -> None:
    target, draft = pair()
    _, full, _ = drive(
        SpeculativeEngine(FakeModel(), None),
        GenerationConfig(lookahead=0, sampling=GREEDY, max_tokens=40),
        PROMPT,
    )
    stop = full[10:13]
    _, text, done = drive(
        spec(target, draft),
        GenerationConfig(lookahead=4, sampling=GREEDY, max_tokens=40, stop=(stop,)),
        PROMPT,
    )
    assert done.reason == "stop"
    assert text == full[: full.index(stop)]


def test_max_tokens_is_exact() -> None:
    _, _, done = drive(
        spec(*pair()), GenerationConfig(lookahead=8, sampling=GREEDY, max_tokens=13), PROMPT
    )
    assert done.reason == "max_tokens" and done.stats.n_generated == 13


def test_end_of_generation_token_stops_and_is_not_printed() -> None:
    alone, _, _ = drive(
        SpeculativeEngine(FakeModel()),
        GenerationConfig(lookahead=0, sampling=GREEDY, max_tokens=40),
        PROMPT,
    )
    eog = alone[5]
    first = alone.index(eog)
    target, draft = pair(eog=eog)
    tokens, text, done = drive(
        spec(target, draft), GenerationConfig(lookahead=4, sampling=GREEDY, max_tokens=40), PROMPT
    )
    assert done.reason == "eog"
    assert done.stats.n_generated == first
    assert tokens[first] == eog


def test_full_context_stops_cleanly() -> None:
    target, draft = pair(n_ctx=30)
    tokens, _, done = drive(
        spec(target, draft), GenerationConfig(lookahead=4, sampling=GREEDY, max_tokens=500), PROMPT
    )
    assert done.reason == "context_full"
    assert len(PROMPT) + done.stats.n_generated >= 30


def test_prompt_longer_than_context_is_refused() -> None:
    with pytest.raises(PromptTooLong):
        drive(spec(*pair(n_ctx=8)), GenerationConfig(), prompt=list(range(10)))


def test_split_utf8_character_is_never_printed_broken() -> None:
    class Scripted(FakeModel):
        """Greedy output: 'a', then the two bytes of 'é' as separate tokens, then 'b'."""

        script = [0, 14, 15, 1]

        def logits_after(self, prefix: list[int]) -> np.ndarray:
            i = len(prefix) - len(PROMPT)
            out = np.zeros(self.n_vocab, dtype=np.float32)
            out[self.script[min(i, 3)]] = 10
            return out

    chunks = [
        e.text
        for e in SpeculativeEngine(Scripted()).generate(
            PROMPT, GenerationConfig(lookahead=0, sampling=GREEDY, max_tokens=4)
        )
        if isinstance(e, TextChunk)
    ]
    assert "".join(chunks) == "aéb"
    assert all("\ufffd" not in c for c in chunks)


def test_stats_count_per_position_acceptance() -> None:
    _, _, done = drive(
        spec(*pair()), GenerationConfig(lookahead=4, sampling=GREEDY, max_tokens=100), PROMPT
    )
    s = done.stats
    assert sum(s.accepted_at) == s.n_accepted
    assert sum(s.reached_at) == s.n_accepted + s.n_rejected <= s.n_drafted
    # every cycle judges its first guess, except a last one with room for no guess
    assert s.n_cycles - 1 <= s.reached_at[0] <= s.n_cycles
    rates = s.position_accept_rates()
    assert len(rates) == 4 and all(0 <= r <= 1 for r in rates)
    assert s.alpha == pytest.approx(s.n_accepted / (s.n_accepted + s.n_rejected))
    assert s.n_generated == 100 and s.tokens_per_cycle == pytest.approx(100 / s.n_cycles, rel=0.1)


@pytest.mark.parametrize("lookahead", [2, 4, 8])
def test_draft_p_min_keeps_greedy_exact_and_drafts_less(lookahead: int) -> None:
    alone, _, _ = drive(
        SpeculativeEngine(FakeModel()),
        GenerationConfig(lookahead=0, sampling=GREEDY, max_tokens=60),
        PROMPT,
    )
    _, _, full = drive(
        spec(*pair()), GenerationConfig(lookahead=lookahead, sampling=GREEDY, max_tokens=60), PROMPT
    )
    tokens, _, cautious = drive(
        spec(*pair(), p_min=0.6),
        GenerationConfig(lookahead=lookahead, sampling=GREEDY, max_tokens=60),
        PROMPT,
    )
    assert tokens == alone[: len(tokens)] and len(tokens) >= 60
    assert cautious.stats.n_drafted < full.stats.n_drafted
    assert cautious.stats.alpha > full.stats.alpha  # the guesses it skipped were the risky ones


@pytest.mark.parametrize("lookahead", [0, 3, "auto"])
def test_a_chat_that_goes_on_reuses_the_cached_prefix(lookahead) -> None:
    """With reuse_prefix, a prompt that extends the last context decodes only what is new,
    in both caches, and generates exactly what a fresh run would."""
    target, draft = pair()
    engine = spec(target, draft)
    # auto's K depends on the costs its engine has measured, which a fresh engine has not: only
    # greedy output is the same on both
    sampling = GREEDY if lookahead == "auto" else SamplingParams(temperature=0.9)
    config = GenerationConfig(lookahead=lookahead, sampling=sampling, max_tokens=20, seed=5)
    first, _, done = drive(engine, config, PROMPT)
    turn_two = PROMPT + first + [4, 5, 6]  # the answer, then the user's next turn
    target.decode_calls.clear()
    draft.decode_calls.clear()
    events = list(engine.generate(turn_two, config, reuse_prefix=True))
    again = [t for e in events if isinstance(e, CycleDone) for t in e.tokens]
    stats = events[-1].stats
    kept = len(PROMPT) + len(first) - 1  # all but the last token of turn one's context
    assert stats.n_prompt_cached == kept
    assert target.decode_calls[0][0] == len(turn_two) - kept  # only the new tokens
    if lookahead == 0:  # no drafting: the draft never read a prompt
        assert draft.decode_calls == []
    else:  # the draft read turn two: its cache from turn one is reused too
        assert draft.decode_calls[0][0] < len(turn_two) - 1 - len(PROMPT)
    fresh_target, fresh_draft = pair()
    fresh, _, _ = drive(spec(fresh_target, fresh_draft), config, turn_two)
    assert again == fresh  # same caches in effect: the same sample


def test_a_draft_model_reads_the_prompt_only_once_asked_for_guesses() -> None:
    """A generation that never drafts (speculation off) never pays the draft's prompt pass: on
    a pair that cannot pay, that pass would make `-k auto` slower than the target alone. Read
    later, it counts as prompt time, and a chat that goes on still reuses the draft's cache."""
    target, draft = pair()
    target.call_seconds = target.token_seconds = 0.0  # prompt time is then the draft's alone
    draft.token_seconds = 0.002
    engine = spec(target, draft)
    prompt = PROMPT + list(range(4, 14)) * 10  # 103 tokens
    config = GenerationConfig(lookahead=0, sampling=GREEDY, max_tokens=12)
    off, _, _ = drive(engine, config, prompt)
    assert draft.decode_calls == []
    drafting = GenerationConfig(lookahead=3, sampling=GREEDY, max_tokens=12)
    turn_one = prompt + off + [5]
    events = list(engine.generate(turn_one, drafting, reuse_prefix=True))
    assert draft.decode_calls[0] == (len(turn_one), 0)  # the prompt, once, in the first cycle
    read = draft.call_seconds + draft.token_seconds * len(turn_one)  # the draft's one pass
    assert events[-1].stats.prompt_seconds == pytest.approx(read)
    first = [t for e in events if isinstance(e, CycleDone) for t in e.tokens]
    # A turn that does not draft leaves the draft's cache alone; the next one that does reuses it.
    turn_two = turn_one + first + [6]
    run_off = list(engine.generate(turn_two, config, reuse_prefix=True))
    turn_three = turn_two + [t for e in run_off if isinstance(e, CycleDone) for t in e.tokens]
    draft.decode_calls.clear()
    events = list(engine.generate(turn_three, drafting, reuse_prefix=True))
    assert 0 < draft.decode_calls[0][0] <= len(turn_three) - len(turn_one)  # what it lacks
    again = [t for e in events if isinstance(e, CycleDone) for t in e.tokens]
    fresh, _, _ = drive(
        SpeculativeEngine(FakeModel(), ModelDrafter(FakeModel(noise=0.8, salt=7))),
        drafting,
        turn_three,
    )
    assert again == fresh


def test_a_generation_broken_mid_cycle_is_not_reused() -> None:
    target, draft = pair()
    engine = spec(target, draft)
    config = GenerationConfig(lookahead=4, sampling=GREEDY, max_tokens=40)
    decode, calls = target.decode, []

    def failing(tokens: list[int], n_logits: int = 1, picking: Picking | None = None):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt  # Ctrl-C inside a verify pass
        return decode(tokens, n_logits, picking)

    target.decode = failing
    with pytest.raises(KeyboardInterrupt):
        list(engine.generate(PROMPT, config))
    target.decode = decode
    stats = list(engine.generate(PROMPT + [7], config, reuse_prefix=True))[-1].stats
    assert stats.n_prompt_cached == 0  # the cache held unverified guesses: start afresh
    stats = list(engine.generate(PROMPT + [7, 8], config, reuse_prefix=True))[-1].stats
    assert stats.n_prompt_cached == len(PROMPT) + 1  # a clean end is reused


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_a_seed_gives_the_same_sampled_text_at_any_k(drafter: str) -> None:
    """With a seed the tokens are the target alone's Gumbel-max sample: the same at K 1, 4, 8,
    16 (its 17 rows picked in one block) and auto, from a draft model or prompt lookup; the
    min(1, p/q) rule's are not."""
    from specgen.drafters import NgramDrafter

    sampling = SamplingParams(temperature=0.9, top_k=8, top_p=0.95, min_p=0.0)
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]  # prompt lookup finds matches

    def engine() -> SpeculativeEngine:
        target, draft = pair()
        if drafter == "ngram":
            return SpeculativeEngine(target, NgramDrafter(), clock=target.clock)
        return spec(target, draft)

    for seed in range(5):
        alone = drive(
            SpeculativeEngine(FakeModel()), GenerationConfig(0, sampling, 60, seed=seed), prompt
        )
        assert alone.finished.stats.coupling == "gumbel"
        for k in (1, 4, 8, 16, "auto"):
            done = drive(engine(), GenerationConfig(k, sampling, 60, seed=seed), prompt)
            assert done.tokens == alone.tokens, (seed, k)
    # the min(1, p/q) rule spends its draws by how many guesses a cycle made
    residual = [
        drive(
            engine(), GenerationConfig(k, sampling, 60, seed=0, coupling="residual"), prompt
        ).tokens
        for k in (1, 4, 8)
    ]
    assert len({tuple(t) for t in residual}) > 1
    # without a seed, the rule that keeps the most guesses
    assert (
        drive(engine(), GenerationConfig(4, sampling, 20), prompt).finished.stats.coupling
        == "residual"
    )
    assert (
        drive(engine(), GenerationConfig(4, GREEDY, 20, seed=1), prompt).finished.stats.coupling
        is None
    )


# Strong penalties over a short window: each row's history (the prompt's end and the guesses
# before it) changes it.
PENALTIES = Penalties(repeat=1.8, frequency=0.6, presence=0.8, last_n=3)


@pytest.mark.parametrize("coupling", ["residual", "gumbel"])
@pytest.mark.parametrize("lookahead", [0, 3])
def test_penalized_tokens_follow_the_penalized_target(lookahead: int, coupling: str) -> None:
    """Chi-square on (x2, x3) against the target's rows each penalized by its own history."""
    sampling = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    ref = FakeModel(sharpness=0.7, repeat=5)

    def p(context: list[int]) -> np.ndarray:
        history = [*PROMPT, *context]
        return warp(PENALTIES.apply(ref.logits_after(history), history), sampling).dense(16)

    joint = sum(p([])[a] * np.array([p([a])[b] * p([a, b]) for b in range(16)]) for a in range(16))
    target = FakeModel(sharpness=0.7, repeat=5)
    draft = FakeModel(sharpness=0.7, repeat=5, noise=0.5, salt=9)
    config = GenerationConfig(
        lookahead=lookahead,
        sampling=sampling,
        max_tokens=lookahead + 3,
        coupling=coupling,
        penalties=PENALTIES,
    )
    counts = second_and_third(spec(target, draft), config)
    assert pooled_chisquare_pvalue(counts, joint * N_SEEDS) > 1e-3


# A prompt whose last token's successor (``repeat``) is in the window: its first row changes.
LOOPED = [0, 2, 3]


@pytest.mark.parametrize("lookahead", [2, 5])
def test_greedy_with_penalties_is_the_penalized_target_alone(lookahead: int) -> None:
    """A model that loops (``repeat``) loops less under penalties, and the speculative text is
    the target alone's, token for token, with the draft's rows penalized too."""
    config = GenerationConfig(lookahead=0, sampling=GREEDY, max_tokens=60)
    plain, _, _ = drive(SpeculativeEngine(FakeModel(repeat=4)), config, LOOPED)
    penalized = replace(config, penalties=PENALTIES)
    alone, _, _ = drive(SpeculativeEngine(FakeModel(repeat=4)), penalized, LOOPED)
    assert alone != plain
    ref, history = FakeModel(repeat=4), list(LOOPED)
    for _ in range(10):  # the first token's row too (the prompt's own pass)
        history.append(int(np.argmax(PENALTIES.apply(ref.logits_after(history), history))))
    assert alone[:10] == history[len(LOOPED) :]
    target, draft = pair(repeat=4)
    tokens, _, done = drive(spec(target, draft), replace(penalized, lookahead=lookahead), LOOPED)
    assert tokens == alone
    assert done.stats.row_top_k == 0 and draft.top_k == 0  # penalties read whole rows
    assert done.stats.n_accepted > 0
