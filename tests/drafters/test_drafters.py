"""Drafters on fakes: the seam the engine drives, prompt lookup, the hybrid, catching up."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from specgen.core.sampling import SamplingParams, warp
from specgen.drafters import (
    CATCH_UP_WINDOW,
    NGRAM_SPAN,
    Candidate,
    HybridDrafter,
    ModelDrafter,
    NgramDrafter,
    Proposal,
)
from specgen.engine import CycleDone, GenerationConfig, SpeculativeEngine
from tests.fakes import FakeModel, run_to_end
from tests.stats_helpers import pooled_chisquare_pvalue

GREEDY = SamplingParams(temperature=0)
SAMPLING = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
MODEL = Candidate("model", "model", 10_000)


# -- the seam ----------------------------------------------------------------------------------


class ScriptedDrafter:
    """Proposes a fixed script of guesses and records every call the engine makes."""

    def __init__(self, script: list[int]) -> None:
        self.script, self.calls = script, []

    def constrain(self, constraint, bias=None, penalties=None) -> None:
        self.calls.append(("constrain", constraint))

    def begin(self, prompt: Sequence[int], reuse_prefix: bool = False) -> None:
        self.calls.append(("begin", len(prompt)))

    def candidates(self, context: Sequence[int]) -> list[Candidate]:
        return [Candidate("script", "script", len(self.script))]

    def propose(self, context, candidate, k, sampling, rng) -> Proposal:
        self.calls.append(("propose", len(context), k))
        return Proposal(self.script[:k], [])

    def rollback_to(self, n_accepted: int) -> None:
        self.calls.append(("rollback_to", n_accepted))

    def end(self, tokens: Sequence[int]) -> None:
        self.calls.append(("end", len(tokens)))


def test_engine_drives_any_drafter_through_the_protocol() -> None:
    target = FakeModel()
    alone, _ = run_to_end(
        SpeculativeEngine(FakeModel()), GenerationConfig(0, GREEDY, 20), [1, 2, 3]
    )
    drafter = ScriptedDrafter(alone[1:4])  # right for the first cycle, then wrong
    tokens, stats = run_to_end(
        SpeculativeEngine(target, drafter), GenerationConfig(3, GREEDY, 20), [1, 2, 3]
    )
    assert tokens == alone
    # No grammar; the prompt's pass gives the first token; the drafter begins after it, with it.
    assert drafter.calls[:2] == [("constrain", None), ("begin", 4)]
    assert drafter.calls[2:4] == [("propose", 4, 3), ("rollback_to", 3)]
    assert stats.by_source["script"].accepted >= 3
    proposals = [c for c in drafter.calls if c[0] == "propose"]
    settles = [c for c in drafter.calls if c[0] == "rollback_to"]
    assert len(proposals) == len(settles) == stats.by_source["script"].cycles
    assert stats.n_cycles == len(proposals) + stats.k_counts.get(0, 0)


# -- n-gram lookup -----------------------------------------------------------------------------


def test_ngram_lookup_prefers_the_longest_then_the_latest_match() -> None:
    drafter = NgramDrafter()
    context = [5, 6, 7, 8, 1, 6, 7, 9, 2, 5, 6, 7]
    # "5 6 7" occurred at the start (followed by 8); "6 7" later too (followed by 9): the longer
    # match wins.
    (candidate,) = drafter.candidates(context)
    assert candidate.acceptance_key == "ngram3"
    assert drafter.propose(context, candidate, 4, GREEDY, np.random.default_rng()).tokens == [
        8,
        1,
        6,
        7,
    ]
    # Only "7" matches now: its latest earlier occurrence was followed by 9.
    drafter.begin([])
    assert drafter.lookup([3, 7, 9, 4, 7, 1, 7]) == (1, 4)
    assert NgramDrafter().candidates([1, 2, 3, 4]) == []


def test_ngram_index_grows_with_the_context() -> None:
    drafter = NgramDrafter()
    context = [1, 2, 3, 4]
    assert drafter.candidates(context) == []
    context += [9, 1, 2]
    (candidate,) = drafter.candidates(context)
    # "1 2" occurred 5 tokens back: what followed it, then round again, as a text that
    # repeats itself every 5 tokens would go on.
    assert candidate.acceptance_key == "ngram2" and candidate.limit == NGRAM_SPAN
    assert drafter.propose(context, candidate, 8, GREEDY, np.random.default_rng()).tokens == [
        3,
        4,
        9,
        1,
        2,
        3,
        4,
        9,
    ]
    # Guesses not yet verified extend the suffix looked up, never the index.
    (candidate,) = drafter.candidates(context, [3, 4])
    assert candidate.acceptance_key == "ngram4" and candidate.preview[:3] == (9, 1, 2)
    assert drafter.lookup([*context, 3]) == (3, 2)


def test_a_hybrid_model_run_ends_where_its_guesses_lead_into_a_long_match() -> None:
    """Once the model's guesses make the text end in a long match, the match's continuation
    (free) fills the cycle instead of more model steps."""
    prompt = [7, 8, 1, 2, 3, 4, 5, 6, 9, 10, 11, 12, 13]

    class Counts(FakeModel):  # a draft that guesses t + 1 after t
        def logits_after(self, prefix: list[int]) -> np.ndarray:
            out = np.zeros(16, dtype=np.float32)
            out[(prefix[-1] + 1) % 16] = 5.0
            return out

    draft = Counts()
    hybrid = HybridDrafter(ModelDrafter(draft))
    context = [*prompt, 1]
    hybrid.begin(context)
    # Only "1" matches (weak): the model is offered first.
    assert [c.acceptance_key for c in hybrid.candidates(context)] == ["model", "ngram1"]
    proposal = hybrid.propose(context, MODEL, 6, GREEDY, np.random.default_rng(0))
    # The model guesses 2 ("1 2": a weak match), then 3: "1 2 3" was seen, followed by 4 5 6 9.
    assert proposal.tokens == [2, 3, 4, 5, 6, 9]
    tail = proposal.ngram_tail
    assert tail is not None and tail.candidate.acceptance_key == "ngram3"
    assert tail.n == 4  # two guesses from the model, four looked up
    assert draft.decode_calls[1:] == [(1, 1), (1, 1)]  # two model steps, no more


def repeating_target() -> FakeModel:
    """A fake target whose greedy text keeps repeating a phrase of the prompt."""

    class Repeating(FakeModel):
        def logits_after(self, prefix: list[int]) -> np.ndarray:
            out = super().logits_after(prefix)
            out[(prefix[-1] + 1) % 6] += 6.0  # mostly counts 0..5 round and round
            return out

    return Repeating(sharpness=1.0, call_seconds=0.002, token_seconds=0.0002)


def on_its_clock(target: FakeModel, drafter=None) -> SpeculativeEngine:
    return SpeculativeEngine(target, drafter, clock=target.clock)


def test_greedy_ngram_is_the_target_alone_and_needs_few_cycles() -> None:
    prompt = [0, 1, 2, 3, 4, 5, 0, 1]
    alone, base = run_to_end(
        on_its_clock(repeating_target()), GenerationConfig(0, GREEDY, 60), prompt
    )
    for lookahead in (4, "auto"):
        tokens, stats = run_to_end(
            on_its_clock(repeating_target(), NgramDrafter()),
            GenerationConfig(lookahead, GREEDY, 60),
            prompt,
        )
        assert tokens == alone
        assert stats.by_source["ngram"].accepted > 20
        assert stats.n_cycles < base.n_cycles / 2


@pytest.mark.parametrize(("make", "lookahead"), [("ngram", 3), ("hybrid", 3), ("hybrid", "auto")])
def test_ngram_and_hybrid_guesses_keep_the_target_distribution(make: str, lookahead) -> None:
    """Chi-square on (x2, x3) against the target's sum over x1 of p(x1) p(x2 | x1) p(x3 | x1 x2).
    x1 comes from the prompt's own pass, the guesses from the first cycle on; the prompt holds
    "1 2 x" for every x, so whatever x1 is, the text ends in a 3-gram seen before and n-gram
    guesses (point masses) are made at both positions."""
    prompt = [t for x in range(16) for t in (1, 2, x)] + [1, 2]
    ref = FakeModel(sharpness=0.7)

    def p(context: list[int]) -> np.ndarray:
        return warp(ref.logits_after([*prompt, *context]), SAMPLING).dense(16)

    joint = sum(p([])[a] * np.array([p([a])[b] * p([a, b]) for b in range(16)]) for a in range(16))
    # Timed as a CPU would: a target pass 10 ms plus 1 ms a token, a draft step 2 ms.
    target = FakeModel(sharpness=0.7, call_seconds=0.010, token_seconds=0.001)
    draft = FakeModel(sharpness=0.7, noise=1.0, salt=9, call_seconds=0.002, clock=target.clock)
    drafter = (
        NgramDrafter()
        if make == "ngram"
        else HybridDrafter(ModelDrafter(draft, clock=target.clock))
    )
    engine = on_its_clock(target, drafter)
    counts = np.zeros((16, 16))
    n, drafted = 3000, {"ngram": 0, "model": 0}
    for seed in range(n):
        tokens, stats = run_to_end(
            engine, GenerationConfig(lookahead, SAMPLING, 4, seed=seed), prompt
        )
        counts[tokens[1], tokens[2]] += 1
        for source, mine in stats.by_source.items():
            drafted[source] += mine.drafted
    if lookahead == 3:  # the 3-gram comes first: n-gram guesses in every run
        assert drafted["ngram"] >= 2 * n
    else:  # auto weighs the two: both are used
        assert drafted["ngram"] > 0 and drafted["model"] > 0
    assert pooled_chisquare_pvalue(counts, joint * n) > 1e-3


def test_a_model_run_that_ends_in_a_match_keeps_the_target_distribution() -> None:
    """A hybrid's model guess that leads into a long n-gram match hands the rest of the cycle
    to the match (point masses): chi-square on (x2, x3), x2 the model's guess, x3 the match's.

    The prompt holds "9 x y" for every x, y below 15 and ends in "15 9", seen nowhere else: at
    the first cycle only weak matches exist, so the model guesses first; after its guess g the
    text ends in "9 x1 g", a 3-gram seen before, and the match continues it."""
    prompt = [t for x in range(15) for y in range(15) for t in (9, x, y)] + [15, 9]
    ref = FakeModel(sharpness=0.7, n_ctx=1024)

    def p(context: list[int]) -> np.ndarray:
        return warp(ref.logits_after([*prompt, *context]), SAMPLING).dense(16)

    joint = sum(p([])[a] * np.array([p([a])[b] * p([a, b]) for b in range(16)]) for a in range(16))
    draft = FakeModel(sharpness=0.7, noise=1.0, salt=9, n_ctx=1024)
    engine = SpeculativeEngine(
        FakeModel(sharpness=0.7, n_ctx=1024), HybridDrafter(ModelDrafter(draft))
    )
    counts, n, switched = np.zeros((16, 16)), 3000, 0
    for seed in range(n):
        config = GenerationConfig(3, SAMPLING, 4, seed=seed)
        events = list(engine.generate(prompt, config, reuse_prefix=True))
        tokens = [t for e in events if isinstance(e, CycleDone) for t in e.tokens]
        counts[tokens[1], tokens[2]] += 1
        by_source = events[-1].stats.by_source
        # Guesses from n-grams with no n-gram cycle: the model's run switched to a match.
        switched += (
            "ngram" in by_source
            and by_source["ngram"].cycles == 0
            and by_source["ngram"].drafted > 0
        )
    assert switched > n / 2
    assert pooled_chisquare_pvalue(counts, joint * n) > 1e-3


def test_a_biased_ngram_rule_is_caught() -> None:
    """The chi-square above can fail: keep every n-gram guess (no accept coin) and it does."""
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    ref = FakeModel(sharpness=0.7)
    p1 = warp(ref.logits_after(prompt), SAMPLING).dense(16)
    guess = NgramDrafter()
    (candidate,) = guess.candidates(prompt)
    first = guess.propose(prompt, candidate, 1, SAMPLING, np.random.default_rng()).tokens[0]
    counts = np.zeros(16)
    counts[first] = 3000  # what "always keep the guess" would emit
    assert pooled_chisquare_pvalue(counts, p1 * 3000) < 1e-6


def test_hybrid_takes_ngram_guesses_where_the_text_repeats_and_the_model_elsewhere() -> None:
    prompt = [0, 1, 2, 3, 4, 5, 0, 1]
    alone, _ = run_to_end(on_its_clock(repeating_target()), GenerationConfig(0, GREEDY, 80), prompt)
    draft = FakeModel(noise=0.8, salt=7)
    hybrid = HybridDrafter(ModelDrafter(draft))
    tokens, stats = run_to_end(
        on_its_clock(repeating_target(), hybrid), GenerationConfig(6, GREEDY, 80), prompt
    )
    assert tokens == alone
    assert stats.by_source["ngram"].drafted > 0
    # The draft model's cache is a prefix of the text after every switch of source.
    assert draft.cache == (prompt + alone)[: draft.n_past]


def test_the_draft_reads_text_it_missed_apart_from_its_guesses() -> None:
    """After the target ran alone, the draft model catches up in one batch, timed apart: that
    time is not a cost of the guesses that follow."""
    draft = FakeModel(call_seconds=0.0, token_seconds=0.002)
    drafter = ModelDrafter(draft, clock=draft.clock)
    prompt = [1, 2, 3]
    drafter.begin([*prompt, 4])
    context = [*prompt, *range(4, 30)]  # 25 tokens the draft has not seen
    proposal = drafter.propose(context, MODEL, 3, GREEDY, np.random.default_rng(0))
    assert draft.decode_calls[1] == (25, 0)
    assert proposal.catch_up_seconds == pytest.approx(0.002 * 25)  # that batch, and no more
    assert proposal.prompt_seconds == pytest.approx(0.002 * 3)
    assert draft.cache[: len(context)] == context and len(proposal.tokens) == 3
    drafter.rollback_to(1)
    usual = drafter.propose(
        context + [proposal.tokens[0], 9], MODEL, 2, GREEDY, np.random.default_rng(0)
    )
    assert usual.catch_up_seconds == 0.0  # one kept guess and a drawn token: the usual feed


def test_the_draft_reads_only_the_latest_of_a_long_stretch_it_missed() -> None:
    """Of a stretch longer than CATCH_UP_WINDOW the draft reads the latest part (its cache then
    skips the rest), and from there it follows the context as usual, rollbacks included."""
    draft = FakeModel(call_seconds=0.0, token_seconds=0.002)
    drafter = ModelDrafter(draft, clock=draft.clock)
    drafter.begin([1, 2, 3, 4])
    missed = list(range(4, 4 + CATCH_UP_WINDOW + 20))
    context = [1, 2, 3, *missed]
    proposal = drafter.propose(context, MODEL, 3, GREEDY, np.random.default_rng(0))
    assert draft.decode_calls[1] == (CATCH_UP_WINDOW, 0)
    assert proposal.catch_up_seconds == pytest.approx(0.002 * CATCH_UP_WINDOW)
    assert draft.cache == [1, 2, 3, *missed[-CATCH_UP_WINDOW - 1 :], *proposal.tokens[:2]]
    drafter.rollback_to(1)  # the first guess survived, then the target drew 9
    assert draft.cache[-2:] == [missed[-1], proposal.tokens[0]]
    context += [proposal.tokens[0], 9]
    usual = drafter.propose(context, MODEL, 2, GREEDY, np.random.default_rng(0))
    assert usual.catch_up_seconds == 0.0 and draft.decode_calls[-2][0] == 1  # only the 9
    drafter.rollback_to(0)
    assert draft.cache[-3:] == [missed[-1], proposal.tokens[0], 9]
    # A new generation that shares the prompt cannot reuse a cache with a gap: it reads anew.
    drafter.begin([1, 2, 3, 4, 5], reuse_prefix=True)
    draft.decode_calls.clear()
    drafter.propose([1, 2, 3, 4, 5], MODEL, 1, GREEDY, np.random.default_rng(0))
    assert draft.decode_calls[0] == (4, 0) and draft.cache == [1, 2, 3, 4, 5]


def test_a_draft_model_says_how_much_it_reads_before_its_first_guess() -> None:
    """A draft model reads the prompt once first asked for guesses: its candidate says how many
    tokens that read takes (the prompt but its last token, less what its cache already holds
    of it), and nothing once read; in a batch every other sequence waits for that read."""
    draft = FakeModel(sharpness=0.7)
    drafter = ModelDrafter(draft)
    prompt = list(range(3, 40))
    drafter.begin(prompt)
    assert drafter.candidates(prompt)[0].setup == len(prompt) - 1
    drafter.propose(prompt, drafter.candidates(prompt)[0], 2, GREEDY, np.random.default_rng(0))
    assert drafter.candidates(prompt)[0].setup == 0
    drafter.rollback_to(0)
    longer = [*prompt, 41, 42]
    drafter.begin(longer, reuse_prefix=True)  # a chat that goes on: the prompt's start is held
    assert 0 < drafter.candidates(longer)[0].setup < len(longer) - 1


@pytest.mark.parametrize("missed", [0, 1, 2, 10, CATCH_UP_WINDOW + 1, 3 * CATCH_UP_WINDOW])
@pytest.mark.parametrize("read", [False, True])
def test_a_draft_model_s_setup_is_what_it_reads_before_its_first_step(
    missed: int, read: bool
) -> None:
    """What a draft model says it reads before its first guess (its unread prompt, and the
    tokens it missed while the target went on alone, at most the catch-up window) is what it
    then reads: every decode before the step that gives its first guess."""
    draft = FakeModel(sharpness=0.7)
    drafter = ModelDrafter(draft)
    prompt = list(range(3, 40))
    drafter.begin(prompt)
    if read:  # the prompt read, a cycle drafted, its guesses dropped
        drafter.propose(prompt, drafter.candidates(prompt)[0], 2, GREEDY, np.random.default_rng(0))
        drafter.rollback_to(0)
    drawn = [99] if read else []  # the token that cycle drew
    context = [*prompt, *drawn, *range(100, 100 + missed)]
    setup = drafter.candidates(context)[0].setup
    draft.decode_calls.clear()
    drafter.propose(context, drafter.candidates(context)[0], 1, GREEDY, np.random.default_rng(0))
    reads = [n for n, logits in draft.decode_calls if logits == 0]
    assert sum(reads) == setup
    assert setup <= (0 if read else len(prompt) - 1) + CATCH_UP_WINDOW
