"""Generating on a loaded pair: a prompt (a text or chat messages) to tokens, the engine driven
to the end, the result. No terminal code: callers get text as it is accepted and decide how to
show it (``specgen run``'s view, a batch's JSON lines, the server's events).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from specgen.engine import (
    CycleDone,
    Finished,
    GenerationConfig,
    SpeculativeEngine,
    TextChunk,
    TokenLogprob,
)
from specgen.errors import ChatTemplateError, UsageError
from specgen.session.chat import conversation, render_chat
from specgen.session.loaded import LoadedModel
from specgen.session.pair import Pair
from specgen.session.prompts import Message
from specgen.stats import Stats

Prompt = str | Sequence[Message]
SYSTEM_NEEDS_CHAT = (
    "--system needs a chat (a system message only exists in one): drop --raw, or drop --system "
    "and put the instructions in the prompt"
)
NO_TEMPLATE_FOR_SYSTEM = (
    "the target model has no chat template, so no system message: drop --system and put the "
    "instructions in the prompt"
)


def wants_chat(pair: Pair, by_pair: bool | None, flag: bool | None, system: str | None) -> bool:
    """Chat or raw: ``--chat/--raw`` when given; ``--system`` means a chat; else the pair's
    ``chat``; else whether the target's GGUF carries a chat template (as llama-cli does)."""
    if flag is False and system:
        raise UsageError(SYSTEM_NEEDS_CHAT)
    if flag is not None:
        return flag
    if system:
        return True
    if by_pair is not None:
        return by_pair
    return pair.target.chat_template() is not None


def prompt_tokens(
    model: LoadedModel,
    prompt: Prompt,
    chat: bool,
    system: str | None = None,
    tools: Sequence[dict[str, Any]] | None = None,
) -> list[int]:
    """The prompt as the target's tokens: a text, or chat messages rendered with the target's
    chat template (a text too, when ``chat`` is set), with ``tools`` for templates that take
    them."""
    if isinstance(prompt, str) and not chat:
        if system:
            raise UsageError(SYSTEM_NEEDS_CHAT)
        text = prompt
    else:
        if system and not model.chat_template():
            raise ChatTemplateError(NO_TEMPLATE_FOR_SYSTEM)
        messages = conversation(prompt, system) if isinstance(prompt, str) else list(prompt)
        if system and not any(m["role"] == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": system})
        text = render_chat(
            model.chat_template(),
            messages,
            bos_token=model.token_text(model.bos).decode("utf-8", "replace"),
            eos_token=model.token_text(model.eos).decode("utf-8", "replace"),
            tools=tools,
        )
    tokens = model.tokenize(text, add_special=True, parse_special=True)
    # Templates often write the BOS text themselves; tokenizing then adds a second one.
    if len(tokens) >= 2 and tokens[0] == tokens[1] == model.bos and model.adds_bos:
        tokens = tokens[1:]
    if not tokens:
        raise UsageError("the prompt is empty (and the model adds no BOS token): give some text")
    return tokens


@dataclass
class Result:
    """One generation: its text, its statistics, and whether Ctrl-C cut it short."""

    text: str
    stats: Stats
    interrupted: bool = False
    # Each generated token's log-probability (None: not asked for).
    logprobs: list[TokenLogprob] | None = None

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"text": self.text, "stats": self.stats.as_dict()}
        if self.logprobs is not None:
            out["logprobs"] = [found.as_dict() for found in self.logprobs]
        return out


def stream(
    pair: Pair,
    prompt: Prompt,
    config: GenerationConfig,
    *,
    chat: bool = False,
    system: str | None = None,
    stats: Stats | None = None,
    reuse_prefix: bool = False,
    cancelled: Callable[[], bool] | None = None,
    tools: Sequence[dict[str, Any]] | None = None,
    engine: SpeculativeEngine | None = None,
) -> Iterator[TextChunk | Result]:
    """Generate from a prompt on a loaded pair, yielding each piece of text as it is accepted
    (``TextChunk``), then the ``Result``. ``cancelled`` is asked after every cycle: when it
    says so, the generation ends there (stop reason ``cancelled``). ``engine``: one of the
    pair's slots (``session.parallel``; default its one engine). No terminal code."""
    tokens = prompt_tokens(pair.target, prompt, chat, system, tools)
    engine = engine if engine is not None else pair.engine()
    if stats is None:
        stats = engine.new_stats(config)
    pieces: list[str] = []
    found: list[TokenLogprob] = []  # every token's, in order
    pending: list[TokenLogprob] = []  # those of the tokens since the last text
    events = engine.generate(tokens, config, stats, reuse_prefix=reuse_prefix)
    try:
        for event in events:
            if isinstance(event, TextChunk):
                pieces.append(event.text)
                yield TextChunk(event.text, tuple(pending)) if pending else event
                pending.clear()
            elif isinstance(event, Finished):
                break
            else:
                if isinstance(event, CycleDone) and event.logprobs:
                    found.extend(event.logprobs)
                    pending.extend(event.logprobs)
                if cancelled is not None and cancelled():
                    stats.finish("cancelled")
                    break
    finally:
        events.close()
        pair.remember_costs()
    logprobs = None
    if config.logprobs is not None:  # the tokens the text holds (not an end of generation)
        logprobs = found[: stats.n_generated]
    yield Result("".join(pieces), stats, logprobs=logprobs)


def generate(
    pair: Pair,
    prompt: Prompt,
    config: GenerationConfig,
    *,
    chat: bool = False,
    system: str | None = None,
    stats: Stats | None = None,
    on_text: Callable[[str], None] | None = None,
    reuse_prefix: bool = False,
) -> Result:
    """Generate from a prompt on a loaded pair; no terminal code. ``on_text`` gets each piece
    of text as it is accepted; pass ``stats`` to watch the counters live. Ctrl-C ends the
    generation with the text so far (``Result.interrupted``)."""
    if stats is None:
        stats = pair.engine().new_stats(config)
    pieces: list[str] = []
    try:
        for item in stream(
            pair,
            prompt,
            config,
            chat=chat,
            system=system,
            stats=stats,
            reuse_prefix=reuse_prefix,
        ):
            if isinstance(item, Result):
                return item
            pieces.append(item.text)
            if on_text is not None:
                on_text(item.text)
    except KeyboardInterrupt:
        stats.finish("interrupted")
        return Result("".join(pieces), stats, interrupted=True)
    raise AssertionError("stream always ends with a Result")


def special_tokens(model: LoadedModel, texts: Sequence[str]) -> dict[str, int]:
    """Which of ``texts`` the vocabulary holds as one special token (text -> its id): those
    a prompt's text turns into that token only when special tokens are parsed."""
    found = {}
    for text in texts:
        tokens = model.tokenize(text, add_special=False, parse_special=True)
        if len(tokens) == 1 and model.tokenize(text, add_special=False, parse_special=False) != (
            tokens
        ):
            found[text] = tokens[0]
    return found
