"""Rendering a prompt with a model's chat template, as the Hub's templates expect."""

from __future__ import annotations

import pytest

from specgen.session.chat import ChatTemplateError, conversation, render_chat

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Gemma-like: BOS written by the template, no system role, a {% break %} and raise_exception.
STRICT = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
    "<start_of_turn>user\n{{ message['content'] }}<end_of_turn>\n"
    "{% if loop.index >= 1 %}{% break %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def test_chatml_with_system() -> None:
    text = render_chat(CHATML, conversation("Hi?", "Be brief."))
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_bos_token_loop_controls_and_generation_prompt() -> None:
    text = render_chat(STRICT, conversation("Hello"), bos_token="<bos>")
    assert text == "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n"


def test_template_refusal_is_a_clear_error() -> None:
    with pytest.raises(ChatTemplateError, match="refused the prompt: no system role"):
        render_chat(STRICT, conversation("Hello", "x"))


def test_missing_or_broken_template() -> None:
    with pytest.raises(ChatTemplateError, match="--raw"):
        render_chat(None, conversation("Hello"))
    with pytest.raises(ChatTemplateError, match="failed to render"):
        render_chat("{% for %}", conversation("Hello"))


def test_strftime_now_is_available() -> None:
    assert render_chat("{{ strftime_now('%Y') }}", conversation("x")).isdigit()
