"""The tool grammar's shape by choice (issue 28): a named function is one
call whatever `parallel` says, `required` is one call or up to the limit,
and with a tokenizer a call's fixed text is written as token ids (no model
needed; tests/api/test_forced_tools.py runs the grammars on SmolLM2)."""

from __future__ import annotations

import re
from typing import Literal

from localserve.backends.base import Tokenizer
from localserve.serving.tools import MAX_PARALLEL_CALLS, plan_tools
from localserve.serving.types import FunctionTool, Tools

WEATHER = FunctionTool(
    "get_weather",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
ADD = FunctionTool("add", parameters={"type": "object", "properties": {"a": {"type": "integer"}}})


class CharTokenizer(Tokenizer):
    """One token per character (its code point); `prefix` is what a
    SentencePiece-like tokenizer would put in front of the text."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix

    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return [ord(char) for char in self.prefix + text]

    def token_bytes(self, token_id: int) -> bytes:
        return chr(token_id).encode()

    @property
    def eog_token_ids(self) -> frozenset[int]:
        return frozenset({0})

    @property
    def vocab_size(self) -> int:
        return 0x110000


def _grammar(
    choice: Literal["auto", "required", "named"],
    *,
    parallel: bool,
    name: str | None = None,
    tokenizer: Tokenizer | None = None,
) -> str:
    plan = plan_tools(Tools((WEATHER, ADD), choice, name, parallel), tokenizer)
    assert plan is not None
    assert plan.parallel == (parallel and choice != "named")
    return plan.grammar


def test_a_named_function_is_one_call_even_with_parallel_calls() -> None:
    grammar = _grammar("named", parallel=True, name="add")
    assert "root ::= ls-calls\n" in grammar and "ls-calls ::= ls-call\n" in grammar
    assert "get_weather" not in grammar and '\\"add\\"' in grammar


def test_required_is_one_call_or_up_to_the_limit() -> None:
    assert "ls-calls ::= ls-call\n" in _grammar("required", parallel=False)
    parallel = _grammar("required", parallel=True)
    assert f'ls-calls ::= ls-call ( "\\n" ls-call ){{0,{MAX_PARALLEL_CALLS - 1}}}\n' in parallel
    assert "root ::= ls-calls\n" in parallel


def test_fixed_text_as_token_ids_when_they_spell_it_exactly() -> None:
    grammar = _grammar("auto", parallel=True, tokenizer=CharTokenizer())
    head = "".join(f"<[{ord(c)}]> " for c in '<tool_call>\n{"name": "add", "arguments":')
    assert head.strip() in grammar
    assert " ".join(f"<[{ord(c)}]>" for c in "\n</tool_call>") in grammar
    assert "tool_call" not in grammar  # no fixed text left as characters
    assert "root ::= ls-calls | ls-text" in grammar


def test_fixed_text_stays_characters_when_the_tokens_add_to_it() -> None:
    grammar = _grammar("required", parallel=False, tokenizer=CharTokenizer(prefix=" "))
    assert not re.search(r"<\[\d+\]>", grammar)
    assert '"<tool_call>\\n{\\"name\\": \\"add\\", \\"arguments\\":"' in grammar
    assert grammar == _grammar("required", parallel=False)  # what a plan without a tokenizer gets
