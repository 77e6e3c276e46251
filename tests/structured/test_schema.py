"""JSON Schema read as the field reads it: an object that lists its properties takes no others
unless it says so, and the whitespace between tokens is bounded as llama.cpp's SPACE_RULE
bounds it. The reading on its own, then what the compiled grammar takes on a real vocabulary."""

from __future__ import annotations

import copy
import json

import pytest

from specgen.structured import grammar as G
from tests.structured.test_tools import accepts, vocab  # noqa: F401 - the fixture

# What pydantic writes for a model with a nested model (properties and required, no
# additionalProperties anywhere).
PYDANTIC = {
    "$defs": {
        "City": {
            "properties": {"name": {"title": "Name", "type": "string"}},
            "required": ["name"],
            "title": "City",
            "type": "object",
        }
    },
    "properties": {
        "country": {"title": "Country", "type": "string"},
        "capital": {"$ref": "#/$defs/City"},
    },
    "required": ["country", "capital"],
    "title": "Country",
    "type": "object",
}


def test_an_object_that_lists_its_properties_takes_no_others_unless_it_says_so() -> None:
    before = copy.deepcopy(PYDANTIC)
    closed = G.closed_objects(PYDANTIC)
    assert PYDANTIC == before, "the caller's schema is left as it was"
    assert closed["additionalProperties"] is False
    assert closed["$defs"]["City"]["additionalProperties"] is False
    said = {**PYDANTIC, "additionalProperties": True}
    assert G.closed_objects(said)["additionalProperties"] is True
    typed = {**PYDANTIC, "additionalProperties": {"type": "integer"}}
    assert G.closed_objects(typed)["additionalProperties"] == {"type": "integer"}
    # an object with no properties listed is any object, as in llama.cpp
    assert G.closed_objects({"type": "object"}) == {"type": "object"}
    nested = {"type": "array", "items": {"anyOf": [{"properties": {"a": {}}}, {"type": "null"}]}}
    assert G.closed_objects(nested)["items"]["anyOf"][0]["additionalProperties"] is False


def test_the_members_of_an_all_of_stay_open_so_they_can_be_joined() -> None:
    schema = {
        "$defs": {"Base": {"properties": {"a": {"type": "integer"}}, "required": ["a"]}},
        "allOf": [{"$ref": "#/$defs/Base"}, {"properties": {"b": {"type": "integer"}}}],
    }
    closed = G.closed_objects(schema)
    assert "additionalProperties" not in closed["$defs"]["Base"]
    assert "additionalProperties" not in closed["allOf"][1]
    assert "additionalProperties" not in closed


def test_the_whitespace_bound_is_set_unless_the_schema_sets_its_own() -> None:
    read = json.loads(G.json_schema(PYDANTIC).text)
    assert read["x-guidance"] == {"whitespace_pattern": G.SPACE_PATTERN}
    own = {**PYDANTIC, "x-guidance": {"whitespace_flexible": False}}
    assert json.loads(G.json_schema(own).text)["x-guidance"] == {"whitespace_flexible": False}
    for mode in ({"type": "json_object"}, {"type": "json_schema", "json_schema": {}}):
        found = G.from_response_format(mode)
        assert found is not None and "whitespace_pattern" in found.text


ANSWER = {"country": "France", "capital": {"name": "Paris"}}


def test_a_schema_without_additional_properties_refuses_invented_keys(vocab) -> None:  # noqa: F811
    grammar = G.json_schema(PYDANTIC)
    assert accepts(vocab, grammar, json.dumps(ANSWER))
    invented = {**ANSWER, "language_spoken": "French"}
    assert not accepts(vocab, grammar, json.dumps(invented))
    nested = {**ANSWER, "capital": {"name": "Paris", "population": 2}}
    assert not accepts(vocab, grammar, json.dumps(nested))
    opened = G.json_schema({**PYDANTIC, "additionalProperties": True})
    assert accepts(vocab, opened, json.dumps(invented))


@pytest.mark.parametrize(
    ("text", "taken"),
    [
        ('{"country":"France","capital":{"name":"Paris"}}', True),  # compact
        (json.dumps(ANSWER, indent=2), True),  # a newline and indent
        (json.dumps(ANSWER, indent="\t"), True),
        ('{"country": "France",\n\n  "capital": {"name": "Paris"}}', True),  # two newlines
        ('{"country": "France",\n\n\n"capital": {"name": "Paris"}}', False),  # three
        ('{"country": "France",  "capital": {"name": "Paris"}}', False),  # two spaces
        ('{"country": "France",\n' + " " * 21 + '"capital": {"name": "Paris"}}', False),
        ('{"country": "France", \n"capital": {"name": "Paris"}}', False),  # space, newline
    ],
)
def test_whitespace_is_bounded_as_llama_cpp_bounds_it(vocab, text, taken) -> None:  # noqa: F811
    assert json.loads(text) == ANSWER
    assert accepts(vocab, G.json_schema(PYDANTIC), text) is taken
    assert accepts(vocab, G.any_json_object(), text) is taken
