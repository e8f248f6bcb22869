"""What a request constrains its output to, as one llguidance grammar.

Every backend samples through the same engine (backends/constraints.py), so
the grammar is built here once, as text, whatever the backend:

* `response_format` `json_object`: any JSON object; `json_schema`: JSON that
  matches the schema. With `strict: true` a keyword the engine cannot
  enforce is an error (400); without it, such keywords are ignored, as
  OpenAI does for non-strict schemas.
* llama.cpp's own fields: `json_schema` (the same) and `grammar`, GBNF or
  Lark text, converted by llguidance (a GBNF it cannot read is a 400).
* tool calls: serving/tools.py writes a Lark grammar that embeds each
  function's schema (`%json`).

An object schema that does not say `additionalProperties` gets no keys
beyond its `properties`, as llama.cpp's converter and xgrammar's strict mode
do (JSON Schema itself would allow any, and a small model takes that as an
invitation to go on inventing keys).

Whitespace inside JSON is limited the way llama.cpp's converter limits it
(one space, or a newline and at most 20 spaces or tabs of indentation), so
a small model cannot loop on blank lines.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from localserve.errors import InvalidRequestError
from localserve.serving.types import OutputFormat

#: What may separate JSON tokens (llama.cpp's `space` rule).
JSON_WHITESPACE = r"[ ]?|\n[ \t]{0,20}"


def json_options(*, strict: bool) -> dict[str, Any]:
    return {"whitespace_pattern": JSON_WHITESPACE, "lenient": not strict}


_SUBSCHEMA_LISTS = ("anyOf", "allOf", "oneOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")


def closed_objects(schema: Any) -> Any:
    """`schema` with `additionalProperties: false` on every object schema
    that lists `properties` and says nothing of other keys."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if "properties" in out and "additionalProperties" not in out and "unevaluatedProperties" not in out:
        out["additionalProperties"] = False
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed_objects(item) for item in out[key]]
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed_objects(item) for name, item in out[key].items()}
    for key in ("items", "additionalProperties", "not", "if", "then", "else"):
        if isinstance(out.get(key), dict):
            out[key] = closed_objects(out[key])
    return out


@lru_cache(maxsize=128)
def _schema_grammar(schema_json: str, strict: bool) -> str:
    import llguidance

    schema = closed_objects(json.loads(schema_json))
    grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=json_options(strict=strict))  # type: ignore[arg-type]
    check_grammar(grammar)
    return grammar


@lru_cache(maxsize=64)
def _text_grammar(text: str) -> str:
    import llguidance

    try:
        grammar = llguidance.grammar_from("gbnf", text)  # GBNF or Lark
    except ValueError as exc:
        raise InvalidRequestError(f"the grammar cannot be read: {exc}", param="grammar") from None
    check_grammar(grammar, param="grammar")
    return grammar


def check_grammar(grammar: str, *, param: str | None = None) -> None:
    """Refuse a grammar the engine cannot compile (tokenizer-free checks)."""
    import llguidance

    error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if error:
        raise InvalidRequestError(messages[0] if messages else "the grammar is not valid", param=param)


def grammar_for(output: OutputFormat | None) -> str | None:
    """The grammar for `output`; None for free text."""
    if output is None:
        return None
    if output.kind == "grammar":
        assert isinstance(output.text, str)
        return _text_grammar(output.text)
    schema: Any = {"type": "object"} if output.kind == "json_object" else output.schema
    if schema is True or schema in ({}, None):
        schema = {}  # "anything": any JSON value
    try:
        return _schema_grammar(json.dumps(schema, sort_keys=True), output.strict)
    except InvalidRequestError as exc:
        exc.message = f"{output.schema_param} cannot be enforced: {exc.message}"
        exc.param = output.schema_param
        raise
    except (ValueError, TypeError) as exc:  # llguidance raises ValueError for schemas it cannot take
        raise InvalidRequestError(
            f"{output.schema_param} cannot be enforced: {exc}", param=output.schema_param
        ) from None
