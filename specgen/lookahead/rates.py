"""What a batch measured of its own cycles, by its size: tokens per second with a kind of guess
and without (``lookahead.batch`` decides by them), kept with the costs (``CostBook.batches``)
so that a new process on these models starts from what the last one learned.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

RATE_MEMORY = 0.95  # each cycle's weight in a measured rate falls by this much a cycle


@dataclass
class Rate:
    """A forgetting ratio of tokens to seconds over cycles."""

    tokens: float = 0.0
    seconds: float = 0.0
    cycles: int = 0

    def add(self, tokens: float, seconds: float) -> None:
        self.tokens = RATE_MEMORY * self.tokens + tokens
        self.seconds = RATE_MEMORY * self.seconds + seconds
        self.cycles += 1

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Measured:
    """One batch size's cycles with a kind of guess (``guessed``: any guess, or a draft that
    costs) and without (``plain``), the last run of cycles with it, and the seconds of the
    cycles without it since."""

    guessed: Rate = field(default_factory=Rate)
    plain: Rate = field(default_factory=Rate)
    run_tokens: float = 0.0  # of the last run of cycles with guesses
    run_seconds: float = 0.0
    waited: float = 0.0  # seconds of plain cycles since that run
    retry_left: int = 0

    def add(self, guessed: bool, tokens: float, seconds: float, read: float = 0.0) -> None:
        """A cycle with the kind of guess or without; ``read``: seconds of the draft's reads
        before it, left out of the rates (the price of starting, not of guessing) but counted
        in what a run of such cycles lost, so that retries pay for their reads too."""
        if guessed:
            if self.waited:  # a new run
                self.run_tokens = self.run_seconds = self.waited = 0.0
            self.guessed.add(tokens, seconds)
            self.run_tokens += tokens
            self.run_seconds += seconds + read
            self.retry_left = max(0, self.retry_left - 1)
        else:
            self.plain.add(tokens, seconds)
            self.waited += seconds

    def lost(self, plain: float) -> float:
        """Seconds the last run of cycles with guesses took past what plain cycles at
        ``plain`` tokens per second would have taken for its tokens."""
        return self.run_seconds - self.run_tokens / plain if plain > 0 else 0.0

    def snapshot(self) -> dict[str, Any]:
        """What to remember (``restore``) in a later process."""
        return asdict(self)

    @classmethod
    def restore(cls, snapshot: dict[str, Any]) -> Measured:
        """As an earlier process left it: its rates trusted as they were, its last run's loss
        and the plain seconds since counted on towards the next retry (none under way)."""
        guessed, plain = snapshot.get("guessed", {}), snapshot.get("plain", {})
        return cls(
            Rate(
                float(guessed.get("tokens", 0)),
                float(guessed.get("seconds", 0)),
                int(guessed.get("cycles", 0)),
            ),
            Rate(
                float(plain.get("tokens", 0)),
                float(plain.get("seconds", 0)),
                int(plain.get("cycles", 0)),
            ),
            float(snapshot.get("run_tokens", 0)),
            float(snapshot.get("run_seconds", 0)),
            float(snapshot.get("waited", 0)),
        )
