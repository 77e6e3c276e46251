"""Structured output: what a generation must match (a JSON Schema, a GBNF or Lark grammar, any
JSON object), the matcher that says which tokens may come next, and a logit bias.

The grammar engine is llguidance (the PyPI wheel; the engine llama.cpp itself can use): it
builds its tokenizer from the model's own vocabulary (``backend.grammar``), compiles JSON Schema,
GBNF (converted to Lark), Lark and regexes, computes a token mask in tens of microseconds on a
262k vocabulary, checks how much of a draft is valid without changing its state, says which
tokens the grammar forces, and never throws or aborts on a token it rejects (it enters an error
state, which specgen never lets it reach: only validated tokens are consumed). llama.cpp's own
GBNF sampler through ctypes aborts the process when a token it rejects is accepted, or when an
end of generation comes early, so it is never used.

A JSON Schema is read as the field reads it (``conventional``): an object that lists
``properties`` and says nothing of ``additionalProperties`` takes no other keys, as llama.cpp's
converter (``common/json-schema.cpp``), OpenAI's strict mode and XGrammar read it (llguidance
alone would leave it open); and the whitespace between tokens is bounded as llama.cpp's
``SPACE_RULE`` bounds it. Left open, a small model fills its answer with keys and blank lines it
invents until ``max_tokens``.

Pure of llama.cpp: ``Matcher`` takes the tokenizer the backend built.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from specgen.errors import UsageError

Kind = Literal["json_schema", "gbnf", "lark", "regex"]
# Ollama's ``format: "json"``: any JSON object.
ANY_JSON_OBJECT: dict[str, Any] = {"type": "object"}
# llama.cpp's SPACE_RULE (common/json-schema-to-grammar.cpp): between two JSON tokens nothing,
# one space, or one or two newlines and up to 20 spaces or tabs of indent. llguidance matches
# it at most once where JSON allows whitespace (its default is any run of it).
SPACE_PATTERN = r"(?: |\n{1,2}[ \t]{0,20})"


@dataclass(frozen=True)
class Grammar:
    """What a generation must match: ``kind`` and its source text."""

    kind: Kind
    text: str

    def compiled(self) -> str:
        """The grammar as llguidance takes it; UsageError (one line) where it is invalid."""
        return _compile(self.kind, self.text)


@functools.lru_cache(maxsize=64)
def _compile(kind: Kind, text: str) -> str:
    from llguidance import LLMatcher, grammar_from

    what = "JSON schema" if kind == "json_schema" else "regex" if kind == "regex" else "grammar"
    try:
        if kind == "json_schema":
            compiled = LLMatcher.grammar_from_json_schema(text)
        else:
            compiled = grammar_from(kind, text)
    except (ValueError, TypeError) as err:
        raise UsageError(f"invalid {what}: {_first_line(err)}") from err
    problem = LLMatcher.validate_grammar(compiled)
    if problem:
        raise UsageError(f"invalid {what}: {_first_line(problem)}")
    return compiled


def checked(found: Grammar | None) -> Grammar | None:
    """``found``, compiled once, so an invalid schema or grammar is said before anything runs."""
    if found is not None:
        found.compiled()
    return found


def json_schema(value: str | dict[str, Any], files: bool = True) -> Grammar:
    """A JSON Schema given as a dict, JSON text, or (``files``) the path of a file holding it,
    read as the field's conventions read it (``conventional``)."""
    if isinstance(value, dict):
        return Grammar("json_schema", json.dumps(conventional(value)))
    text = _text_or_file(value, "JSON schema") if files else value
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(
            f"invalid JSON schema: not JSON ({err.msg} at line {err.lineno} column {err.colno})"
        ) from err
    if not isinstance(schema, dict):
        raise UsageError("invalid JSON schema: a schema is a JSON object ({...})")
    return Grammar("json_schema", json.dumps(conventional(schema)))


def conventional(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` as llama.cpp, OpenAI's strict mode and XGrammar read it: objects closed
    (``closed_objects``) and, unless its top-level ``x-guidance`` says otherwise, whitespace
    bounded by ``SPACE_PATTERN``."""
    out = closed_objects(schema)
    if isinstance(out, dict) and "x-guidance" not in out:
        out = {**out, "x-guidance": {"whitespace_pattern": SPACE_PATTERN}}
    return out


# Keywords whose value is one schema, a list of schemas, or a map of names to schemas.
_ONE = (
    "items",
    "additionalItems",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
    "additionalProperties",
)
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def closed_objects(schema: Any) -> Any:
    """A copy of ``schema`` where every object schema that lists ``properties`` and says
    nothing of ``additionalProperties`` takes no other keys (``"additionalProperties": false``,
    llama.cpp's ``common/json-schema.cpp`` reading); ``true`` or a schema keeps it open, and an
    object without ``properties`` (``{"type": "object"}``) stays any object. A member of an
    ``allOf`` (or a definition only reached as one) is left open: closed, it would refuse the
    other members' keys, as it would in an object that lists both ``properties`` and an
    ``allOf`` (JSON Schema's ``additionalProperties`` sees only its own siblings)."""
    in_all_of = _refs_in_all_of(schema)

    def walk(node: Any, member: bool = False, path: str = "#") -> Any:
        if isinstance(node, list):
            return [walk(item) for item in node]
        if not isinstance(node, dict):
            return node
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in _MAP and isinstance(value, dict):
                out[key] = {
                    name: walk(sub, path=f"{path}/{key}/{name}") for name, sub in value.items()
                }
            elif key in _LIST and isinstance(value, list):
                out[key] = [
                    walk(sub, key == "allOf", f"{path}/{key}/{i}") for i, sub in enumerate(value)
                ]
            elif key in _ONE:
                out[key] = walk(value, path=f"{path}/{key}")
            else:
                out[key] = value
        open_by_default = member or path in in_all_of or "allOf" in out
        if "properties" in out and "additionalProperties" not in out and not open_by_default:
            out["additionalProperties"] = False
        return out

    return walk(schema)


def _refs_in_all_of(schema: Any) -> set[str]:
    """The local ``$ref``s that some ``allOf`` lists as a member (``#/$defs/Base``, ...)."""
    found: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, list):
            for item in node:
                visit(item)
        elif isinstance(node, dict):
            for member in node.get("allOf") or ():
                if isinstance(member, dict) and isinstance(member.get("$ref"), str):
                    found.add(member["$ref"])
            for value in node.values():
                visit(value)

    visit(schema)
    return found


def gbnf(value: str, files: bool = True) -> Grammar:
    """A grammar in llama.cpp's GBNF (or Lark, which llguidance also reads), as text or file."""
    return Grammar("gbnf", _text_or_file(value, "grammar") if files else value)


def any_json_object() -> Grammar:
    """Any JSON object (JSON mode), its whitespace bounded as a schema's is."""
    return Grammar("json_schema", json.dumps(conventional(ANY_JSON_OBJECT)))


def from_options(
    schema: str | dict[str, Any] | None = None,
    grammar: str | None = None,
    format: str | None = None,
    files: bool = True,
) -> Grammar | None:
    """The one constraint the options ask for (at most one of them), compiled once to say an
    invalid one before anything runs, or None. ``files``: a value may name a file (the CLI)."""
    given = [
        n for n, v in (("a JSON schema", schema), ("a grammar", grammar), ("a format", format)) if v
    ]
    if len(given) > 1:
        raise UsageError(
            f"give one of a JSON schema, a grammar and a format, not {' and '.join(given)}"
        )
    if schema:
        return checked(json_schema(schema, files))
    if grammar:
        return checked(gbnf(grammar, files))
    if format:
        if format != "json":
            raise UsageError(
                f"unknown format {format!r}: the one format is 'json' (any JSON object)"
            )
        return checked(any_json_object())
    return None


def from_response_format(value: Any) -> Grammar | None:
    """OpenAI's ``response_format``: ``text`` (none), ``json_object`` (any JSON object, or
    llama.cpp's extension ``schema``), ``json_schema`` (its ``json_schema.schema``; ``strict``
    or not, the schema is enforced)."""
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise UsageError("'response_format' must be an object with a 'type'")
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        schema = value.get("schema")
        return checked(json_schema(schema, False) if schema else any_json_object())
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict):
            raise UsageError("'response_format' of type json_schema needs a 'json_schema' object")
        schema = spec.get("schema", value.get("schema"))
        if schema is not None and not isinstance(schema, dict):
            raise UsageError("'response_format.json_schema.schema' must be a JSON object")
        return checked(json_schema(schema) if schema else any_json_object())
    raise UsageError(
        f"response_format type {kind!r} is not supported (text, json_object, json_schema)"
    )


def from_request(fields: dict[str, Any]) -> Grammar | None:
    """The constraint of a request or a batch line: ``response_format``, llama-server's
    ``json_schema`` and ``grammar``, or Ollama's ``format: "json"`` (at most one)."""
    given = [k for k in ("response_format", "json_schema", "grammar", "format") if fields.get(k)]
    if len(given) > 1:
        raise UsageError(f"give one of {' and '.join(repr(g) for g in given)}, not several")
    if given == ["response_format"]:
        return from_response_format(fields["response_format"])
    schema, text, fmt = fields.get("json_schema"), fields.get("grammar"), fields.get("format")
    if schema is not None and not isinstance(schema, dict | str):
        raise UsageError("'json_schema' must be a JSON schema (an object)")
    if text is not None and not isinstance(text, str):
        raise UsageError("'grammar' must be a GBNF grammar (a string)")
    if fmt is not None and not isinstance(fmt, str):
        raise UsageError("'format' must be \"json\"")
    return from_options(schema, text, fmt, files=False)


def _text_or_file(value: str, what: str) -> str:
    """``value`` itself, or the text of the file it names."""
    if "\n" not in value and len(value) < 4096:
        path = Path(value).expanduser()
        if path.is_file():
            try:
                return path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as err:
                raise UsageError(f"cannot read the {what} file {path}: {err}") from err
        if value.endswith((".json", ".gbnf", ".lark")) and not path.exists():
            raise UsageError(f"{what} file not found: {path}")
    return value


def _first_line(err: object) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else "rejected by llguidance"


class Matcher:
    """One generation's grammar state (``core.constraint.Constraint``) over llguidance.

    Tokens are consumed only once validated (the engine cuts a draft at its first invalid
    guess and masks every row it samples from), so the matcher never enters its error state; if
    it did, that is a bug, said as one.
    """

    def __init__(self, tokenizer: Any, compiled: str, n_vocab: int) -> None:
        from llguidance import LLMatcher
        from llguidance.numpy import allocate_token_bitmask

        self._matcher = LLMatcher(tokenizer, compiled, log_level=0)
        if self._matcher.is_error():
            raise UsageError(f"invalid grammar: {_first_line(self._matcher.get_error())}")
        self._bits = allocate_token_bitmask(1, tokenizer.vocab_size)
        self.n_vocab = n_vocab

    def allowed(self) -> np.ndarray:
        """Which tokens may come next (a bool per token of the vocabulary)."""
        from llguidance.numpy import fill_next_token_bitmask

        fill_next_token_bitmask(self._matcher, self._bits, 0)
        bits = np.unpackbits(self._bits.view(np.uint8), bitorder="little")
        return bits[: self.n_vocab].astype(bool)

    def consume(self, token: int) -> None:
        if not self._matcher.consume_token(token):
            raise RuntimeError(
                f"grammar matcher refused token {token}: {self._matcher.get_error()}"
            )

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of ``tokens``, in order, the grammar allows from here (state unchanged)."""
        return int(self._matcher.validate_tokens(tokens)) if tokens else 0

    def forced(self) -> list[int]:
        """The tokens the grammar forces from here (one legal way on), as llguidance's
        canonical tokenization has them; empty when there is a choice."""
        return list(self._matcher.compute_ff_tokens())

    def rollback(self, n: int) -> None:
        if n and not self._matcher.rollback(n):
            raise RuntimeError(f"grammar matcher could not roll back {n} tokens")


# OpenAI's bounds for a logit bias: -100 bans a token, +100 all but forces it.
BIAS_RANGE = 100.0


@dataclass(frozen=True)
class LogitBias:
    """Numbers added to some tokens' logits before anything else (OpenAI's ``logit_bias``), to
    the target's rows and the draft's alike, so the output follows the biased target exactly."""

    ids: tuple[int, ...]
    values: tuple[float, ...]

    @classmethod
    def from_mapping(cls, mapping: Mapping[Any, Any]) -> LogitBias:
        """From ``{token id: bias}`` (ids as numbers or strings, as JSON has them); ValueError
        on an id that is not a whole number >= 0 or a bias outside [-100, 100]."""
        ids, values = [], []
        for key, value in mapping.items():
            try:
                token = int(str(key))
            except ValueError:
                raise ValueError(f"logit_bias: {key!r} is not a token id") from None
            if token < 0:
                raise ValueError(f"logit_bias: {key!r} is not a token id")
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"logit_bias: the bias of token {token} is not a number")
            if not -BIAS_RANGE <= float(value) <= BIAS_RANGE:
                raise ValueError(f"logit_bias: the bias of token {token} is outside [-100, 100]")
            ids.append(token)
            values.append(float(value))
        return cls(tuple(ids), tuple(values))

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """``logits`` with the biases added (a new array; ids past the vocabulary are left)."""
        out = np.array(logits, dtype=np.float32, copy=True)
        ids = np.asarray(self.ids, dtype=np.int64)
        keep = ids < out.shape[0]
        np.add.at(out, ids[keep], np.asarray(self.values, dtype=np.float32)[keep])
        return out
