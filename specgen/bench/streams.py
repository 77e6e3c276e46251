"""The bench's concurrency row: aggregate tokens per second with 1, 2, 4 ... streams at once on
the pair's slots (``session.parallel``, as ``serve --parallel`` and batches run them), with
``-k auto`` and with the target alone (``-k 0``), on the same prompts.

Each figure runs every prompt once, at most S at a time, timed (on the pair's clock) from the
first start to the last end: the generated tokens over that time. The slots' engines keep
``-k auto``'s costs from one figure to the next, after a warm-up that builds every slot's graphs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from specgen.engine import GenerationConfig, SpeculativeEngine
from specgen.session.generate import Result, stream
from specgen.session.pair import Pair
from specgen.session.parallel import Slots


@dataclass(frozen=True)
class StreamsRow:
    """One figure: S streams at K (``auto`` or 0)."""

    streams: int
    lookahead: str
    tokens: int
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def measure_streams(
    pair: Pair,
    prompts: Sequence[str],
    counts: Sequence[int],
    config: GenerationConfig,
    chat: bool,
) -> list[StreamsRow]:
    """Every prompt at most S at a time for each S in ``counts`` (at most ``pair.parallel``),
    at K=0 and at ``-k auto``."""
    assert max(counts) <= pair.parallel, "the pair's contexts hold the streams"
    slots = Slots(pair)
    rows: list[StreamsRow] = []
    try:
        # A warm-up: every slot's graphs built, and -k auto's first costs measured.
        _run(slots, prompts[: pair.parallel], pair.parallel, replace(config, max_tokens=8), chat)
        for lookahead in ("0", "auto"):
            for count in counts:
                asked = replace(config, lookahead=0 if lookahead == "0" else "auto")
                started = pair.clock()
                tokens = _run(slots, prompts, count, asked, chat)
                rows.append(StreamsRow(count, lookahead, tokens, pair.clock() - started))
    finally:
        slots.close()
    return rows


def _run(
    slots: Slots, prompts: Sequence[str], at_once: int, config: GenerationConfig, chat: bool
) -> int:
    """Every prompt, at most ``at_once`` at a time; the tokens generated."""
    made = [0]

    def work(prompt: str) -> Callable[[SpeculativeEngine], None]:
        def run(engine: SpeculativeEngine) -> None:
            for item in stream(slots.pair, prompt, config, chat=chat, engine=engine):
                if isinstance(item, Result):
                    made[0] += item.stats.n_generated

        return run

    # Ending together once the last prompt has started, as a file's batch does (the server
    # balances only requests that arrived together).
    slots.run((work(prompt) for prompt in prompts), at_once)
    return made[0]


def best_streams(rows: Sequence[StreamsRow]) -> StreamsRow:
    """The figure with the most tokens per second (the fewest streams among equals)."""
    return max(rows, key=lambda r: (round(r.tokens_per_second, 1), -r.streams))


def streams_advice(rows: Sequence[StreamsRow], best: StreamsRow) -> list[str]:
    """What the concurrency table says to do: ``best``, the count that gave the most with
    ``-k auto`` (serve's default), and where ``-k 0`` measured faster at that count, that too."""
    lines = [
        f"most tokens/s here: {best.streams} at once ({best.tokens_per_second:.1f} tok/s); "
        f"serve with --parallel {best.streams} where that many clients come at once"
    ]
    plain = next((r for r in rows if r.lookahead == "0" and r.streams == best.streams), None)
    if plain is not None and plain.tokens_per_second > best.tokens_per_second:
        lines.append(
            f"at {best.streams} at once the target alone was faster here "
            f"({plain.tokens_per_second:.1f} tok/s): for requests like these, "
            f"serve --parallel {best.streams} -k 0 may give more"
        )
    return lines
