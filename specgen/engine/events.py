"""What a generation takes and gives: its settings (``GenerationConfig``) and the events the
engine yields (text, a cycle's result, the end), with each token's log-probability.

Plain values: no model, no loop. ``specgen.engine.loop`` makes them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, get_args

import numpy as np

from specgen.core.lookahead import Lookahead, check_lookahead
from specgen.core.penalties import Penalties
from specgen.core.sampling import SamplingParams, top_ids
from specgen.stats import Stats, StopReason
from specgen.structured.grammar import Grammar, LogitBias

# New tokens per generation unless told otherwise (run, batches, the API, the server).
DEFAULT_MAX_TOKENS = 256


Coupling = Literal["auto", "gumbel", "residual"]


@dataclass(frozen=True)
class GenerationConfig:
    """One generation's settings, the one shape from a request (the CLI's options, the API's
    keywords, the server's JSON) to the engine. ``lookahead`` overrides the engine's K for this
    generation (bench runs each K on one loaded pair): 0 is the target alone, ``"auto"`` adapts
    K; None (the default) keeps the K the pair was loaded with."""

    lookahead: Lookahead | None = None  # None: the engine's own (its pair's K)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = DEFAULT_MAX_TOKENS
    stop: tuple[str, ...] = ()
    seed: int | None = None
    grammar: Grammar | None = None  # what the output must match (``specgen.structured.grammar``)
    logit_bias: LogitBias | None = None  # added to the target's logits and the draft's
    # Repetition, frequency and presence penalties (``core.penalties``), of both models' rows.
    penalties: Penalties | None = None
    # Log-probabilities of each generated token (and of the ``logprobs`` likeliest there):
    # None for none; from the target's own rows, which the verify pass has computed anyway.
    logprobs: int | None = None
    # Special tokens printed as their text (a tool call's markers), which otherwise print as
    # nothing: (token, text) pairs.
    keep_text: tuple[tuple[int, bytes], ...] = ()
    # How a sampled token is tied to the guesses (``specgen.core.coupling``): "gumbel" makes the
    # text a function of (seed, position) at any K; "residual" is the min(1, p/q) rule, which
    # keeps the most guesses; "auto": gumbel where a seed is given, else residual.
    coupling: Coupling = "auto"

    def __post_init__(self) -> None:
        if self.lookahead is not None:
            check_lookahead(self.lookahead)
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"logprobs must be from 0 to {MAX_TOP_LOGPROBS}")
        if self.coupling not in get_args(Coupling):
            raise ValueError(f"coupling must be one of {', '.join(get_args(Coupling))}")

    def rule(self) -> str | None:
        """The coupling this generation runs (None: greedy, the argmax, needs none)."""
        if self.sampling.greedy:
            return None
        if self.coupling == "auto":
            return "gumbel" if self.seed is not None else "residual"
        return self.coupling


# The most alternatives a token's log-probability comes with (OpenAI's top_logprobs bound).
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probability under the target (its logits after the logit bias
    and the grammar's mask, at temperature 1: the model's own distribution, as OpenAI and
    llama-server report it), with the likeliest tokens there and theirs."""

    token: int
    logprob: float
    piece: bytes = b""  # what the token prints
    top: tuple[tuple[int, float, bytes], ...] = ()  # (token, logprob, piece), likeliest first

    def as_dict(self) -> dict[str, object]:
        """As data: id, text (its bytes decoded, replacing what a token cuts mid-character),
        bytes and logprob, and ``top``, the likeliest tokens there, each the same."""

        def one(token: int, logprob: float, piece: bytes) -> dict[str, object]:
            text = piece.decode("utf-8", "replace")
            return {"id": token, "token": text, "bytes": list(piece), "logprob": logprob}

        return {**one(self.token, self.logprob, self.piece), "top": [one(*t) for t in self.top]}


def token_logprob(
    row: np.ndarray, token: int, top: int, piece: Callable[[int], bytes]
) -> TokenLogprob:
    """``token``'s log-probability in the softmax of ``row``, and the ``top`` likeliest."""
    values = np.asarray(row, dtype=np.float64)
    peak = float(values.max())
    normalizer = peak + float(np.log(np.exp(values - peak).sum()))
    best: tuple[tuple[int, float, bytes], ...] = ()
    if top:
        ids = top_ids(values, top) if top < len(values) else np.arange(len(values))
        ids = ids[np.argsort(-values[ids], kind="stable")]
        best = tuple((int(i), float(values[i] - normalizer), piece(int(i))) for i in ids)
    return TokenLogprob(token, float(values[token] - normalizer), piece(token), best)


@dataclass(frozen=True)
class TextChunk:
    text: str
    # The log-probabilities of the tokens this text came from, where asked for (the session
    # fills them in: the engine reports them with each cycle).
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class CycleDone:
    """The tokens one target pass added: a cycle's, or the first token (the prompt's pass,
    ``drafted == 0``)."""

    drafted: int
    accepted: int
    tokens: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token, where asked for


@dataclass(frozen=True)
class Finished:
    reason: StopReason
    stats: Stats


Event = TextChunk | CycleDone | Finished
