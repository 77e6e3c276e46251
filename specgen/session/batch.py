"""Many prompts on one loaded pair: one JSON line each, written as each finishes.

UI-free: the caller gives a ``write`` for the JSON lines and an ``on_progress`` for a bar. A bad
line or a prompt that cannot run (too long, a chat template that refuses it) becomes an error
line with the error table's message, and the batch goes on; Ctrl-C stops after writing what
finished (the prompt in flight is not written, so ``--resume`` runs it again).

With ``parallel`` > 1 (a pair loaded with that many sequences), that many prompts generate at
once (``session.parallel``); lines are still written in the file's order, each as soon as every
line before it is written, and on Ctrl-C every finished one is.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from specgen.core.penalties import penalties_from
from specgen.engine import GenerationConfig, SpeculativeEngine
from specgen.errors import describe
from specgen.session.generate import Prompt, Result, generate, stream
from specgen.session.pair import Pair
from specgen.session.parallel import Slots
from specgen.session.prompts import BadLine, BatchItem, BatchPrompt
from specgen.stats import Stats


@dataclass
class BatchTally:
    """What a batch has done so far (for a progress bar and the closing summary)."""

    total: int
    done: int = 0
    failed: int = 0
    skipped: int = 0
    generated: int = 0
    drafted: int = 0
    accepted: int = 0
    seconds: float = 0.0
    interrupted: bool = False

    def add(self, stats: Stats) -> None:
        """One prompt done, with its statistics."""
        self.done += 1
        self.generated += stats.n_generated
        self.drafted += stats.n_drafted
        self.accepted += stats.n_accepted
        self.seconds += stats.gen_seconds

    @property
    def accept_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_second(self) -> float | None:
        return self.generated / self.seconds if self.seconds > 0 else None


def finished_ids(path: Path) -> set[str]:
    """Ids with a result (not an error) in an earlier output file, for ``--resume``."""
    if not path.exists():
        return set()
    done = set()
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a crash: its prompt runs again
            if isinstance(record, dict) and "text" in record and not record.get("error"):
                done.add(str(record.get("id")))
    return done


def config_for(item: BatchPrompt, base: GenerationConfig) -> GenerationConfig:
    """The run's settings with the ones this line overrides."""
    settings = dict(item.settings)
    sampling = base.sampling
    if "temperature" in settings:
        sampling = replace(sampling, temperature=settings.pop("temperature"))
    if "penalties" in settings:  # each field named over the run's
        settings["penalties"] = penalties_from(settings["penalties"], base.penalties)
    return replace(base, sampling=sampling, **settings)


def run_batch(
    pair: Pair,
    items: Iterable[BatchItem],
    base: GenerationConfig,
    *,
    chat: bool,
    system: str | None,
    write: Callable[[dict[str, object]], None],
    skip: AbstractSet[str] = frozenset(),
    on_progress: Callable[[BatchTally], None] | None = None,
    total: int = 0,
) -> BatchTally:
    """Generate for every item, calling ``write`` with one record per item as it finishes
    (several at once where the pair holds several sequences)."""
    tally = BatchTally(total=total)
    if pair.parallel > 1:
        _Parallel(pair, base, chat, system, write, tally, on_progress).run(items, skip)
        return tally
    for item in items:
        if str(item.id) in skip:
            tally.skipped += 1
        elif isinstance(item, BadLine):
            write({"id": item.id, "line": item.line, "error": item.error})
            tally.failed += 1
        elif not _one(pair, item, base, chat, system, write, tally):
            break
        if on_progress is not None:
            on_progress(tally)
    return tally


def _prompt_of(item: BatchPrompt) -> Prompt:
    return item.prompt if item.prompt is not None else list(item.messages or ())


def _one(
    pair: Pair,
    item: BatchPrompt,
    base: GenerationConfig,
    chat: bool,
    system: str | None,
    write: Callable[[dict[str, object]], None],
    tally: BatchTally,
) -> bool:
    """Run one prompt and write its line; False when Ctrl-C stopped it."""
    prompt = _prompt_of(item)
    try:
        config = config_for(item, base)
        result = generate(
            pair,
            prompt,
            config,
            chat=chat or item.messages is not None,
            system=item.system or system,
        )
    except Exception as err:
        message = describe(err)
        if message is None:
            raise  # a bug, not a bad prompt: let the caller's error handling show it
        write({"id": item.id, "line": item.line, "error": f"line {item.line}: {message}"})
        tally.failed += 1
        return True
    if result.interrupted:
        tally.interrupted = True
        return False
    write({"id": item.id, **result.as_dict()})
    tally.add(result.stats)
    return True


class _Parallel:
    """A batch on ``pair.parallel`` slots: lines written in order as they can be."""

    def __init__(
        self,
        pair: Pair,
        base: GenerationConfig,
        chat: bool,
        system: str | None,
        write: Callable[[dict[str, object]], None],
        tally: BatchTally,
        on_progress: Callable[[BatchTally], None] | None,
    ) -> None:
        self.pair, self.base, self.chat, self.system = pair, base, chat, system
        self.write, self.tally, self.on_progress = write, tally, on_progress
        self.slots = Slots(pair)
        self.done: dict[int, tuple[dict[str, object], Stats | None]] = {}  # by position
        self.next = 0  # the first position not written

    def run(self, items: Iterable[BatchItem], skip: AbstractSet[str]) -> None:
        try:
            self.slots.run(self._works(items, skip))
        except KeyboardInterrupt:
            self.tally.interrupted = True
            self.slots.close()
            for at in sorted(self.done):  # what finished, in order; the rest runs on --resume
                self._write(at)
        finally:
            self.pair.remember_costs()

    def _works(
        self, items: Iterable[BatchItem], skip: AbstractSet[str]
    ) -> Iterator[Callable[[SpeculativeEngine], None]]:
        """Each line's generation, taken as a slot frees up; a line skipped or unreadable is
        finished as it is reached."""
        for at, item in enumerate(items):
            if str(item.id) in skip:
                self.tally.skipped += 1
                self._finish(at, None, None)
            elif isinstance(item, BadLine):
                self.tally.failed += 1
                self._finish(at, {"id": item.id, "line": item.line, "error": item.error}, None)
            else:
                yield partial(self._generate, at, item)

    def _generate(self, at: int, item: BatchPrompt, engine: SpeculativeEngine) -> None:
        try:
            config = config_for(item, self.base)
            result = None
            for piece in stream(
                self.pair,
                _prompt_of(item),
                config,
                chat=self.chat or item.messages is not None,
                system=item.system or self.system,
                engine=engine,
            ):
                if isinstance(piece, Result):
                    result = piece
            assert result is not None, "stream always ends with a Result"
        except Exception as err:
            message = describe(err)
            if message is None:
                raise  # a bug, not a bad prompt: let the caller's error handling show it
            self.tally.failed += 1
            record: dict[str, object] = {
                "id": item.id,
                "line": item.line,
                "error": f"line {item.line}: {message}",
            }
            self._finish(at, record, None)
            return
        self._finish(at, {"id": item.id, **result.as_dict()}, result.stats)

    def _finish(self, at: int, record: dict[str, object] | None, stats: Stats | None) -> None:
        if record is not None:
            self.done[at] = (record, stats)
        else:
            self.done[at] = ({}, None)
        while self.next in self.done:
            self._write(self.next)
            self.next += 1

    def _write(self, at: int) -> None:
        record, stats = self.done.pop(at)
        if record:
            self.write(record)
        if stats is not None:
            self.tally.add(stats)
        if self.on_progress is not None:
            self.on_progress(self.tally)
