"""A loaded target/draft pair: the files fetched, the CPU self-tested, both models loaded with
one context size, the vocabulary check, and the costs ``-k auto`` keeps for them here.

``open_pair`` turns a ``decide.Decision`` into a ``Pair``; ``load_pair`` loads given files.
Models are made, and time is read, by ``BACKEND`` (llama.cpp and the wall clock; tests swap in
fakes and a fake clock, as simonw/llm registers its mock model), so everything above the
backend runs the same on fakes (``session.loaded``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from specgen.drafters import BlockHead, Drafter, Head, SuffixCache, make_drafter
from specgen.engine import SpeculativeEngine
from specgen.errors import UserError
from specgen.host import machine, store
from specgen.host.interrupts import interruptible
from specgen.lookahead import (
    AUTO_SNAPSHOTS,
    DEFAULT_LOOKAHEAD,
    BatchLoad,
    CostBook,
    Lookahead,
    snapshots_for,
)
from specgen.session.fit import (
    auto_parallel,
    check_fit,
    check_head,
    check_headers_fit,
    check_loadable,
    check_parallel_memory,
    header_of,
)
from specgen.session.loaded import Backend, LoadedModel, chosen_backend
from specgen.session.remembered import costs_path, load_costs, remember_rollbacks, save_costs
from specgen.stats import Clock

if TYPE_CHECKING:
    from specgen.models import gguf
    from specgen.session.decide import Decision


# llama.cpp and the wall clock, unless a test swaps in fakes (in-process, or SPECGEN_BACKEND).
BACKEND = chosen_backend()


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
    mtp: bool = False  # draft with the target's own MTP head
    # The draft file is this kind of head (``eagle3``, ``dflash``); a file of that
    # architecture is one anyway (``session.fit.check_head``).
    head: str | None = None
    # A recurrent target's snapshots (``lookahead.snapshots_for``): what K a rollback covers
    # without a checkpoint.
    rollback_window: int = AUTO_SNAPSHOTS
    # Prompt lookup across requests (``drafters.suffix``): on wherever n-grams draft, kept in
    # ``lookup_file`` between processes when one is given.
    lookup_cache: bool = True
    lookup_file: Path | None = None
    # How the pair drafts: K for every generation that does not ask for another, and the
    # draft model's floor on q (``drafters.model``: a guess below it ends the draft).
    lookahead: Lookahead = DEFAULT_LOOKAHEAD
    draft_p_min: float = 0.0
    # Sequences generating at once (``session.parallel``): each model's context holds this
    # many, each with a cache of n_ctx tokens. ``parallel_auto``: nobody chose it, so the
    # count is chosen as the pair loads (``session.fit.auto_parallel``), and ``parallel`` is
    # then its most (``session.fit.AUTO_PARALLEL``, or fewer for a file of fewer prompts).
    parallel: int = 1
    parallel_auto: bool = False
    # The threads a model whose setting is 0 loads with where other processes keep CPUs busy
    # (``host.machine.threads_for_now``; 0: llama.cpp's default). What the pair measures is
    # kept under the setting all the same: a busy moment must not split what is remembered.
    busy_threads: int = 0

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
    ``heads`` are the target's own MTP head, or an EAGLE3 or DFlash head, one a sequence, where
    it drafts with one (then ``draft`` is None); ``head`` is sequence 0's.
    ``lookahead`` and ``draft_p_min`` say how it drafts (``PairOptions``).
    """

    target: LoadedModel
    draft: LoadedModel | None
    ngram: bool = False
    costs_file: Path | None = None
    clock: Clock = time.perf_counter
    heads: list[Head | BlockHead] = field(default_factory=list)  # sequence i's is heads[i]
    busy: Clock | None = None  # ``Backend.busy``
    load_meter: Callable[[], Callable[[], float | None]] | None = None  # ``Backend.load_meter``
    costs: CostBook = field(init=False)  # loaded from ``costs_file``
    # What earlier generations read and wrote, for prompt lookup across requests (None: off).
    lookup: SuffixCache | None = None
    lookup_file: Path | None = None
    notes: list[str] = field(default_factory=list)  # said once to the user (a bad cache file)
    lookahead: Lookahead = DEFAULT_LOOKAHEAD
    draft_p_min: float = 0.0
    parallel: int = 1  # sequences each context holds (``PairOptions.parallel``)
    parallel_note: str = ""  # why that many, where nobody chose (``PairOptions.parallel_auto``)
    _engine: SpeculativeEngine | None = field(default=None, repr=False)
    _saved: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.costs = load_costs(self.costs_file, self.notes.append)
        self._saved = self.costs.observations

    def keep_lookups(self, file: Path | None = None) -> None:
        """Prompt lookup across requests: a suffix cache of this target's vocabulary, read from
        ``file`` (and written back to it) where given; a file that cannot be read, or holds
        another vocabulary's tokens, is left alone with a note."""
        tag = vocabulary_tag(self.target) if file is not None else ""
        self.lookup, self.lookup_file = SuffixCache(vocabulary=tag), file
        if file is not None:
            problem = self.lookup.load(file)
            if problem:
                self.notes.append(problem)
                self.lookup_file = None  # never overwrite what could not be read

    def remember_costs(self) -> None:
        """Write the costs for the next process when anything new was measured, how a
        recurrent target rolled back (``doctor`` shows it), and the lookup cache to its file
        when it holds anything new (after every generation, so a crash loses at most one)."""
        self._remember_rollbacks()
        if self.lookup is not None and self.lookup_file is not None and self.lookup.changed:
            try:
                self.lookup.save(self.lookup_file)
            except OSError as err:
                raise UserError(
                    f"cannot write the lookup cache {self.lookup_file}: {err.strerror or err}"
                ) from err
        if self.costs_file is None or self.costs.observations == self._saved:
            return
        save_costs(self.costs_file, self.costs)
        self._saved = self.costs.observations

    def _remember_rollbacks(self) -> None:
        facts = self.rollback_facts().get("target")
        if not isinstance(facts, dict) or not facts["bounded"] and not facts["checkpoint"]:
            return
        remember_rollbacks(self.target.path, facts)

    def drafter(self, seq: int = 0) -> Drafter | None:
        """A fresh drafter over the pair's models (their sequence ``seq``), drafting as the
        pair says."""
        return make_drafter(
            self.draft.sequence(seq) if self.draft is not None else None,
            self.ngram,
            self.draft_p_min,
            self.clock,
            head=self.heads[seq] if self.heads else None,
            target=self.target.sequence(seq),
            cache=self.lookup,
        )

    def slot_engine(self, seq: int, load: BatchLoad) -> SpeculativeEngine:
        """An engine of its own on sequence ``seq`` of the pair's contexts, one of a batch
        (``session.parallel``): the pair's costs, its K priced by the whole batch."""
        assert seq < self.parallel, f"the pair's contexts hold {self.parallel} sequences"
        return SpeculativeEngine(
            self.target.sequence(seq),
            self.drafter(seq),
            lookahead=self.lookahead,
            costs=self.costs,
            clock=self.clock,
            busy=self.busy,
            load=load,
            slot=seq,
        )

    @property
    def head(self) -> Head | BlockHead | None:
        """Sequence 0's head (None: no head drafts)."""
        return self.heads[0] if self.heads else None

    @property
    def mtp(self) -> bool:
        return self.head_kind == "mtp"

    @property
    def head_kind(self) -> str | None:
        """What the pair drafts with where it is a head: "mtp", "eagle3", "dflash"."""
        return self.head.kind if self.head is not None else None

    def rollback_facts(self) -> dict[str, object]:
        """How each recurrent model of the pair rolled back (``--json``, ``doctor``): its
        snapshots, the state's size and the memory the snapshots take, and the counts."""
        facts: dict[str, object] = {}
        for role, model in (("target", self.target), ("draft", self.draft)):
            if model is None or not model.recurrent:
                continue
            state = model.state_bytes()
            window = model.rollback_window
            facts[role] = {
                "snapshots": window,
                "state_bytes": state,
                "snapshot_bytes": state * (1 + window),
                **model.rollbacks.as_dict(),
            }
        return facts

    def engine(self) -> SpeculativeEngine:
        """The pair's engine, kept from one generation to the next, so the costs ``-k auto``
        learns carry over (a batch or a server pays the learning once)."""
        if self._engine is None:
            self._engine = SpeculativeEngine(
                self.target,
                self.drafter(),
                lookahead=self.lookahead,
                costs=self.costs,
                clock=self.clock,
                busy=self.busy,
            )
        return self._engine


def vocabulary_tag(model: LoadedModel) -> str:
    """A short key of a vocabulary's token texts: a lookup cache's tokens mean nothing to a
    model of another vocabulary."""
    texts = (model.token_text(t).decode("utf-8", "replace") for t in range(model.n_vocab))
    return store.text_key(str(model.n_vocab), *texts)


def _costs_file(
    target: LoadedModel, draft: LoadedModel | None, options: PairOptions, head: Path | None = None
) -> Path:
    files = [target.path] if draft is None else [target.path, draft.path]
    files += [head] if head is not None else []
    # Kept under the threads asked for (0: llama.cpp's default), not a busy moment's fewer.
    default = machine.default_threads()
    threads = [
        options.target_threads or default,
        (options.draft_threads or default) if draft else 0,
    ]
    layers = [options.target_gpu_layers, options.draft_gpu_layers]
    return costs_path(files, [*threads, *layers, list(options.workers), options.local_head])


def open_pair(
    decision: Decision, options: PairOptions, progress: bool = True, snapshots: int | None = None
) -> Pair:
    """The pair a decision runs: its files fetched (with progress on stderr where ``progress``)
    and converted, the CPU self-test passed, both models loaded. A recurrent target keeps the
    snapshots its K needs (``lookahead.snapshots_for``), or ``snapshots`` (bench: its largest K).
    """
    from specgen.models.registry import resolve
    from specgen.models.selftest import ensure_cpu_works

    target_path = resolve(decision.choice.target, progress=progress)
    draft_path = resolve(decision.draft, progress=progress) if decision.draft else None
    ensure_cpu_works([p for p in (target_path, draft_path) if p is not None])
    window = snapshots_for(decision.lookahead, decision.mtp) if snapshots is None else snapshots
    return load_pair(
        target_path,
        draft_path,
        replace(
            options,
            workers=decision.choice.workers,
            mtp=decision.mtp,
            head=decision.choice.head,
            rollback_window=window,
            lookahead=decision.lookahead,
        ),
        ngram=decision.ngram,
    )


def load_pair(
    target: str | Path, draft: str | Path | None, options: PairOptions, ngram: bool = False
) -> Pair:
    """Load both models with the same context size, each with its own threads and GPU layers.

    Loading runs where Ctrl-C ends it at once (``specgen.host.interrupts``).
    """
    pair = interruptible(lambda: _load(target, draft, options, ngram), "loading the models")
    if ngram and options.lookup_cache:
        pair.keep_lookups(options.lookup_file)
    return pair


def _load(target: str | Path, draft: str | Path | None, options: PairOptions, ngram: bool) -> Pair:
    from specgen.backend import ModelOptions

    backend = BACKEND
    target_path = _existing(target, "target")
    target_header = header_of(target_path)
    check_loadable(target_path, target_header, "target", options.mtp)
    if draft is not None and options.mtp:
        raise UserError("a pair drafts with a draft model or with its target's MTP head, not both")
    head_kind = None
    if draft is not None:
        draft_path = _existing(draft, "draft")
        draft_header = header_of(draft_path)
        head_kind = check_head(target_path, target_header, draft_path, draft_header, options.head)
        if head_kind is None:
            check_loadable(draft_path, draft_header, "draft", False)
            check_headers_fit(target_path, draft_path, (target_header, draft_header))
    models = [(target_path, target_header)]
    if draft is not None:
        models.append((draft_path, draft_header))
    parallel_note = ""
    if options.parallel_auto:  # checked against the memory free as it is chosen
        options, parallel_note = _slots(options, models, backend)
    else:
        check_parallel_memory(models, options.n_ctx, options.parallel)
    target_model = backend.load(
        target_path,
        ModelOptions(
            options.n_ctx,
            options.target_threads or options.busy_threads,
            options.target_gpu_layers,
            workers=options.workers,
            local_head=options.local_head,
            rollback_window=options.rollback_window,
            mtp=options.mtp,
            n_seq=options.parallel,
        ),
        options.verbose,
    )
    heads: list[Head | BlockHead] = []
    draft_model = None
    try:
        if draft is None:
            if options.mtp:  # a head a sequence, each with an MTP context of its own
                n = options.parallel
                heads = [backend.attach_mtp(target_model.sequence(s)) for s in range(n)]
        elif head_kind is not None:
            # A head a sequence, each with a context of its own on one copy of the weights.
            heads = [
                backend.attach_head(target_model.sequence(seq), draft_path, head_kind)
                for seq in range(options.parallel)
            ]
        else:
            draft_model = backend.load(
                draft_path,
                # A draft model drafts one token a decode: its rollbacks span decodes, which
                # snapshots cannot cover, so a recurrent draft rolls back by checkpoint and
                # keeps none.
                ModelOptions(
                    target_model.n_ctx,
                    options.draft_threads or options.busy_threads,
                    options.draft_gpu_layers,
                    n_seq=options.parallel,
                ),
                options.verbose,
            )
            check_fit(target_model, draft_model)
    except BaseException:
        # What loaded goes back (a server or a Python caller goes on): the target closes the
        # heads it holds.
        for model in (draft_model, target_model):
            close = getattr(model, "close", None)
            if close is not None:
                close()
        raise
    return Pair(
        target_model,
        draft_model,
        ngram,
        _costs_file(target_model, draft_model, options, draft_path if head_kind else None),
        backend.clock,
        heads=heads,
        busy=backend.busy,
        load_meter=backend.load_meter,
        lookahead=options.lookahead,
        draft_p_min=options.draft_p_min,
        parallel=options.parallel,
        parallel_note=parallel_note,
    )


def _slots(
    options: PairOptions, models: list[tuple[Path, gguf.Header | None]], backend: Backend
) -> tuple[PairOptions, str]:
    """The sequences a context holds where nobody chose (``session.fit.auto_parallel``, at
    most ``options.parallel``), and why: where any model's layers go to a GPU or to workers,
    their memory is not read here."""
    gpu = backend.gpu_offload() and (
        options.target_gpu_layers != 0 or (len(models) > 1 and options.draft_gpu_layers != 0)
    )
    elsewhere = "on workers" if options.workers else "on a GPU" if gpu else ""
    parallel, note = auto_parallel(models, options.n_ctx, elsewhere, options.parallel)
    return replace(options, parallel=parallel), note


def _existing(path: str | Path, role: str) -> Path:
    resolved = Path(path).expanduser()
    if resolved.is_dir():
        raise UserError(f"{role} model {resolved} is a folder: give the path of a .gguf file")
    if not resolved.is_file():
        raise UserError(f"{role} model not found: {resolved} (give the path of a .gguf file)")
    return resolved
