"""The speculative loop (``loop``) and what it takes and gives (``events``).

The engine yields events (text pieces, cycle results, the end) and does no I/O: the CLI prints,
the benchmark measures. It knows nothing of where guesses come from (``specgen.drafters``) or
how many to ask for (``specgen.lookahead``).
"""

from specgen.engine.events import (
    DEFAULT_MAX_TOKENS,
    MAX_TOP_LOGPROBS,
    CycleDone,
    Event,
    Finished,
    GenerationConfig,
    TextChunk,
    TokenLogprob,
    token_logprob,
)
from specgen.engine.loop import SpeculativeEngine

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "MAX_TOP_LOGPROBS",
    "CycleDone",
    "Event",
    "Finished",
    "GenerationConfig",
    "SpeculativeEngine",
    "TextChunk",
    "TokenLogprob",
    "token_logprob",
]
