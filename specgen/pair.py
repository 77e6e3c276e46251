"""A loaded target/draft pair: the files fetched, the CPU self-tested, both models loaded with
one context size, the vocabulary check, and the costs ``-k auto`` keeps for them here.

``open_pair`` turns a ``choice.Decision`` into a ``Pair``; ``load_pair`` loads given files.
Models are made, and time is read, by ``BACKEND`` (llama.cpp and the wall clock; tests swap in
fakes and a fake clock, as simonw/llm registers its mock model), so everything above the
backend runs the same on fakes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from specgen import compat, store
from specgen.drafters import Drafter, Model, make_drafter
from specgen.engine import SpeculativeEngine
from specgen.errors import UserError
from specgen.interrupts import interruptible
from specgen.lookahead import CostBook
from specgen.stats import Clock

if TYPE_CHECKING:
    from specgen.backend import ModelOptions
    from specgen.choice import Decision


class LoadedModel(Model, compat.VocabView, Protocol):
    """What a pair needs of a loaded model (``backend.LlamaModel`` has it; so do test fakes)."""

    path: Path
    n_threads: int
    description: str

    def chat_template(self) -> str | None: ...
    def tokenize(
        self, text: str, add_special: bool = True, parse_special: bool = True
    ) -> list[int]: ...


def _llama(path: Path, options: ModelOptions, verbose: bool) -> LoadedModel:
    from specgen.backend import LlamaModel

    return LlamaModel(path, options, verbose=verbose)


@dataclass(frozen=True)
class Backend:
    """How a model file becomes a loaded model, and how generation time is read."""

    load: Callable[[Path, ModelOptions, bool], LoadedModel]
    clock: Clock = time.perf_counter


# llama.cpp and the wall clock, unless a test swaps in fakes.
BACKEND = Backend(_llama)


@dataclass(frozen=True)
class PairOptions:
    """Per-model runtime settings; thread counts of 0 mean llama.cpp's default."""

    n_ctx: int = 0
    target_threads: int = 0
    draft_threads: int = 0
    target_gpu_layers: int = -1
    draft_gpu_layers: int = -1
    verbose: bool = False
    workers: tuple[str, ...] = ()  # `specgen worker`s that take the target's offloaded layers
    local_head: bool = True  # with workers: keep the target's output layer here

    @classmethod
    def for_both(
        cls,
        n_ctx: int = 0,
        threads: int = 0,
        gpu_layers: int = -1,
        verbose: bool = False,
        local_head: bool = True,
    ) -> PairOptions:
        """The same threads and GPU layers for the target and the draft."""
        return cls(n_ctx, threads, threads, gpu_layers, gpu_layers, verbose, local_head=local_head)


@dataclass
class Pair:
    """Loaded models; ``ngram`` drafts by prompt lookup (alone, or beside the draft model).

    ``costs`` are what ``-k auto`` measured on these models here (seconds per guess, the verify
    pass by length; greedy and sampled apart). They are kept in ``costs_file`` between
    processes, so a new run starts from them instead of spending its first cycles timing.
    """

    target: LoadedModel
    draft: LoadedModel | None
    ngram: bool = False
    costs_file: Path | None = None
    clock: Clock = time.perf_counter
    costs: CostBook = field(init=False)  # loaded from ``costs_file``
    _engines: dict[float, SpeculativeEngine] = field(default_factory=dict, repr=False)
    _saved: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.costs = load_costs(self.costs_file)
        self._saved = self.costs.observations

    def remember_costs(self) -> None:
        """Write the costs for the next process when anything new was measured."""
        if self.costs_file is None or self.costs.observations == self._saved:
            return
        store.write_json(self.costs_file, self.costs.snapshot())
        self._saved = self.costs.observations

    def drafter(self, draft_p_min: float = 0.0) -> Drafter | None:
        return make_drafter(self.draft, self.ngram, draft_p_min, self.clock)

    def engine(self, draft_p_min: float = 0.0) -> SpeculativeEngine:
        """The pair's engine, kept from one generation to the next, so the costs ``-k auto``
        learns carry over (a batch or a server pays the learning once)."""
        if draft_p_min not in self._engines:
            self._engines[draft_p_min] = SpeculativeEngine(
                self.target, self.drafter(draft_p_min), costs=self.costs, clock=self.clock
            )
        return self._engines[draft_p_min]


def check_fit(target: LoadedModel, draft: LoadedModel) -> None:
    """Refuse a draft whose vocabulary does not fit the target (result cached per file pair)."""
    stamp = store.path("compat", store.file_key(target.path, draft.path), suffix="")
    if stamp.is_file():
        return
    verdict = compat.check(target, draft)
    if not verdict:
        raise UserError(
            f"draft {draft.path.name} cannot serve target {target.path.name}: "
            f"{verdict.reason}; pick a draft from the target's model family"
        )
    store.write_text(stamp, f"{target.path}\n{draft.path}\n")  # read-only: check next time


def costs_path(target: LoadedModel, draft: LoadedModel | None, options: PairOptions) -> Path:
    """Where the costs ``-k auto`` measured for these model files on this machine, with these
    threads, GPU layers and workers, are kept."""
    from specgen.machine import build_id, cpu_flags

    files = [target.path] if draft is None else [target.path, draft.path]
    machine = [
        cpu_flags(),
        build_id(),
        target.n_threads,
        draft.n_threads if draft else 0,
        options.target_gpu_layers,
        options.draft_gpu_layers,
        list(options.workers),
        options.local_head,
    ]
    return store.path(
        "costs", store.file_key(*files) + "-" + store.text_key(json.dumps(machine, default=str))
    )


def load_costs(path: Path | None) -> CostBook:
    """The costs an earlier process kept at ``path`` (none, or unreadable: start afresh)."""
    if path is None:
        return CostBook()
    try:
        return CostBook.restore(store.read_json(path, {}))
    except (ValueError, TypeError, AttributeError):
        return CostBook()


def open_pair(decision: Decision, options: PairOptions, progress: bool = True) -> Pair:
    """The pair a decision runs: its files fetched (with progress on stderr where ``progress``)
    and converted, the CPU self-test passed, both models loaded."""
    from specgen.registry import resolve
    from specgen.selftest import ensure_cpu_works

    target_path = resolve(decision.choice.target, progress=progress)
    draft_path = resolve(decision.draft, progress=progress) if decision.draft else None
    ensure_cpu_works([p for p in (target_path, draft_path) if p is not None])
    return load_pair(
        target_path,
        draft_path,
        replace(options, workers=decision.choice.workers),
        ngram=decision.ngram,
    )


def load_pair(
    target: str | Path, draft: str | Path | None, options: PairOptions, ngram: bool = False
) -> Pair:
    """Load both models with the same context size, each with its own threads and GPU layers.

    Loading runs where Ctrl-C ends it at once (``specgen.interrupts``).
    """
    return interruptible(lambda: _load(target, draft, options, ngram), "loading the models")


def _load(target: str | Path, draft: str | Path | None, options: PairOptions, ngram: bool) -> Pair:
    from specgen.backend import ModelOptions

    backend = BACKEND
    target_path = _existing(target, "target")
    target_model = backend.load(
        target_path,
        ModelOptions(
            options.n_ctx,
            options.target_threads,
            options.target_gpu_layers,
            workers=options.workers,
            local_head=options.local_head,
        ),
        options.verbose,
    )
    if draft is None:
        return Pair(
            target_model, None, ngram, costs_path(target_model, None, options), backend.clock
        )
    draft_path = _existing(draft, "draft")
    draft_model = backend.load(
        draft_path,
        ModelOptions(target_model.n_ctx, options.draft_threads, options.draft_gpu_layers),
        options.verbose,
    )
    check_fit(target_model, draft_model)
    return Pair(
        target_model,
        draft_model,
        ngram,
        costs_path(target_model, draft_model, options),
        backend.clock,
    )


def _existing(path: str | Path, role: str) -> Path:
    resolved = Path(path).expanduser()
    if resolved.is_dir():
        raise UserError(f"{role} model {resolved} is a folder: give the path of a .gguf file")
    if not resolved.is_file():
        raise UserError(f"{role} model not found: {resolved} (give the path of a .gguf file)")
    return resolved
