"""The counters and clocks of one generation: what the view shows live, bench measures and
``--json``, batches and the server report.

The engine updates a ``Stats`` as it goes; readers on other threads (the live view) only read
it. Time comes from the ``clock`` the engine was given (the wall clock, or a fake in tests).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Literal

from specgen.core.speculative import judged_guesses

if TYPE_CHECKING:
    from specgen.core.lookahead import Lookahead

# Why a generation ended: an end-of-generation token, a stop string, the token limit, a full
# context (the engine's four); the caller cancelled it, or Ctrl-C (the session's two).
StopReason = Literal["eog", "stop", "max_tokens", "context_full", "cancelled", "interrupted"]

# Seconds from some fixed point: ``time.perf_counter``, or a test's fake that models advance.
Clock = Callable[[], float]


@dataclass
class SourceStats:
    """What one source of guesses (``model``, ``ngram``) did in a generation: the cycles it
    opened, and its guesses (an n-gram match that finished a model run counts its guesses,
    not the cycle)."""

    cycles: int = 0
    drafted: int = 0
    accepted: int = 0


@dataclass
class Stats:
    """Counters and clocks of one generation, updated live while it runs.

    ``lookahead`` is what was asked for (a K, or ``"auto"``); ``current_lookahead`` the K of the
    latest cycle, and ``k_counts`` how many cycles ran at each K (0: the target alone).
    """

    lookahead: Lookahead
    seed: int
    speculative: bool = True
    n_prompt: int = 0
    n_prompt_cached: int = 0  # prompt tokens kept in the caches from the last generation
    prompt_seconds: float = 0.0
    n_generated: int = 0
    n_cycles: int = 0
    n_drafted: int = 0
    n_accepted: int = 0
    n_rejected: int = 0
    n_explored: int = 0  # cycles the policy spent exploring a source it had left alone
    draft_seconds: float = 0.0
    # Of draft_seconds, what a drafter spent reading text it had missed (the target decoded it
    # alone while speculation was off): a cost of having been off, not of its guesses.
    catch_up_seconds: float = 0.0
    target_seconds: float = 0.0
    # Of the cycles' time, what the loop spent outside the models' decodes (warping rows,
    # the accept rule, book-keeping, text): None where the decode time is not known (fakes).
    host_seconds: float | None = None
    # How the target's rows came: their top-k from the backend (k), or whole (0).
    row_top_k: int = 0
    coupling: str | None = None  # "gumbel" or "residual" (None: greedy)
    # CPUs other processes kept busy while it ran (bench measures it; None: not measured)
    outside_load: float | None = None
    gen_started: float | None = None
    gen_seconds: float = 0.0
    current_lookahead: int = 0
    reached_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    by_source: dict[str, SourceStats] = field(default_factory=dict)
    k_counts: dict[int, int] = field(default_factory=dict)
    stop_reason: StopReason | None = None
    clock: Clock = field(default=time.perf_counter, repr=False, compare=False)

    def record_cycle(
        self,
        source: str | None,
        lookahead: int,
        drafted: int,
        accepted: int,
        explore: bool,
        model_guesses: int,
        tail_source: str | None = None,
    ) -> None:
        """Count one verified cycle: ``drafted`` guesses, the first ``accepted`` kept, of which
        the first ``model_guesses`` came from ``source``'s run and the rest from an n-gram
        match it led into (``tail_source``)."""
        self.n_cycles += 1
        self.current_lookahead = lookahead
        self.k_counts[lookahead] = self.k_counts.get(lookahead, 0) + 1
        self.n_explored += explore
        self.n_drafted += drafted
        self.n_accepted += accepted
        self.n_rejected += accepted < drafted
        if source is not None:
            self._count(source, model_guesses, min(accepted, model_guesses), True)
            if tail_source is not None:
                self._count(
                    tail_source, drafted - model_guesses, max(accepted - model_guesses, 0), False
                )
        judged = judged_guesses(drafted, accepted)
        while len(self.reached_at) < judged:
            self.reached_at.append(0)
            self.accepted_at.append(0)
        for i in range(judged):
            self.reached_at[i] += 1
            self.accepted_at[i] += i < accepted

    def _count(self, source: str, drafted: int, accepted: int, cycle: bool) -> None:
        mine = self.by_source.setdefault(source, SourceStats())
        mine.cycles += cycle
        mine.drafted += drafted
        mine.accepted += accepted

    @property
    def accept_rate(self) -> float | None:
        """Share of drafted tokens that were kept (llama.cpp's "accept" figure)."""
        return self.n_accepted / self.n_drafted if self.n_drafted else None

    @property
    def alpha(self) -> float | None:
        """Alpha (Leviathan et al. 2023): the chance that a guess the target looks at survives.

        Guesses after a rejection are drafted but never judged, so they are left out here.
        """
        judged = self.n_accepted + self.n_rejected
        return self.n_accepted / judged if judged else None

    @property
    def n_cycle_tokens(self) -> int:
        """Tokens the cycles gave: all but the first, which the prompt's own pass gives."""
        return self.n_generated - 1 if self.n_cycles else 0

    @property
    def tokens_per_cycle(self) -> float | None:
        return self.n_cycle_tokens / self.n_cycles if self.n_cycles else None

    def finish(self, reason: StopReason) -> None:
        """Stop the generation clock; ``reason`` says why generation ended."""
        if self.gen_started is not None:
            self.gen_seconds = self.clock() - self.gen_started
        self.stop_reason = reason

    def elapsed(self) -> float:
        """Generation time so far (prompt processing excluded)."""
        if self.stop_reason is None and self.gen_started is not None:
            return self.clock() - self.gen_started
        return self.gen_seconds

    @property
    def tokens_per_second(self) -> float | None:
        elapsed = self.elapsed()
        return self.n_generated / elapsed if elapsed > 0 and self.n_generated else None

    @property
    def prompt_tokens_per_second(self) -> float | None:
        return self.n_prompt / self.prompt_seconds if self.prompt_seconds > 0 else None

    @property
    def host_share(self) -> float | None:
        """The loop's own host work as a share of generation time (what limits the speedup
        where a target step is short: a GPU's)."""
        elapsed = self.elapsed()
        return self.host_seconds / elapsed if self.host_seconds is not None and elapsed else None

    def position_accept_rates(self) -> list[float]:
        """How often the 1st, 2nd, ... guess survived, among cycles that got that far."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.reached_at)]

    def as_dict(self) -> dict[str, object]:
        return {
            "lookahead": self.lookahead,
            "seed": self.seed,
            "coupling": self.coupling,
            "prompt_tokens": self.n_prompt,
            "prompt_tokens_cached": self.n_prompt_cached,
            "prompt_seconds": round(self.prompt_seconds, 6),
            "prompt_tokens_per_second": self.prompt_tokens_per_second,
            "generated_tokens": self.n_generated,
            "generation_seconds": round(self.elapsed(), 6),
            "tokens_per_second": self.tokens_per_second,
            "cycles": self.n_cycles,
            "drafted": self.n_drafted,
            "accepted": self.n_accepted,
            "accept_rate": self.accept_rate,
            "alpha": self.alpha,
            "tokens_per_cycle": self.tokens_per_cycle,
            "position_accept_rates": self.position_accept_rates(),
            "draft_seconds": round(self.draft_seconds, 6),
            "catch_up_seconds": round(self.catch_up_seconds, 6),
            "target_seconds": round(self.target_seconds, 6),
            "host_seconds": None if self.host_seconds is None else round(self.host_seconds, 6),
            "host_share": self.host_share,
            "rows": f"top-{self.row_top_k} on the backend" if self.row_top_k else "whole",
            "stop_reason": self.stop_reason,
            "drafters": {name: asdict(src) for name, src in self.by_source.items()},
            "lookahead_history": self.lookahead_summary(),
        }

    def lookahead_summary(self) -> dict[str, object]:
        """The K's the cycles ran at: mean, range, cycles with the target alone, and the
        exploring cycles (``probes``: what a user reads as the policy probing a source)."""
        cycles = sum(self.k_counts.values())
        return {
            "mean": (sum(k * n for k, n in self.k_counts.items()) / cycles) if cycles else None,
            "min": min(self.k_counts, default=None),
            "max": max(self.k_counts, default=None),
            "target_alone_cycles": self.k_counts.get(0, 0),
            "probes": self.n_explored,
            "cycles_by_k": {str(k): n for k, n in sorted(self.k_counts.items())},
        }
