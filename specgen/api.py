"""The Python API: load a pair once, then generate from Python (whole texts or streams).

    from specgen.api import Specgen

    sg = Specgen(pair="smollm2-135m-demo")            # or target=..., draft=...
    print(sg.generate("Name three colours:", max_tokens=32, temperature=0).text)
    for piece in sg.stream([{"role": "user", "content": "Hi!"}]):
        print(piece, end="")
    print(sg.last.stats.accept_rate)

    many = Specgen(pair="smollm2-135m-demo", parallel=4)  # four sequences at once
    results = many.generate_many(["Hi!", "Name a colour:", "2 + 2 =", "Once"], temperature=0)

The same engine, models and defaults as ``specgen run``, and no terminal code: nothing is
printed, errors are raised (``specgen.errors``), and the caller decides what to show.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from specgen.core.penalties import REQUEST_FIELDS, penalties_from
from specgen.core.penalties import Penalties as Penalties  # Settings(penalties=...)
from specgen.core.sampling import DEFAULT_SAMPLING
from specgen.engine import GenerationConfig, SpeculativeEngine, TextChunk
from specgen.errors import UsageError
from specgen.lookahead import Lookahead
from specgen.session.batch import BatchTally
from specgen.session.fit import AUTO_PARALLEL
from specgen.session.generate import Prompt, Result
from specgen.session.pair import Pair, PairOptions
from specgen.session.parallel import Slots
from specgen.session.prompts import BatchItem
from specgen.stats import Stats
from specgen.structured.grammar import LogitBias, from_request
from specgen.structured.tools import Tool, ToolChoice, ToolPlan, syntax_for

# One generation's settings, the one shape from a request to the engine: the sampling, the
# token limit, stop strings, the seed, a grammar the output must match, the logit bias,
# log-probabilities, and K where a generation asks for another than the pair's.
Settings = GenerationConfig
# ``specgen run``'s defaults.
DEFAULT_SETTINGS = Settings()


class Specgen:
    """A loaded draft/target pair, ready to generate: the one library object that ``specgen
    run``, batches, ``bench`` and ``serve`` all go through. Nothing is printed, unless
    ``progress``; errors are raised (``specgen.errors``).

    Args:
        pair, target, draft: the models (a pair from models.toml, or files and Hub specs);
            ``draft="ngram"`` drafts by prompt lookup alone, ``draft="eagle3:FILE"`` (or
            ``"dflash:FILE"``) with an EAGLE3 or DFlash head.
        lookahead: K (0: the target alone; ``"auto"``: chosen each cycle); None: what bench
            found (where ``from_bench``), else the pair's own, else ``auto``.
        ngram, mtp: prompt lookup beside the draft; the target's own MTP head (None: the pair's).
        n_ctx, threads, gpu_layers: the context and the target's threads and GPU layers;
            ``draft_threads`` and ``draft_gpu_layers`` the draft's (None: the same).
        busy_threads: the threads a model with a thread setting of 0 loads with where other
            processes keep CPUs busy (``specgen.host.machine.threads_for_now``; 0: llama.cpp's
            default); what bench and ``-k auto`` remember is kept under the setting still.
        draft_p_min: the draft model's floor on q: a guess below it ends the draft.
        chat: chat template or raw text for a text prompt (None: the pair's, else the GGUF's).
        from_bench: take K (and the way of drafting) from what ``specgen bench`` found best for
            these models here, at the default temperature (True) or at this one (a float),
            unless ``lookahead``, ``ngram`` or ``draft="ngram"`` says otherwise; ``self.note``
            says where K came from (with ``explain_alone``, also that a target with nothing to
            draft runs alone).
        keep_draft: load the draft model even at K=0 (bench runs every K on one pair).
        snapshots: a recurrent target's snapshots (None: what its K needs).
        rpc, rpc_local_head: put the target's layers on `specgen worker`s (``"host:port,..."``);
            a worker that dies mid-generation ends the process with one line (ggml aborts).
        lookup_cache: prompt lookup keeps what earlier generations read and wrote for guesses
            across requests (False: not; a path: kept in that file between processes, and
            ``self.pair.notes`` says when it could not be read).
        parallel: sequences generating at once (``generate_many``, batches, the server):
            each model's context holds that many, each of ``n_ctx`` tokens. None: as many as
            ``specgen bench --streams`` found best for these models here, else 1; ``"auto"``
            (what ``serve`` and ``run -f`` take): that, else llama-server's 4 slots where their
            contexts fit in the memory free, fewer where not, and 1 for a recurrent target or
            models off this CPU (``note`` says which, ``self.parallel`` what was taken).
        prompts: how many prompts will be run at most (a file's): a count that nobody chose
            (None or ``"auto"``) is no more than that (and at least 1), since a sequence that
            never generates holds its contexts' memory all the same.
        progress: show download and conversion progress on stderr.
    """

    def __init__(
        self,
        pair: str | None = None,
        target: str | Path | None = None,
        draft: str | Path | None = None,
        *,
        lookahead: Lookahead | None = None,
        ngram: bool | None = None,
        mtp: bool | None = None,
        n_ctx: int = 0,
        threads: int = 0,
        gpu_layers: int = -1,
        draft_threads: int | None = None,
        busy_threads: int = 0,
        draft_gpu_layers: int | None = None,
        draft_p_min: float = 0.0,
        chat: bool | None = None,
        verbose: bool = False,
        progress: bool = False,
        from_bench: bool | float = False,
        explain_alone: bool = False,
        keep_draft: bool = False,
        snapshots: int | None = None,
        rpc: str | None = None,
        rpc_local_head: bool = True,
        lookup_cache: bool | str | Path = True,
        parallel: int | Literal["auto"] | None = 1,
        prompts: int | None = None,
    ) -> None:
        from specgen.session import memo
        from specgen.session.decide import decide
        from specgen.session.pair import open_pair

        if from_bench is False:
            bench_temperature = None
        else:
            bench_temperature = DEFAULT_SAMPLING.temperature if from_bench is True else from_bench
        decision = decide(
            pair,
            None if target is None else str(target),
            None if draft is None else str(draft),
            ngram=ngram,
            mtp=mtp,
            lookahead=lookahead,
            rpc=rpc,
            threads=threads,
            gpu_layers=gpu_layers,
            bench_temperature=bench_temperature,
            explain_alone=explain_alone,
            keep_draft=keep_draft,
        )
        note = decision.note
        auto = False
        if isinstance(parallel, int) and not isinstance(parallel, bool):
            slots = parallel
        elif parallel is None or parallel == "auto":  # what bench --streams found best here
            recalled = memo.recall_parallel(decision.memo)
            auto = parallel == "auto" and recalled is None  # the pair chooses as it loads
            # (An automatic count: at most AUTO_PARALLEL, and the prompts to run.)
            slots = AUTO_PARALLEL if auto else 1
            if recalled is not None:
                slots, said = recalled
                note = f"{note}; {said}" if note else said
            if prompts is not None and slots > max(1, prompts):
                slots = max(1, prompts)
                auto = auto and prompts > 0  # none to run: nothing to choose
                if not auto:
                    said = "no prompt to run"
                    if prompts:
                        said = f"{slots} for the {_prompts(prompts)} to run"
                    note = f"{note}; {said}" if note else said
        else:
            raise UsageError(f'parallel is a number or "auto", not {parallel!r}')
        options = PairOptions(
            n_ctx=n_ctx,
            target_threads=threads,
            draft_threads=threads if draft_threads is None else draft_threads,
            target_gpu_layers=gpu_layers,
            draft_gpu_layers=gpu_layers if draft_gpu_layers is None else draft_gpu_layers,
            verbose=verbose,
            local_head=rpc_local_head,
            lookup_cache=lookup_cache is not False,
            lookup_file=None if isinstance(lookup_cache, bool) else Path(lookup_cache),
            draft_p_min=draft_p_min,
            parallel=slots,
            parallel_auto=auto,
            busy_threads=busy_threads,
        )
        if slots < 1:
            raise UsageError("parallel must be at least 1")
        self.decision = decision
        self.choice = decision.choice
        self.pair: Pair = open_pair(decision, options, progress=progress, snapshots=snapshots)
        said = self.pair.parallel_note
        self.note = f"{note}; {said}" if note and said else note or said
        self.parallel = self.pair.parallel
        self.target_path = self.pair.target.path
        self.draft_path = self.pair.draft.path if self.pair.draft else None
        self._chat = chat
        self.last: Result | None = None

    @property
    def lookahead(self) -> Lookahead:
        """K for every generation that does not ask for another (the loaded pair's)."""
        return self.pair.lookahead

    @property
    def draft_p_min(self) -> float:
        return self.pair.draft_p_min

    @property
    def name(self) -> str:
        return self.decision.name or self.target_path.name

    def wants_chat(self, prompt: Prompt, system: str | None = None) -> bool:
        """Whether a prompt is rendered with the chat template (messages always are)."""
        from specgen.session.generate import wants_chat

        if not isinstance(prompt, str):
            return True
        return wants_chat(self.pair, self.choice.chat, self._chat, system)

    def stream_events(
        self,
        prompt: Prompt,
        settings: Settings = DEFAULT_SETTINGS,
        *,
        system: str | None = None,
        reuse_prefix: bool = False,
        cancelled: Callable[[], bool] | None = None,
        chat: bool | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
        stats: Stats | None = None,
        engine: SpeculativeEngine | None = None,
    ) -> Iterator[TextChunk | Result]:
        """Text pieces (``TextChunk``) as they are accepted, then the ``Result``; ``tools``
        (OpenAI's shape) go to the chat template (``tool_plan`` says which, and how the
        answer reads); ``stats``: this object's ``new_stats(settings)``, to watch live;
        ``engine``: one of ``slots()``'s (default the pair's one)."""
        from specgen.session.generate import stream

        use_chat = self.wants_chat(prompt, system) if chat is None else chat
        for item in stream(
            self.pair,
            prompt,
            settings,
            chat=use_chat,
            system=system,
            stats=stats,
            reuse_prefix=reuse_prefix,
            cancelled=cancelled,
            tools=tools,
            engine=engine,
        ):
            if isinstance(item, Result):
                self.last = item
            yield item

    def new_stats(self, settings: Settings = DEFAULT_SETTINGS) -> Stats:
        """Empty statistics for one generation with ``settings`` (for a live view to watch)."""
        return self.pair.engine().new_stats(settings)

    def run(
        self,
        prompt: Prompt,
        settings: Settings = DEFAULT_SETTINGS,
        *,
        system: str | None = None,
        chat: bool | None = None,
        stats: Stats | None = None,
        on_text: Callable[[str], None] | None = None,
    ) -> Result:
        """One whole generation, ``on_text`` getting each piece as it is accepted; Ctrl-C ends
        it with the text so far (``Result.interrupted``) instead of raising."""
        from specgen.session.generate import generate

        use_chat = self.wants_chat(prompt, system) if chat is None else chat
        result = generate(
            self.pair, prompt, settings, chat=use_chat, system=system, stats=stats, on_text=on_text
        )
        self.last = result
        return result

    def batch(
        self,
        items: Iterable[BatchItem],
        settings: Settings,
        *,
        write: Callable[[dict[str, object]], None],
        system: str | None = None,
        chat: bool | None = None,
        skip: AbstractSet[str] = frozenset(),
        on_progress: Callable[[BatchTally], None] | None = None,
        total: int = 0,
    ) -> BatchTally:
        """Every item of a batch, one record each to ``write`` as it finishes
        (``specgen.session.batch``); ``settings`` are each item's defaults."""
        from specgen.session.batch import run_batch

        use_chat = self.wants_chat("", system) if chat is None else chat
        return run_batch(
            self.pair,
            items,
            settings,
            chat=use_chat,
            system=system,
            write=write,
            skip=skip,
            on_progress=on_progress,
            total=total,
        )

    def slots(self) -> Slots:
        """The pair's ``parallel`` slots, for a caller that drives generations side by side
        itself (the server): ``specgen.session.parallel``."""
        return Slots(self.pair)

    def generate_many(
        self,
        prompts: Sequence[Prompt],
        *,
        system: str | None = None,
        chat: bool | None = None,
        **settings: Any,
    ) -> list[Result]:
        """Every prompt's whole generation, up to ``parallel`` at once (one batched target
        pass per cycle for all of them); the results in the prompts' order. Each output is
        what the prompt alone would give (greedy: the same tokens). ``settings`` as
        ``generate``'s."""
        from specgen.session.generate import stream

        config = _settings(settings)
        slots = Slots(self.pair)
        results: dict[int, Result] = {}

        def work(at: int, prompt: Prompt) -> Callable[[SpeculativeEngine], None]:
            use_chat = self.wants_chat(prompt, system) if chat is None else chat

            def run(engine: SpeculativeEngine) -> None:
                for item in stream(
                    self.pair, prompt, config, chat=use_chat, system=system, engine=engine
                ):
                    if isinstance(item, Result):
                        results[at] = item

            return run

        try:
            slots.run(work(at, prompt) for at, prompt in enumerate(prompts))
        finally:
            slots.close()
            self.pair.remember_costs()
        return [results[i] for i in range(len(prompts))]

    def tool_plan(
        self, tools: Sequence[Tool], choice: ToolChoice, parallel: bool = True
    ) -> ToolPlan:
        """How this target calls ``tools``: the syntax its chat template teaches, with the
        markers its vocabulary holds as special tokens (``specgen.structured.tools``)."""
        from specgen.session.generate import special_tokens

        syntax = syntax_for(self.pair.target.chat_template())
        markers = special_tokens(self.pair.target, syntax.markers) if tools else {}
        return ToolPlan(syntax, tuple(tools), choice, parallel, markers)

    def stream(
        self, prompt: Prompt, *, system: str | None = None, **settings: Any
    ) -> Iterator[str]:
        """The text as it is accepted, piece by piece; the whole ``Result`` is ``self.last``
        afterwards. ``settings`` are ``Settings`` fields (max_tokens, temperature, ...)."""
        for item in self.stream_events(prompt, _settings(settings), system=system):
            if not isinstance(item, Result):
                yield item.text

    def generate(self, prompt: Prompt, *, system: str | None = None, **settings: Any) -> Result:
        """The whole generation: its text and statistics."""
        for _ in self.stream(prompt, system=system, **settings):
            pass
        assert self.last is not None
        return self.last


CONSTRAINTS = ("json_schema", "grammar", "format", "response_format")
SAMPLING = ("temperature", "top_k", "top_p", "min_p")


def _prompts(n: int) -> str:
    return "1 prompt" if n == 1 else f"{n} prompts"


def _settings(given: dict[str, Any]) -> Settings:
    """``Settings`` from keyword arguments: ``temperature``, ``top_k``, ``top_p``, ``min_p``
    (the rest as ``run``'s defaults), ``max_tokens``, ``seed``, ``stop`` (one text or
    several), ``logit_bias`` (a mapping), ``logprobs``, ``lookahead``, ``coupling``,
    ``repeat_penalty``, ``frequency_penalty``, ``presence_penalty``, ``repeat_last_n``
    (llama.cpp's, applied to the target's and the draft's rows alike; ``penalties`` all four
    as a ``specgen.core.penalties.Penalties``); the
    output's constraint is ``json_schema`` (a dict or JSON text), ``grammar`` (GBNF),
    ``format="json"`` or ``response_format`` (OpenAI's), at most one."""
    stop = given.get("stop")
    if stop is not None:
        given = {**given, "stop": (stop,) if isinstance(stop, str) else tuple(stop)}
    given = dict(given)
    asked = {k: given.pop(k) for k in CONSTRAINTS if k in given}
    if asked:
        given["grammar"] = from_request(asked)
    sampling = {k: given.pop(k) for k in SAMPLING if k in given}
    if sampling:
        given["sampling"] = replace(DEFAULT_SAMPLING, **sampling)
    bias = given.get("logit_bias")
    if isinstance(bias, dict):
        try:
            given = {**given, "logit_bias": LogitBias.from_mapping(bias)}
        except ValueError as err:
            raise UsageError(str(err)) from err
    asked = {k: given.pop(k) for k in REQUEST_FIELDS if k in given}
    if asked:
        try:
            given["penalties"] = penalties_from(asked, given.get("penalties"))
        except ValueError as err:
            raise UsageError(str(err)) from err
    return Settings(**given)
