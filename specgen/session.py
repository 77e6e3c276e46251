"""Loading a target/draft pair and generating on it: the library under the commands.

The glue shared by ``specgen run``, batches and ``specgen bench``: choose and load the models,
build the prompt's tokens (with the chat template when asked), drive the engine, survive Ctrl-C.
No terminal code: callers get text through ``on_text`` and decide how to show it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from specgen import compat, store
from specgen.backend import LlamaModel, ModelOptions, Vocabulary
from specgen.chat import conversation, render_chat
from specgen.drafters import Drafter, HybridDrafter, ModelDrafter, NgramDrafter, make_drafter
from specgen.engine import Finished, GenerationConfig, SpeculativeEngine, TextChunk
from specgen.errors import UsageError, UserError
from specgen.interrupts import interruptible
from specgen.lookahead import DEFAULT_LOOKAHEAD, CostBook, Lookahead, is_lookahead
from specgen.prompts import Message
from specgen.registry import NGRAM, ModelSpec, PairSpec, Registry
from specgen.rpc import parse_endpoints, probe
from specgen.stats import Stats


@dataclass(frozen=True)
class Choice:
    """Which models a command runs, from --pair/--target/--draft and models.toml.

    ``ngram`` drafts by prompt lookup: alone where ``draft`` is None, else beside the draft model.
    """

    target: ModelSpec
    draft: ModelSpec | None
    pair: PairSpec | None
    ngram: bool = False
    workers: tuple[str, ...] = ()  # where the target's layers go (`specgen worker`s)

    @property
    def lookahead(self) -> Lookahead:
        return self.pair.lookahead if self.pair else DEFAULT_LOOKAHEAD

    @property
    def chat(self) -> bool | None:
        """The pair's ``chat`` setting; None: decided by the target's chat template."""
        return self.pair.chat if self.pair else None

    @property
    def drafts(self) -> bool:
        return self.draft is not None or self.ngram


def choose(registry: Registry, pair: str | None, target: str | None, draft: str | None,
           ngram: bool | None = None, rpc: str | None = None) -> Choice:
    """The models a command runs. The rule, as the README states it:

    - ``--pair NAME``, or no model option at all (the default pair): both models of the pair;
    - ``--target``/``--draft`` next to ``--pair`` replace that member of the pair;
    - ``--target`` with no ``--pair``: your target, alone or with your ``--draft``;
    - ``--draft`` with no ``--pair`` and no ``--target``: a usage error (whose target?).

    ``--draft ngram`` drafts by prompt lookup; ``ngram`` (``--ngram/--no-ngram``) adds or
    removes prompt lookup beside a draft model, where None keeps the pair's own setting.
    ``rpc`` (``host:port,...``, or ``none``) names the workers for the target's layers, where
    None keeps the pair's own.
    """
    if draft is not None and target is None and pair is None:
        raise UsageError("--draft needs a target: add --target FILE, or --pair NAME to use "
                         "the draft with that pair's target")
    named = registry.pair(pair) if pair or target is None else None
    target_spec = registry.spec(target) if target else named.target  # type: ignore[union-attr]
    workers = _workers(rpc, named)
    if draft == NGRAM:
        return Choice(target_spec, None, named, ngram=True, workers=workers)
    draft_spec = registry.spec(draft) if draft else (named.draft if named else None)
    by_pair = named.ngram if named else False
    return Choice(target_spec, draft_spec, named, by_pair if ngram is None else ngram, workers)


def _workers(rpc: str | None, pair: PairSpec | None) -> tuple[str, ...]:
    """The workers named, checked before anything is downloaded or loaded: this build has RPC,
    and each worker answers the handshake (ggml would abort the process otherwise)."""
    if rpc is None:
        workers = pair.workers if pair else ()
    elif rpc.strip().lower() == "none":
        workers = ()
    else:
        workers = tuple(str(endpoint) for endpoint in parse_endpoints(rpc))
    if workers:
        from specgen.backend import require_rpc

        require_rpc()
        probe(parse_endpoints(workers))
    return workers


def check_fit(target: Vocabulary, draft: Vocabulary) -> None:
    """Refuse a draft whose vocabulary does not fit the target (result cached per file pair)."""
    stamp = store.path("compat", store.file_key(target.path, draft.path), suffix="")
    if stamp.is_file():
        return
    verdict = compat.check(target, draft)
    if not verdict:
        raise UserError(f"draft {draft.path.name} cannot serve target {target.path.name}: "
                        f"{verdict.reason}; pick a draft from the target's model family")
    store.write_text(stamp, f"{target.path}\n{draft.path}\n")  # read-only: check next time


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


@dataclass
class Pair:
    """Loaded models; ``ngram`` drafts by prompt lookup (alone, or beside the draft model).

    ``costs`` are what ``-k auto`` measured on these models here (seconds per guess, the verify
    pass by length; greedy and sampled apart). They are kept in ``costs_file`` between
    processes, so a new run starts from them instead of spending its first cycles timing.
    """

    target: LlamaModel
    draft: LlamaModel | None
    ngram: bool = False
    costs_file: Path | None = None
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
        save_costs(self.costs_file, self.costs)
        self._saved = self.costs.observations

    def drafter(self, draft_p_min: float = 0.0) -> Drafter | None:
        return make_drafter(self.draft, self.ngram, draft_p_min)

    def engine(self, draft_p_min: float = 0.0) -> SpeculativeEngine:
        """The pair's engine, kept from one generation to the next, so the costs ``-k auto``
        learns carry over (a batch or a server pays the learning once)."""
        if draft_p_min not in self._engines:
            self._engines[draft_p_min] = SpeculativeEngine(
                self.target, self.drafter(draft_p_min), costs=self.costs)
        return self._engines[draft_p_min]


def costs_path(target: LlamaModel, draft: LlamaModel | None, options: PairOptions) -> Path:
    """Where the costs ``-k auto`` measured for these model files on this machine, with these
    threads, GPU layers and workers, are kept."""
    import json

    from specgen.machine import build_id, cpu_flags

    files = [target.path] if draft is None else [target.path, draft.path]
    machine = [cpu_flags(), build_id(), target.n_threads, draft.n_threads if draft else 0,
               options.target_gpu_layers, options.draft_gpu_layers, list(options.workers),
               options.local_head]
    return store.path("costs", store.file_key(*files) + "-"
                      + store.text_key(json.dumps(machine, default=str)))


def load_costs(path: Path | None) -> CostBook:
    """The costs an earlier process kept at ``path`` (none, or unreadable: start afresh)."""
    if path is None:
        return CostBook()
    try:
        return CostBook.restore(store.read_json(path, {}))
    except (ValueError, TypeError, AttributeError):
        return CostBook()


def save_costs(path: Path, costs: CostBook) -> None:
    """Keep ``costs`` at ``path`` (written whole, then renamed: a reader never sees half);
    a read-only cache only means the next process times again."""
    store.write_json(path, costs.snapshot())


def bench_engines(pair: Pair, draft_p_min: float = 0.0) -> dict[str, SpeculativeEngine]:
    """One engine per way of drafting that bench compares, all over the same loaded models:
    ``alone`` (no drafter), ``model`` (fixed K's), ``auto``, ``ngram`` and ``hybrid``."""
    engines = {"alone": SpeculativeEngine(pair.target),
               "ngram": SpeculativeEngine(pair.target, NgramDrafter())}
    if pair.draft is not None:
        model = ModelDrafter(pair.draft, draft_p_min)
        engines["model"] = engines["auto"] = SpeculativeEngine(pair.target, model)
        engines["hybrid"] = SpeculativeEngine(pair.target, HybridDrafter(model))
    return engines


def load_pair(target: str | Path, draft: str | Path | None, options: PairOptions,
              ngram: bool = False) -> Pair:
    """Load both models with the same context size, each with its own threads and GPU layers.

    Loading runs where Ctrl-C ends it at once (``specgen.interrupts``).
    """
    return interruptible(lambda: _load(target, draft, options, ngram), "loading the models")


def _load(target: str | Path, draft: str | Path | None, options: PairOptions,
          ngram: bool) -> Pair:
    target_model = LlamaModel(
        _existing(target, "target"),
        ModelOptions(options.n_ctx, options.target_threads, options.target_gpu_layers,
                     workers=options.workers, local_head=options.local_head),
        verbose=options.verbose,
    )
    if draft is None:
        return Pair(target_model, None, ngram, costs_path(target_model, None, options))
    draft_model = LlamaModel(
        _existing(draft, "draft"),
        ModelOptions(target_model.n_ctx, options.draft_threads, options.draft_gpu_layers),
        verbose=options.verbose,
    )
    check_fit(target_model, draft_model)
    return Pair(target_model, draft_model, ngram, costs_path(target_model, draft_model, options))


def _existing(path: str | Path, role: str) -> Path:
    resolved = Path(path).expanduser()
    if resolved.is_dir():
        raise UserError(f"{role} model {resolved} is a folder: give the path of a .gguf file")
    if not resolved.is_file():
        raise UserError(f"{role} model not found: {resolved} (give the path of a .gguf file)")
    return resolved


Prompt = str | Sequence[Message]


def wants_chat(pair: Pair, by_pair: bool | None, flag: bool | None, system: str | None) -> bool:
    """Chat or raw: ``--chat/--raw`` when given; ``--system`` means a chat; else the pair's
    ``chat``; else whether the target's GGUF carries a chat template (as llama-cli does)."""
    if flag is False and system:
        raise UsageError("--system needs a chat; drop --raw (a system message only exists in "
                         "a chat)")
    if flag is not None:
        return flag
    if system:
        return True
    if by_pair is not None:
        return by_pair
    return pair.target.chat_template() is not None


def prompt_tokens(model: LlamaModel, prompt: Prompt, chat: bool, system: str | None = None
                  ) -> list[int]:
    """The prompt as the target's tokens: a text, or chat messages rendered with the target's
    chat template (a text too, when ``chat`` is set)."""
    if isinstance(prompt, str) and not chat:
        if system:
            raise UsageError("--system needs a chat; drop --raw")
        text = prompt
    else:
        messages = conversation(prompt, system) if isinstance(prompt, str) else list(prompt)
        if system and not any(m["role"] == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": system})
        text = render_chat(model.chat_template(), messages,
                           bos_token=model.token_text(model.bos).decode("utf-8", "replace"),
                           eos_token=model.token_text(model.eos).decode("utf-8", "replace"))
    tokens = model.tokenize(text, add_special=True, parse_special=True)
    # Templates often write the BOS text themselves; tokenizing then adds a second one.
    if len(tokens) >= 2 and tokens[0] == tokens[1] == model.bos and model.adds_bos:
        tokens = tokens[1:]
    return tokens


@dataclass
class Result:
    """One generation: its text, its statistics, and whether Ctrl-C cut it short."""

    text: str
    stats: Stats
    interrupted: bool = False

    def as_dict(self) -> dict[str, object]:
        return {"text": self.text, "stats": self.stats.as_dict()}


def stream(
    pair: Pair, prompt: Prompt, config: GenerationConfig, *, chat: bool = False,
    system: str | None = None, draft_p_min: float = 0.0, stats: Stats | None = None,
    reuse_prefix: bool = False, cancelled: Callable[[], bool] | None = None,
) -> Iterator[TextChunk | Result]:
    """Generate from a prompt on a loaded pair, yielding each piece of text as it is accepted
    (``TextChunk``), then the ``Result``. ``cancelled`` is asked after every cycle: when it
    says so, the generation ends there (stop reason ``cancelled``). No terminal code."""
    tokens = prompt_tokens(pair.target, prompt, chat, system)
    engine = pair.engine(draft_p_min)
    if stats is None:
        stats = new_stats(pair, config, draft_p_min)
    pieces: list[str] = []
    events = engine.generate(tokens, config, stats, reuse_prefix=reuse_prefix)
    try:
        for event in events:
            if isinstance(event, TextChunk):
                pieces.append(event.text)
                yield event
            elif isinstance(event, Finished):
                break
            elif cancelled is not None and cancelled():
                stats.finish("cancelled")
                break
    finally:
        events.close()
        pair.remember_costs()
    yield Result("".join(pieces), stats)


def generate(
    pair: Pair, prompt: Prompt, config: GenerationConfig, *, chat: bool = False,
    system: str | None = None, draft_p_min: float = 0.0, stats: Stats | None = None,
    on_text: Callable[[str], None] | None = None, reuse_prefix: bool = False,
) -> Result:
    """Generate from a prompt on a loaded pair; no terminal code. ``on_text`` gets each piece
    of text as it is accepted; pass ``stats`` to watch the counters live. Ctrl-C ends the
    generation with the text so far (``Result.interrupted``)."""
    if stats is None:
        stats = new_stats(pair, config, draft_p_min)
    pieces: list[str] = []
    try:
        for item in stream(pair, prompt, config, chat=chat, system=system,
                           draft_p_min=draft_p_min, stats=stats, reuse_prefix=reuse_prefix):
            if isinstance(item, Result):
                return item
            pieces.append(item.text)
            if on_text is not None:
                on_text(item.text)
    except KeyboardInterrupt:
        stats.finish("interrupted")
        return Result("".join(pieces), stats, interrupted=True)
    raise AssertionError("stream always ends with a Result")


def new_stats(pair: Pair, config: GenerationConfig, draft_p_min: float = 0.0) -> Stats:
    """Empty statistics for a generation with this config (for a live view to watch)."""
    speculative = pair.engine(draft_p_min).drafter is not None
    return Stats(lookahead=config.lookahead if speculative else 0, seed=config.seed or 0,
                 speculative=speculative)


def bench_memo(choice: Choice, threads: int, gpu_layers: int) -> Path:
    """Where ``specgen bench`` keeps, and ``specgen run`` finds, what was measured for these
    models on this machine with these threads and GPU layers."""
    import os
    import platform

    from specgen.bench import memo_path
    from specgen.machine import build_id, cpu_flags, default_threads

    models = [choice.target.label(), choice.draft.label() if choice.draft else "-"]
    machine = {"cpu": platform.processor() or platform.machine(), "flags": cpu_flags(),
               "logical_cpus": os.cpu_count(), "build": build_id(),
               "threads": threads or default_threads(), "gpu_layers": gpu_layers}
    if choice.workers:  # a verify over the network costs otherwise: K is measured apart
        machine["workers"] = list(choice.workers)
    return memo_path(models, machine)


def from_bench(choice: Choice, threads: int, gpu_layers: int, temperature: float
               ) -> tuple[Choice, Lookahead | None, str]:
    """What `specgen bench` found best for these models on this machine at this kind of
    sampling, if it ran here: the choice to use, its K (None: bench never ran) and a note
    that says where the K came from."""
    from dataclasses import replace

    from specgen.bench import recall, variant_name

    if not choice.drafts:
        return choice, None, ""
    found = recall(bench_memo(choice, threads, gpu_layers), temperature)
    if found is None:
        return choice, None, ""
    variant = found["variant"]
    if variant == "ngram":
        choice, k = replace(choice, draft=None, ngram=True), "auto"
    elif variant == "hybrid":
        choice, k = replace(choice, ngram=True), "auto"
    elif is_lookahead(variant):
        choice, k = replace(choice, ngram=False), variant
    else:
        return choice, None, ""
    name = variant_name(variant)
    note = (f"{name}: what `specgen bench` found best here ({found.get('date')}, "
            f"{float(found.get('speedup', 1.0)):.2f}x at T={found.get('temperature')}); "
            f"-k to choose another")
    return choice, k, note
