"""Where guesses come from: a draft model, prompt lookup (n-grams), or both.

The engine does not know which: it drives any ``Drafter`` through the contract in
``specgen.drafters.base``. A drafter may look at the text so far (the context) when it decides
what to offer: a choice that depends only on the past keeps the output exact. ``make_drafter``
is the one place that decides which drafter a loaded pair drafts with.
"""

from __future__ import annotations

import time

from specgen.drafters.base import (
    TARGET_ALONE,
    Candidate,
    Drafter,
    Model,
    NgramTail,
    Plan,
    Proposal,
    common_prefix,
    model_guesses,
    reuse_prefix_cache,
)
from specgen.drafters.hybrid import HYBRID_MIN_MATCH, HybridDrafter
from specgen.drafters.model import CATCH_UP_WINDOW, ModelDrafter
from specgen.drafters.ngram import NGRAM_MAX, NGRAM_MIN, NGRAM_SPAN, NgramDrafter
from specgen.stats import Clock

__all__ = [
    "CATCH_UP_WINDOW",
    "HYBRID_MIN_MATCH",
    "NGRAM_MAX",
    "NGRAM_MIN",
    "NGRAM_SPAN",
    "TARGET_ALONE",
    "Candidate",
    "Drafter",
    "HybridDrafter",
    "Model",
    "ModelDrafter",
    "NgramDrafter",
    "NgramTail",
    "Plan",
    "Proposal",
    "common_prefix",
    "make_drafter",
    "model_guesses",
    "reuse_prefix_cache",
]


def make_drafter(
    draft: Model | None, ngram: bool, p_min: float = 0.0, clock: Clock = time.perf_counter
) -> Drafter | None:
    """The drafter for a draft model and/or prompt lookup: the model alone, prompt lookup alone,
    both (hybrid), or None (the target alone)."""
    if draft is None:
        return NgramDrafter() if ngram else None
    model = ModelDrafter(draft, p_min, clock)
    return HybridDrafter(model) if ngram else model
