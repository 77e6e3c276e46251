"""``benchmarks/oracle_bound.py``: the fewest cycles a text allows, and the bound's arithmetic,
on texts small enough to count by hand."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

from specgen.core.coupling import agreement
from specgen.core.sampling import Dist
from tests.bench import benchmark


@pytest.fixture(scope="module")
def oracle() -> ModuleType:
    return benchmark("oracle_bound")


def test_prompt_lookup_reads_on_from_any_earlier_place_of_the_last_token(
    oracle: ModuleType,
) -> None:
    # At x = 1 the text so far ends in 1, seen at the prompt's start: 2, 3, 1 follow there.
    assert oracle.lookup_runs([1, 2, 3], [1, 2, 3, 1], [], 32) == [0, 3, 2, 1]
    # Another request's text holds 3 then 1: the first position has a guess too.
    assert oracle.lookup_runs([1, 2, 3], [1, 2, 3, 1], [[3, 1]], 32) == [1, 3, 2, 1]
    assert oracle.lookup_runs([1, 2, 3], [1, 2, 3, 1], [], 2) == [0, 2, 2, 1]


def test_a_cycle_keeps_its_right_guesses_and_the_target_s_token(oracle: ModuleType) -> None:
    none = [0] * 6
    assert oracle.cycles_by_draft(none, none, 32).tolist() == [6] * 7
    # Three from the first position (two guesses and the target's), then one a cycle.
    assert oracle.cycles_by_draft([2, 0, 0, 0, 0, 0], none, 32)[0] == 4
    # The draft model's guesses are counted: every one saves a cycle, up to one cycle in all.
    draft = [5, 4, 3, 2, 1, 0]
    assert oracle.cycles_by_draft(none, draft, 32).tolist() == [6, 5, 4, 3, 2, 1, 1]
    # At most ``cap`` guesses a cycle.
    assert oracle.cycles_by_draft(none, draft, 2).tolist() == [6, 5, 4, 3, 2, 2, 2]


def test_runs_of_both_sources_chain_within_a_cycle(oracle: ModuleType) -> None:
    # Prompt lookup guesses position 0, the draft model 1 and 2 from there: one cycle for two
    # of its guesses, two cycles for one, three for none.
    assert oracle.cycles_by_draft([1, 0, 0, 0], [0, 2, 1, 0], 32).tolist() == [3, 2, 1, 1, 1]


def test_a_client_s_texts_share_its_cycles_and_the_draft_s_guesses(oracle: ModuleType) -> None:
    by_draft = np.array([2, 1, 1])  # two tokens: two cycles, one with a guess of the draft's
    need = oracle.draft_for_cycles(by_draft, 4)
    assert need.tolist()[1:] == [1, 0, 0, 0] and need[0] >= oracle.UNREACHABLE
    both = oracle.min_plus(need, need)
    assert both.tolist()[2:] == [2, 1, 0]


def test_the_passes_hull_lies_under_every_timing(oracle: ModuleType) -> None:
    hull = oracle.lower_hull({1: 10.0, 2: 30.0, 3: 20.0, 4: 40.0})
    assert hull == [(1, 10.0), (3, 20.0), (4, 40.0)]
    assert oracle.phi(hull, 2) == pytest.approx(15.0)
    assert oracle.phi(hull, 5) == pytest.approx(60.0)  # the last segment's line past its end


def test_more_clients_share_a_pass_s_fixed_cost(oracle: ModuleType) -> None:
    plain = [np.array([2, 2, 2]), np.array([2, 2, 2])]  # two texts of two tokens, no guesses
    hull = oracle.lower_hull({1: 2.0, 3: 4.0})  # a pass: 1 s, and 1 s a token
    # One client: four passes of a token each; two: two passes of two.
    assert oracle.bound(plain, 1, hull, 0.0, 0)[:2] == (pytest.approx(8.0), 4)
    assert oracle.bound(plain, 2, hull, 0.0, 0)[:2] == (pytest.approx(6.0), 2)
    # The prompts' tokens are read in the passes too.
    assert oracle.bound(plain, 2, hull, 0.0, 4)[0] == pytest.approx(10.0)
    # A guess of the draft model's costs its share of a step.
    guessed = [np.array([2, 1, 1]), np.array([2, 1, 1])]
    assert oracle.bound(guessed, 2, hull, 0.25, 0) == (pytest.approx(5.5), 1, 2)


def test_a_text_that_repeats_is_read_on_past_its_end(oracle: ModuleType) -> None:
    """Prompt lookup guesses a text that repeats every P tokens goes on doing so: the bound
    reads on as far, or it would fall below what specgen's own lookup keeps."""
    # After 1 2 1 2, the earlier 2 (two back) is followed by 1 2, and then 1 2 again.
    assert oracle.lookup_runs([1, 2, 1, 2], [1, 2, 1, 2, 1], [], 32)[0] == 5


def test_a_run_is_the_right_guesses_in_a_row_from_a_position(oracle: ModuleType) -> None:
    assert oracle.runs_of([True, True, False, True], 32) == [2, 1, 0, 1]
    assert oracle.runs_of([True, True, False, True], 1) == [1, 1, 0, 1]


class _Rows:
    """A model whose every row is the same logits (``draft_right`` and ``sampled_text``
    read a sequence's rows and ask whether a token ends the text)."""

    def __init__(self, logits: list[float]) -> None:
        self.logits = np.array(logits, dtype=np.float32)

    def sequence(self, i: int) -> _Rows:
        return self

    def reset(self) -> None:
        pass

    def decode(self, tokens: list[int], n_logits: int) -> np.ndarray:
        return np.tile(self.logits, (n_logits, 1))

    def is_eog(self, token: int) -> bool:
        return False


def _sampled(oracle: ModuleType, target: _Rows, draft: _Rows, n: int) -> dict[str, list[bool]]:
    params = oracle.SamplingParams(1.0, 0, 1.0, 0.0)  # p and q are the rows' softmax
    text, made = oracle.sampled_text(target, [0], n, params, seed=7)
    assert len(text) == n and len(made.p) == n
    return oracle.draft_right(draft, [0], text, made)


def test_a_draft_whose_q_is_p_has_every_guess_kept_by_either_rule(oracle: ModuleType) -> None:
    same = _Rows([0.0, 1.0, 2.0, 0.5])
    right = _sampled(oracle, same, same, 200)
    assert all(right["draft"]) and all(right["coin"])


def test_sampled_guesses_are_kept_as_often_as_each_rule_keeps_them(oracle: ModuleType) -> None:
    """The coin keeps a guess 1 - TV of the time (the min(1, p/q) rule's rate); the Gumbel-max
    rule as often as the two picks agree under shared noise (``core.coupling.agreement``).
    4000 positions with a fixed seed: each rate's binomial spread is 0.008, the bounds below
    about four of it away."""
    p_logits, q_logits = [0.0, 1.0, 2.0, 0.5], [2.0, 1.0, 0.0, 0.5]
    p = np.exp(p_logits) / np.exp(p_logits).sum()
    q = np.exp(q_logits) / np.exp(q_logits).sum()
    kept = np.minimum(p, q).sum()  # 1 - TV: 0.50 here
    right = _sampled(oracle, _Rows(p_logits), _Rows(q_logits), 4000)
    assert np.mean(right["coin"]) == pytest.approx(kept, abs=0.03)
    agree = agreement(Dist.from_dense(p), Dist.from_dense(q))  # 0.39 here
    assert np.mean(right["draft"]) == pytest.approx(agree, abs=0.03)


class _Alternating(_Rows):
    """A draft whose row for the token at an even position is ``even``'s logits, at an odd one
    ``odd``'s: each row must be read for its own position's token."""

    def __init__(self, even: list[float], odd: list[float]) -> None:
        self.rows = np.array([even, odd], dtype=np.float32)

    def decode(self, tokens: list[int], n_logits: int) -> np.ndarray:
        first = len(tokens) - n_logits  # the row of token j decides the token after it
        return np.stack([self.rows[(first + r) % 2] for r in range(n_logits)])


def test_each_position_s_guess_is_judged_by_that_position_s_row(oracle: ModuleType) -> None:
    """Behind a prompt of one token, text[y] is guessed from the draft's row y: at even
    positions the draft's q is p (every guess kept), at odd ones nearly all on token 0 (kept
    only where the text's token is 0, either rule)."""
    p_logits = [0.0, 1.0, 2.0, 0.5]
    params = oracle.SamplingParams(1.0, 0, 1.0, 0.0)
    text, made = oracle.sampled_text(_Rows(p_logits), [0], 400, params, seed=3)
    draft = _Alternating(p_logits, [12.0, 0.0, 0.0, 0.0])
    right = oracle.draft_right(draft, [0], text, made)
    for rule in ("draft", "coin"):
        assert all(right[rule][0::2]), rule
        assert right[rule][1::2] == [t == 0 for t in text[1::2]], rule
    assert 0 < sum(right["coin"][1::2]) < len(text) // 4


def test_specgen_s_lookup_reads_on_from_its_own_match_not_hindsight_s(oracle: ModuleType) -> None:
    assert oracle.ngram_runs([1, 2, 3], [1, 2, 3, 1], 32) == [0, 3, 2, 1]
    # The text so far ends in 9 1, which last occurred followed by 8: specgen's lookup guesses
    # 8; hindsight finds the 1 that 7 followed.
    prompt = [1, 7, 9, 1, 8, 9, 1]
    assert oracle.ngram_runs(prompt, [7], 32) == [0]
    assert oracle.lookup_runs(prompt, [7], [], 32) == [1]
