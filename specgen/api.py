"""The Python API: load a pair once, then generate from Python (whole texts or streams).

    from specgen.api import Specgen

    sg = Specgen(pair="smollm2-135m-demo")            # or target=..., draft=...
    print(sg.generate("Name three colours:", max_tokens=32, temperature=0).text)
    for piece in sg.stream([{"role": "user", "content": "Hi!"}]):
        print(piece, end="")
    print(sg.last.stats.accept_rate)

The same engine, models and defaults as ``specgen run``, and no terminal code: nothing is
printed, errors are raised (``specgen.errors``), and the caller decides what to show.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specgen.core.sampling import DEFAULT_SAMPLING, SamplingParams
from specgen.engine import DEFAULT_MAX_TOKENS, GenerationConfig, TextChunk
from specgen.errors import UsageError
from specgen.lookahead import Lookahead
from specgen.session.generate import Prompt, Result
from specgen.session.pair import Pair, PairOptions
from specgen.structured.grammar import Grammar, LogitBias, from_request
from specgen.structured.tools import Plan, Tool, ToolChoice, syntax_for


@dataclass(frozen=True)
class Settings:
    """One request's generation settings (``specgen run``'s defaults)."""

    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = DEFAULT_SAMPLING.temperature
    top_k: int = DEFAULT_SAMPLING.top_k
    top_p: float = DEFAULT_SAMPLING.top_p
    min_p: float = DEFAULT_SAMPLING.min_p
    seed: int | None = None
    stop: tuple[str, ...] = ()
    constraint: Grammar | None = None  # what the output must match (``specgen.structured.grammar``)
    logit_bias: LogitBias | None = None  # added to the target's logits and the draft's
    logprobs: int | None = None  # each token's log-probability, with this many alternatives
    keep_text: tuple[tuple[int, bytes], ...] = ()  # special tokens printed as their text

    def config(self, lookahead: Lookahead) -> GenerationConfig:
        sampling = SamplingParams(self.temperature, self.top_k, self.top_p, self.min_p)
        return GenerationConfig(
            lookahead=lookahead,
            sampling=sampling,
            max_tokens=self.max_tokens,
            stop=self.stop,
            seed=self.seed,
            grammar=self.constraint,
            logit_bias=self.logit_bias,
            logprobs=self.logprobs,
            keep_text=self.keep_text,
        )


class Specgen:
    """A loaded draft/target pair, ready to generate; one generation at a time.

    ``progress`` shows download and conversion progress on stderr (the CLI's ``serve`` does);
    otherwise nothing is printed. ``from_bench`` takes K (and the way of drafting) from what
    ``specgen bench`` found best for these models on this machine at sampling temperatures,
    unless ``lookahead``, ``ngram`` or ``draft="ngram"`` says otherwise (``self.note`` says
    so). ``rpc`` (``"host:port,..."``) puts the target's layers on `specgen worker`s; a worker
    that dies mid-generation ends the process with one line (ggml aborts; nothing can be
    caught). ``lookup_cache``: prompt lookup keeps what earlier generations read and wrote for
    guesses across requests (False: not; a path: kept in that file between processes, and
    ``self.pair.notes`` says when it could not be read)."""

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
        draft_p_min: float = 0.0,
        chat: bool | None = None,
        verbose: bool = False,
        progress: bool = False,
        from_bench: bool = False,
        rpc: str | None = None,
        rpc_local_head: bool = True,
        lookup_cache: bool | str | Path = True,
    ) -> None:
        from specgen.session.decide import decide
        from specgen.session.pair import open_pair

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
            bench_temperature=Settings.temperature if from_bench else None,
        )
        options = replace(
            PairOptions.for_both(n_ctx, threads, gpu_layers, verbose, rpc_local_head),
            lookup_cache=lookup_cache is not False,
            lookup_file=None if isinstance(lookup_cache, bool) else Path(lookup_cache),
        )
        self.decision = decision
        self.choice = decision.choice
        self.note = decision.note
        self.pair: Pair = open_pair(decision, options, progress=progress)
        self.lookahead: Lookahead = decision.lookahead
        self.draft_p_min = draft_p_min
        self.target_path = self.pair.target.path
        self.draft_path = self.pair.draft.path if self.pair.draft else None
        self._chat = chat
        self.last: Result | None = None

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
        settings: Settings = Settings(),
        *,
        system: str | None = None,
        reuse_prefix: bool = False,
        cancelled: Callable[[], bool] | None = None,
        chat: bool | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> Iterator[TextChunk | Result]:
        """Text pieces (``TextChunk``) as they are accepted, then the ``Result``; ``tools``
        (OpenAI's shape) go to the chat template (``tool_plan`` says which, and how the
        answer reads)."""
        from specgen.session.generate import stream

        use_chat = self.wants_chat(prompt, system) if chat is None else chat
        for item in stream(
            self.pair,
            prompt,
            settings.config(self.lookahead),
            chat=use_chat,
            system=system,
            draft_p_min=self.draft_p_min,
            reuse_prefix=reuse_prefix,
            cancelled=cancelled,
            tools=tools,
        ):
            if isinstance(item, Result):
                self.last = item
            yield item

    def tool_plan(self, tools: Sequence[Tool], choice: ToolChoice, parallel: bool = True) -> Plan:
        """How this target calls ``tools``: the syntax its chat template teaches, with the
        markers its vocabulary holds as special tokens (``specgen.structured.tools``)."""
        from specgen.session.generate import special_tokens

        syntax = syntax_for(self.pair.target.chat_template())
        markers = special_tokens(self.pair.target, syntax.markers) if tools else {}
        return Plan(syntax, tuple(tools), choice, parallel, markers)

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


def _settings(given: dict[str, Any]) -> Settings:
    """``Settings`` from keyword arguments; ``stop`` may be one text or several; the output's
    constraint is ``json_schema`` (a dict or JSON text), ``grammar`` (GBNF), ``format="json"``
    or ``response_format`` (OpenAI's), at most one."""
    stop = given.get("stop")
    if stop is not None:
        given = {**given, "stop": (stop,) if isinstance(stop, str) else tuple(stop)}
    asked = {k: given.pop(k) for k in CONSTRAINTS if k in given}
    if asked:
        given = {**given, "constraint": from_request(asked)}
    bias = given.get("logit_bias")
    if isinstance(bias, dict):
        try:
            given = {**given, "logit_bias": LogitBias.from_mapping(bias)}
        except ValueError as err:
            raise UsageError(str(err)) from err
    return replace(Settings(), **given)
