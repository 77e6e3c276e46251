"""Accepted tokens to the text a generation prints: UTF-8 held whole, stop strings, the token
limit and the end of generation, each with its stop reason."""

from __future__ import annotations

from specgen.core.text import StopMatcher, StreamDecoder
from specgen.drafters import Model
from specgen.engine.events import GenerationConfig
from specgen.stats import Stats, StopReason


class Emitter:
    """Accepted tokens to printable text: UTF-8 held whole, stop strings and limits enforced."""

    def __init__(self, target: Model, config: GenerationConfig) -> None:
        self.target, self.max_tokens = target, config.max_tokens
        self.decoder, self.stopper = StreamDecoder(), StopMatcher(config.stop)
        self.reason: StopReason | None = None
        self.kept = dict(config.keep_text)

    def tokens(self, new: list[int], stats: Stats) -> str:
        text: list[str] = []
        for token in new:
            if self.target.is_eog(token):
                self.reason = "eog"
                break
            stats.n_generated += 1
            raw = self.kept.get(token)
            piece, stopped = self.stopper.feed(
                self.decoder.feed(self.target.piece(token) if raw is None else raw)
            )
            text.append(piece)
            if stopped:
                self.reason = "stop"
                break
            if stats.n_generated >= self.max_tokens:
                self.reason = "max_tokens"
                break
        if self.reason is not None and self.reason != "stop":
            text.append(self.stopper.feed(self.decoder.flush())[0] + self.stopper.flush())
        return "".join(text)
