"""llama.cpp's repetition, frequency and presence penalties (``specgen.core.penalties``)."""

from __future__ import annotations

import numpy as np
import pytest

from specgen.core.penalties import Penalties, penalties_from


def test_a_row_is_penalized_as_llama_cpp_does() -> None:
    logits = np.array([2.0, -1.0, 0.5, 3.0], dtype=np.float32)
    out = Penalties(repeat=2.0, frequency=0.5, presence=0.25).apply(logits, [0, 1, 1, 5])
    # token 0 once (positive: divided), 1 twice (negative: multiplied), 2 and 3 unseen, 5
    # past the row (a draft's shorter vocabulary) left out.
    assert out.tolist() == pytest.approx([2.0 / 2 - 0.5 - 0.25, -1.0 * 2 - 1.0 - 0.25, 0.5, 3.0])
    assert logits.tolist() == [2.0, -1.0, 0.5, 3.0]  # a new array


def test_the_window_counts_the_last_n_of_the_history_and_the_guesses() -> None:
    p = Penalties(presence=1.0, last_n=3)
    assert p.window([1, 2, 3, 4], [5]) == [3, 4, 5]
    assert p.window([1, 2], [3, 4, 5, 6]) == [4, 5, 6]
    assert Penalties(last_n=-1).window([1, 2], [3]) == [1, 2, 3]
    out = p.apply(np.zeros(8, dtype=np.float32), [1, 2, 3, 4], [5])
    assert np.flatnonzero(out).tolist() == [3, 4, 5]


def test_defaults_and_a_zero_window_change_nothing() -> None:
    assert not Penalties().active
    assert not Penalties(repeat=1.3, last_n=0).active
    assert Penalties(repeat=1.3).active and Penalties(presence=-0.5).active


def test_a_request_names_its_fields_and_keeps_the_rest() -> None:
    base = Penalties(repeat=1.1, last_n=32)
    assert penalties_from({}, base) is base
    assert penalties_from({"presence_penalty": 1}, base) == Penalties(1.1, 0.0, 1.0, 32)
    with pytest.raises(ValueError, match="repeat_penalty"):
        penalties_from({"repeat_penalty": 0})
    with pytest.raises(ValueError, match="repeat_last_n"):
        penalties_from({"repeat_last_n": 1.5})
    with pytest.raises(ValueError, match="frequency_penalty"):
        penalties_from({"frequency_penalty": 3})


@pytest.mark.parametrize("repeat", [5e-324, 1e-30, 1e30, 1.7e308])
def test_an_extreme_repeat_penalty_keeps_every_logit_finite(repeat: float) -> None:
    logits = np.array([30.0, 0.0, -30.0, 1.0, -np.inf], dtype=np.float32)
    out = Penalties(repeat=repeat, frequency=2.0).apply(logits, [0, 1, 2, 4])
    assert np.isfinite(out[:4]).all()
    assert out[3] == 1.0  # unseen
    assert out[4] == -np.inf  # ruled out, and still
    # Below 1 a penalty favours what was seen (a positive logit grows, a negative one nears 0).
    favours = repeat < 1.0
    assert (out[0] > out[3]) == favours and (out[2] > -30.0) == favours


@pytest.mark.parametrize("repeat", [float("inf"), float("nan"), -1.0, 0.0])
def test_a_repeat_penalty_that_is_not_a_positive_number_is_refused(repeat: float) -> None:
    with pytest.raises(ValueError, match="repeat_penalty"):
        Penalties(repeat=repeat)
