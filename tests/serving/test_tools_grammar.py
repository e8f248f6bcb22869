"""The tool grammar by choice (issues 28, 31), run by llguidance over a
byte vocabulary: a named function is one call whatever `parallel` says,
`required` is one call or up to the limit, `auto` is calls or text, and with
a tokenizer a call's fixed text is written as token ids (no model needed;
tests/api/test_forced_tools.py runs the grammars on SmolLM2)."""

from __future__ import annotations

import re
from typing import Literal

import llguidance
import numpy as np

from localserve.engine.backend import Tokenizer
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


class _Bytes:
    """A byte-level vocabulary for llguidance: token i is byte i, 256 ends."""

    eos_token_id = 256
    bos_token_id = None
    tokens = [bytes([i]) for i in range(256)] + [b"\xff<eos>"]
    special_token_ids = [256]

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


def _matcher(grammar: str) -> llguidance.LLMatcher:
    tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()))
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    return matcher


def _accepts(grammar: str, text: str, *, complete: bool = True) -> bool:
    """Does the grammar take `text` (and, with `complete`, may it end there)?"""
    matcher = _matcher(grammar)
    data = list(text.encode())
    if matcher.try_consume_tokens(data) != len(data):
        return False
    return matcher.is_accepting() if complete else True


def _call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


ADD_CALL = _call("add", '{"a": 1}')
WEATHER_CALL = _call("get_weather", '{"city": "Paris"}')


def test_a_named_function_is_one_call_even_with_parallel_calls() -> None:
    grammar = _grammar("named", parallel=True, name="add")
    assert _accepts(grammar, ADD_CALL)
    assert not _accepts(grammar, WEATHER_CALL, complete=False)
    assert not _accepts(grammar, ADD_CALL + "\n" + ADD_CALL, complete=False)
    matcher = _matcher(grammar)
    matcher.consume_tokens(list(ADD_CALL.encode()))
    mask = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), np.uint8), bitorder="little")
    assert np.flatnonzero(mask).tolist() == [256]  # after the call, only the end


def test_required_is_one_call_or_up_to_the_limit() -> None:
    one = _grammar("required", parallel=False)
    assert _accepts(one, WEATHER_CALL) and not _accepts(one, WEATHER_CALL + "\n" + ADD_CALL, complete=False)
    assert not _accepts(one, "Hello", complete=False)  # a call is required
    parallel = _grammar("required", parallel=True)
    most = "\n".join([ADD_CALL, WEATHER_CALL] * (MAX_PARALLEL_CALLS // 2))
    assert _accepts(parallel, most)
    assert not _accepts(parallel, most + "\n" + ADD_CALL, complete=False)


def test_auto_is_calls_or_text_that_does_not_start_a_call() -> None:
    grammar = _grammar("auto", parallel=True)
    assert _accepts(grammar, "The weather is fine.")
    assert _accepts(grammar, WEATHER_CALL + "\n" + ADD_CALL)
    assert not _accepts(grammar, "<b>bold</b>", complete=False)  # "<" commits to a call
    assert not _accepts(grammar, _call("add", '{"a": "one"}'), complete=False)  # arguments follow the schema


def test_fixed_text_as_token_ids_when_they_spell_it_exactly() -> None:
    grammar = _grammar("auto", parallel=True, tokenizer=CharTokenizer())
    head = "".join(f"<[{ord(c)}]> " for c in '<tool_call>\n{"name": "add", "arguments":')
    assert head.strip() in grammar
    assert " ".join(f"<[{ord(c)}]>" for c in "\n</tool_call>") in grammar
    assert "tool_call" not in grammar  # no fixed text left as characters


def test_fixed_text_stays_characters_when_the_tokens_add_to_it() -> None:
    grammar = _grammar("required", parallel=False, tokenizer=CharTokenizer(prefix=" "))
    assert not re.search(r"<\[\d+\]>", grammar)
    assert grammar == _grammar("required", parallel=False)  # what a plan without a tokenizer gets
