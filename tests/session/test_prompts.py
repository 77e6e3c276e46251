"""Prompts as users give them: escapes, trailing newlines, batch files; and fuzzing of the two
parsers that read user files (batch prompts and models.toml): no input makes them crash."""

from __future__ import annotations

import json
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specgen.errors import UserError
from specgen.models.registry import Registry
from specgen.session.prompts import (
    BadLine,
    BatchPrompt,
    combine,
    parse_jsonl,
    parse_lines,
    parse_record,
    strip_final_newline,
    unescape,
)


@pytest.mark.parametrize(
    ("raw", "cooked"),
    [
        (r"a\nb", "a\nb"),
        (r"tab\there", "tab\there"),
        (r"back\\slash", "back\\slash"),
        (r"say \"hi\"", 'say "hi"'),
        (r"it\'s", "it's"),
        (r"\x41\x42", "AB"),
        (r"cr\r", "cr\r"),
        (r"\q stays", r"\q stays"),
        ("trailing\\", "trailing\\"),
        (r"\\n", "\\n"),
    ],
)
def test_escapes_as_llama_cpp_processes_them(raw: str, cooked: str) -> None:
    assert unescape(raw) == cooked


def test_one_trailing_newline_is_dropped() -> None:
    assert strip_final_newline("Name three colours:\n") == "Name three colours:"
    assert strip_final_newline("two\n\n") == "two\n"
    assert strip_final_newline("crlf\r\n") == "crlf"
    assert strip_final_newline("none") == "none"


def test_argument_then_piped_text() -> None:
    assert combine("Summarize:", "the text") == "Summarize:\nthe text"
    assert combine(None, "only piped") == "only piped"
    assert combine("only argument", None) == "only argument"
    assert combine(None, None) is None


def test_each_line_is_a_prompt_with_its_line_number_as_id() -> None:
    items = parse_lines("first\n\n  \nsecond\r\nthird")
    assert [(i.id, i.prompt) for i in items] == [(1, "first"), (4, "second"), (5, "third")]


def test_jsonl_lines_with_settings() -> None:
    text = "\n".join(
        [
            json.dumps(
                {
                    "prompt": "a",
                    "id": "x",
                    "max_tokens": 5,
                    "temperature": 0,
                    "seed": 7,
                    "stop": "\n",
                    "system": "Be brief.",
                    "extra": "ignored",
                }
            ),
            json.dumps({"messages": [{"role": "user", "content": "hi"}]}),
        ]
    )
    first, second = parse_jsonl(text)
    assert isinstance(first, BatchPrompt) and first.id == "x" and first.system == "Be brief."
    assert first.settings == {"max_tokens": 5, "temperature": 0.0, "seed": 7, "stop": ("\n",)}
    assert isinstance(second, BatchPrompt) and second.id == 2
    assert second.messages == ({"role": "user", "content": "hi"},)


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"id": 3}', "exactly one of 'prompt'"),
        ('{"prompt": "a", "messages": []}', "exactly one of 'prompt'"),
        ('{"prompt": "   "}', "non-empty string"),
        ('{"prompt": 5}', "non-empty string"),
        ('{"prompt": "a", "max_tokens": 0}', "max_tokens"),
        ('{"prompt": "a", "max_tokens": true}', "max_tokens"),
        ('{"prompt": "a", "seed": -5}', "seed"),
        ('{"prompt": "a", "seed": 4294967296}', "seed"),
        ('{"prompt": "a", "temperature": -1}', "temperature"),
        ('{"prompt": "a", "temperature": "hot"}', "temperature"),
        ('{"prompt": "a", "stop": [1]}', "stop"),
        ('{"prompt": "a", "system": 3}', "system"),
        ('{"messages": [{"role": "robot", "content": "x"}]}', "role"),
        ('{"prompt": "a", "id": [1]}', "'id'"),
        ('{"prompt": "a", "id": true}', "'id'"),
    ],
)
def test_a_bad_line_is_reported_with_its_number(line: str, needle: str) -> None:
    item = parse_record(line, 12)
    assert isinstance(item, BadLine) and item.line == 12
    assert item.error.startswith("line 12: ") and needle in item.error


def test_a_bad_line_keeps_its_own_id_when_it_has_one() -> None:
    item = parse_record('{"id": "q7", "prompt": ""}', 3)
    assert isinstance(item, BadLine) and item.id == "q7"


# -- fuzzing: whatever the file holds, the parsers answer, never crash ----------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
record_keys = st.sampled_from(
    [
        "prompt",
        "messages",
        "id",
        "system",
        "max_tokens",
        "temperature",
        "seed",
        "stop",
        "role",
        "content",
        "x",
    ]
)


@given(st.text())
def test_fuzz_jsonl_parser_never_crashes_on_text(text: str) -> None:
    """Whatever the text: one item per non-blank line, in order, each knowing its line; a line
    that cannot run says which it is."""
    numbers = [n for n, line in enumerate(text.split("\n"), start=1) if line.strip()]
    for items in (parse_jsonl(text), parse_lines(text)):
        assert [item.line for item in items] == numbers
        for item in items:
            assert not isinstance(item, BadLine) or item.error.startswith(f"line {item.line}: ")


@given(st.dictionaries(record_keys, json_values, max_size=6))
def test_fuzz_jsonl_parser_never_crashes_on_records(record: dict) -> None:
    item = parse_record(json.dumps(record), 7)
    assert item.line == 7
    if isinstance(item, BadLine):
        assert item.error.startswith("line 7: ")
    else:
        assert (item.prompt is None) != (item.messages is None)


def _toml_value(value: object) -> str:
    """A tiny TOML writer for the fuzzer (tomllib only reads)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value) if value == value and abs(value) != float("inf") else "nan"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return (
            "{ " + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
        )
    return '""'


toml_scalars = (
    st.booleans()
    | st.integers(-5, 100)
    | st.text(max_size=12)
    | st.sampled_from(["auto", "ngram", "org/repo", "x.gguf", "F32"])
)
spec_keys = st.sampled_from(["repo", "file", "path", "pip", "quant", "sha256", "revision", "x"])
toml_values = st.recursive(
    toml_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(spec_keys, inner, max_size=4),
    max_leaves=8,
)
pair_tables = st.dictionaries(
    st.sampled_from(
        ["target", "draft", "lookahead", "chat", "ngram", "description", "license", "bogus"]
    ),
    toml_values,
    max_size=6,
)


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=200)
@given(
    st.dictionaries(
        st.text(alphabet=string.ascii_lowercase + "-.", min_size=1, max_size=8),
        pair_tables,
        max_size=3,
    ),
    st.one_of(st.none(), toml_scalars),
)
def test_fuzz_models_toml_only_ever_says_what_is_wrong(pairs: dict, default: object) -> None:
    lines = [] if default is None else [f"default = {_toml_value(default)}"]
    for name, table in pairs.items():
        lines.append(f"[pairs.{json.dumps(name)}]")
        lines += [f"{key} = {_toml_value(value)}" for key, value in table.items()]
    try:
        Registry()._merge("\n".join(lines) + "\n", "fuzz.toml")
    except UserError as err:
        assert str(err).startswith("fuzz.toml")


@given(st.text())
def test_fuzz_models_toml_text(text: str) -> None:
    try:
        Registry()._merge(text, "fuzz.toml")
    except UserError as err:
        assert str(err).startswith("fuzz.toml")
