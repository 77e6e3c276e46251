"""A ratio of two settings measured round by round, with its 95% interval: what an A/B on a
shared, noisy machine can tell (``server_duel.py`` reads servers so, ``streams_cost.py`` stream
counts). No dependency past the standard library."""

from __future__ import annotations

import math
import statistics

# Student's t at 97.5% by degrees of freedom (past the table: the normal's 1.96).
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179)


def paired_ratio(base: list[float], other: list[float]) -> tuple[float, float, float]:
    """``other`` against ``base``, round by round: the geometric mean of the rounds' ratios and
    its 95% interval (Student's t on their logarithms; the machine's drift within a round falls
    on both, so the rounds' ratios spread less than either's figures). One round: no interval
    (0 to infinity)."""
    logs = [math.log(b / a) for a, b in zip(base, other, strict=True)]
    mean = statistics.mean(logs)
    if len(logs) < 2:
        return math.exp(mean), 0.0, math.inf
    t = T_975[len(logs) - 2] if len(logs) - 2 < len(T_975) else 1.96
    half = t * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)
