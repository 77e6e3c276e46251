"""Where guesses come from: a draft model, a head that reads the target's hidden states (its
own MTP head, an EAGLE3 or DFlash head), prompt lookup (n-grams), or one of the first two beside
the last.

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
from specgen.drafters.head import BlockHead, Head, HeadDrafter
from specgen.drafters.hybrid import HYBRID_MIN_MATCH, HybridDrafter
from specgen.drafters.model import CATCH_UP_WINDOW, ModelDrafter
from specgen.drafters.ngram import NGRAM_MAX, NGRAM_MIN, NGRAM_SPAN, NgramDrafter
from specgen.drafters.suffix import SuffixCache
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
    "BlockHead",
    "Head",
    "HeadDrafter",
    "HybridDrafter",
    "Model",
    "ModelDrafter",
    "NgramDrafter",
    "NgramTail",
    "Plan",
    "SuffixCache",
    "Proposal",
    "common_prefix",
    "make_drafter",
    "model_guesses",
    "reuse_prefix_cache",
]


def make_drafter(
    draft: Model | None,
    ngram: bool,
    p_min: float = 0.0,
    clock: Clock = time.perf_counter,
    head: Head | BlockHead | None = None,
    target: Model | None = None,
    cache: SuffixCache | None = None,
) -> Drafter | None:
    """The drafter for a draft model, or a ``head`` on the ``target``, and/or prompt lookup:
    one of the first two alone, prompt lookup alone, one beside it (hybrid), or None (the target
    alone). ``cache``: prompt lookup also looks up what earlier generations read and wrote."""
    guesser: ModelDrafter | HeadDrafter
    if head is not None:
        assert target is not None, "a head drafts for its target"
        guesser = HeadDrafter(
            head, target.is_eog, lambda: target.n_ctx - target.n_past - 1, p_min, clock
        )
    elif draft is not None:
        guesser = ModelDrafter(draft, p_min, clock)
    else:
        return NgramDrafter(cache) if ngram else None
    return HybridDrafter(guesser, NgramDrafter(cache)) if ngram else guesser
