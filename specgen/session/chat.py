"""Wrapping a prompt in the target's own chat template (the GGUF's ``tokenizer.chat_template``).

Templates are Jinja, as on the Hub; they are rendered in a sandbox with the helpers that
Hugging Face's tokenizers provide (``raise_exception``, ``strftime_now``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from specgen.errors import ChatTemplateError


def _raise(message: str) -> None:
    raise ChatTemplateError(f"the model's chat template refused the prompt: {message}")


def conversation(user: str, system: str | None = None) -> list[dict[str, str]]:
    """A one-turn conversation: an optional system message, then the user's."""
    messages = [{"role": "system", "content": system}] if system else []
    return [*messages, {"role": "user", "content": user}]


def _tojson(
    value: Any,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
    ensure_ascii: bool = False,
) -> str:
    """Hugging Face's ``tojson``: plain JSON (Jinja's own escapes ``<``, ``>`` and ``&``,
    which tool schemas in a prompt must not have)."""
    return json.dumps(
        value, indent=indent, separators=separators, sort_keys=sort_keys, ensure_ascii=ensure_ascii
    )


def render_chat(
    template: str | None,
    messages: Sequence[Mapping[str, Any]],
    bos_token: str = "",
    eos_token: str = "",
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> str:
    """The text of a conversation, ending where the assistant's next answer begins; ``tools``
    (OpenAI's shape) are given to templates that take them."""
    if not template:
        raise ChatTemplateError(
            "the target model has no chat template; run with --raw to send the prompt as it is"
        )
    # The same environment as transformers' apply_chat_template: templates on the Hub rely on
    # trim_blocks, lstrip_blocks and {% break %} / {% continue %}.
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.filters["tojson"] = _tojson
    extra = {"tools": list(tools)} if tools else {}
    try:
        return env.from_string(template).render(
            messages=[dict(m) for m in messages],
            add_generation_prompt=True,
            bos_token=bos_token,
            eos_token=eos_token,
            **extra,
        )
    except jinja2.TemplateError as err:
        raise ChatTemplateError(f"the model's chat template failed to render: {err}") from err
