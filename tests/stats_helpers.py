"""Chi-square goodness of fit with small cells pooled, so the test stays valid."""

from __future__ import annotations

import numpy as np
from scipy import stats


def pooled_chisquare_pvalue(
    observed: np.ndarray, expected: np.ndarray, min_expected: float = 5.0
) -> float:
    """p-value of observed counts against expected counts; cells under ``min_expected`` pooled."""
    observed, expected = np.ravel(observed).astype(float), np.ravel(expected).astype(float)
    assert abs(observed.sum() - expected.sum()) < 1e-6 * max(1.0, expected.sum())
    big = expected >= min_expected
    obs, exp = observed[big], expected[big]
    if expected[~big].sum() > 0:
        obs, exp = np.append(obs, observed[~big].sum()), np.append(exp, expected[~big].sum())
    elif observed[~big].sum() > 0:
        return 0.0  # counts where the model says probability zero
    return float(stats.chisquare(obs, exp).pvalue)
