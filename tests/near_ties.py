"""Greedy speculation against the target alone, on real models: the same tokens, or a first
difference only where the target's two best logits nearly tie. A batched pass and a one-token
pass round their sums differently (the kernels block them differently), so a verify can flip a
near tie that the target alone would break the other way; a real bug (a wrong token kept, a
cache rolled back wrong) diverges where the target was sure."""

from __future__ import annotations

import numpy as np

from specgen.backend import LlamaModel


def assert_same_up_to_near_ties(
    target: LlamaModel,
    prompt: list[int],
    alone: list[int],
    spec: list[int],
    tie: float,
    what: str = "",
) -> None:
    """The speculative tokens are the target's own, or part only where the target's two best
    logits are within ``tie`` of each other (batched and one-token kernels round differently)."""
    if spec == alone:
        return
    first = next(i for i, (a, b) in enumerate(zip(spec, alone)) if a != b)
    target.reset()
    target.sample_top_k(0)
    logits = target.decode(prompt + alone[:first], 1)[0]
    best, second = np.sort(logits)[-2:][::-1]
    assert best - second < tie, (
        f"{what} diverged at {first} with a clear winner ({best - second:.4f})"
    )
