"""The reasoning parser on scripted output (issue 31): streamed in every
possible split, the reasoning and the answer come out the same as whole."""

from __future__ import annotations

import datetime

import pytest

from localserve.backends.chat_template import ChatTemplate
from localserve.serving.prompts import render_messages
from localserve.serving.reasoning import CONTENT, REASONING, ReasoningFormat, ReasoningParser, split_reasoning

CLOSED = ReasoningFormat()
OPENED = ReasoningFormat(starts_open=True)
QWEN3_LIKE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
    "{# the model writes <think> ... </think> first #}"
)
R1_LIKE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|><think>\n{% endif %}{# ends with </think> #}"
)


def _streamed(text: str, fmt: ReasoningFormat, sizes: list[int]) -> tuple[str, str]:
    parser = ReasoningParser(fmt)
    pieces, i = [], 0
    for size in sizes:
        pieces += parser.feed(text[i : i + size])
        i += size
    pieces += parser.feed(text[i:]) + parser.finish()
    return (
        "".join(t for kind, t in pieces if kind == REASONING),
        "".join(t for kind, t in pieces if kind == CONTENT),
    )


@pytest.mark.parametrize(
    ("text", "fmt", "reasoning", "content"),
    [
        ("<think>\nLet me add.\n</think>\n\nIt is 4.", CLOSED, "Let me add.\n", "It is 4."),
        ("  <think>a < b</think>yes", CLOSED, "a < b", "yes"),
        ("Just an answer <think> not at the start", CLOSED, None, "Just an answer <think> not at the start"),
        ("Thinking first.\n</think>\n\nThe answer.", OPENED, "Thinking first.\n", "The answer."),
        ("<think>cut off by max_tokens", CLOSED, "cut off by max_tokens", ""),
        ("", OPENED, "", ""),
    ],
)
def test_split_whole_and_in_every_split(text: str, fmt: ReasoningFormat, reasoning: str | None, content: str) -> None:
    assert split_reasoning(text, fmt) == (reasoning, content)
    for size in (1, 2, 3, 5, 7):
        assert _streamed(text, fmt, [size] * (len(text) // size)) == (reasoning or "", content)


def test_the_template_tells_the_format() -> None:
    plain = ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert ReasoningFormat.of(plain) is None
    qwen = ReasoningFormat.of(ChatTemplate(QWEN3_LIKE))
    assert qwen is not None and not qwen.starts_open
    r1 = ReasoningFormat.of(ChatTemplate(R1_LIKE))
    assert r1 is not None and r1.starts_open


def test_closing_the_section_in_the_prompt() -> None:
    assert CLOSED.closed_prompt("<|assistant|>") == "<|assistant|><think>\n\n</think>\n\n"
    assert OPENED.closed_prompt("<|assistant|><think>\n") == "<|assistant|><think>\n\n</think>\n\n"
    done = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert CLOSED.closed_prompt(done) == done


def test_a_grammar_constrains_only_the_answer_after_the_section() -> None:
    from localserve.serving.grammar import grammar_for
    from localserve.serving.reasoning import reasoning_grammar
    from localserve.serving.types import OutputFormat
    from tests.serving.test_tools_grammar import _accepts

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    answer = grammar_for(OutputFormat("json_schema", schema))
    assert answer is not None
    free_start = reasoning_grammar(CLOSED, answer)
    assert _accepts(free_start, '<think>a < b, so {"a": "x"}</think>\n\n{"a": 1}')  # the thinking is free
    assert _accepts(free_start, '{"a": 1}')  # the section may be skipped
    assert not _accepts(free_start, "<think>hm</think>\nnot json", complete=False)
    opened = reasoning_grammar(OPENED, answer)
    assert _accepts(opened, 'first this</think>{"a": 2}')
    assert not _accepts(opened, '{"a": 2}')  # inside the section until it is closed


def test_the_budget_closes_a_section_the_model_opened_in_pieces() -> None:
    """`<think>` written in several tokens still opens the section for the
    budget; an answer without one leaves the budget idle."""
    from localserve.backends.constraints import ThinkBudget

    pieces = {1: b"<th", 2: b"ink>", 3: b" hm", 4: b"\n</think>\n\n", 5: b"Yes"}
    budget = ThinkBudget(2, [4], pieces.__getitem__, opened=False)
    for token in (1, 2, 3, 3):
        assert budget.forced() is None
        budget.note(token)
    assert budget.forced() == 4  # two thinking tokens written: the close is forced
    budget.note(4)
    assert budget.forced() is None
    plain = ThinkBudget(1, [4], pieces.__getitem__, opened=False)
    for token in (5, 3, 3):
        plain.note(token)
        assert plain.forced() is None


# llama.cpp's own templates (QwQ, DeepSeek-R1, Command R7B) close the section when `enable_thinking` is
# not true: llama-server gives it true unless `--reasoning off`.
LLAMA_CPP_LIKE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|><think>\n{% if not enable_thinking %}</think>{% endif %}{% endif %}"
)


@pytest.mark.parametrize(
    ("source", "thinking", "end"),
    [
        (LLAMA_CPP_LIKE, True, "<|assistant|><think>\n"),
        (LLAMA_CPP_LIKE, False, "<|assistant|><think>\n</think>"),
        (QWEN3_LIKE, True, "<|im_start|>assistant\n"),
        (QWEN3_LIKE, False, "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
        (R1_LIKE, False, "<|assistant|><think>\n\n</think>\n\n"),  # closed after the template
    ],
)
def test_render_messages_gives_enable_thinking_as_llama_server(source: str, thinking: bool, end: str) -> None:
    template = ChatTemplate(source)
    fmt = ReasoningFormat.of(template)
    text = render_messages(template, [{"role": "user", "content": "hi"}], thinking=thinking, reasoning=fmt)
    assert text.endswith(end)
    if source is LLAMA_CPP_LIKE:  # read with enable_thinking, as prompts are rendered: the prompt opens it
        assert fmt is not None and fmt.starts_open


def test_render_messages_gives_todays_date_string() -> None:
    template = ChatTemplate("Today Date: {{ date_string if date_string is defined else '26 Jul 2024' }}")
    assert render_messages(template, []) == f"Today Date: {datetime.date.today().strftime('%d %b %Y')}"
