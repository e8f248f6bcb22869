"""Forced tool calls end when the call closes (issue 28), through the
official `openai` and `anthropic` SDKs against the shared real server
(SmolLM2): a named function (chat, Responses, Anthropic's `tool`) and
`required` / `any` without parallel calls give exactly one call, stop reason
`tool_calls` / `tool_use`, in far fewer tokens than `max_tokens`; with
parallel calls allowed the reply ends at the grammar's limit at the latest;
and the fixed text of a call comes out in the model's own tokens whatever
the sampling."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest

from tests.api.harness import API_KEY, MODEL_ID, ServerThread
from tests.api.test_tools import ASK, TOOLS, WEATHER, check_calls, matches

pytestmark = pytest.mark.slow

NAMED = {"type": "function", "function": {"name": "get_weather"}}
MAX_TOKENS = 200  # one call takes about 45 tokens
TOOL = {
    "name": "get_weather",
    "description": WEATHER["function"]["description"],
    "input_schema": WEATHER["function"]["parameters"],
}
FUNCTION = {"type": "function", **WEATHER["function"]}  # the Responses API's flat function tool


@pytest.fixture(scope="module")
def claude(server: ServerThread) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key=API_KEY, max_retries=0, timeout=120)


# Eight calls are about 360 tokens: patient clients, so a busy machine is not a failure.
@pytest.fixture(scope="module")
def patient_client(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=900)


@pytest.fixture(scope="module")
def patient_claude(server: ServerThread) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key=API_KEY, max_retries=0, timeout=900)


def _one_call(reply: Any, name: str | None = "get_weather", *, max_tokens: int = MAX_TOKENS // 2) -> None:
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    check_calls([call], TOOLS)
    assert name is None or call.function.name == name
    assert reply.usage.completion_tokens < max_tokens, reply.usage


@pytest.mark.parametrize("temperature", [0, 0.8])
def test_named_function_is_one_call(client: openai.OpenAI, temperature: float) -> None:
    """parallel_tool_calls is left at its default (true): a named function is still called once."""
    reply = client.chat.completions.create(
        model=MODEL_ID,
        messages=ASK,
        tools=TOOLS,
        tool_choice=NAMED,
        temperature=temperature,
        seed=1,
        max_tokens=MAX_TOKENS,
    )
    _one_call(reply)


def test_named_function_streamed_is_one_call(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL_ID,
            messages=ASK,
            tools=TOOLS,
            tool_choice=NAMED,
            temperature=0,
            max_tokens=MAX_TOKENS,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    indexes = {call.index for chunk in chunks if chunk.choices for call in chunk.choices[0].delta.tool_calls or []}
    assert indexes == {0}
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens < MAX_TOKENS // 2


def test_required_without_parallel_calls_is_one_call(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL_ID,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=MAX_TOKENS,
    )
    _one_call(reply, name=None)


# Issue 44's repro: SmolLM2 repeats the call; parallel calls are allowed (the default).
ISSUE_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
        },
    },
}
REPEATING: dict[str, Any] = {
    "messages": [{"role": "user", "content": "What is the weather in Paris? Use celsius."}],
    "tools": [ISSUE_TOOL],
    "tool_choice": "required",
    "temperature": 0,
    "max_tokens": 96,
}


def test_required_with_parallel_calls_never_repeats_a_call(patient_client: openai.OpenAI) -> None:
    """OpenAI's default: one or more calls. SmolLM2 starts the same call again;
    the answer ends there, with the one call and `tool_calls` (never `length`),
    whole and streamed alike, and `.parse()` takes it."""
    reply = patient_client.chat.completions.create(model=MODEL_ID, **REPEATING)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "celsius"}
    with patient_client.chat.completions.stream(model=MODEL_ID, **REPEATING) as stream:
        streamed = stream.get_final_completion()
    assert streamed.choices[0].finish_reason == "tool_calls"
    assert [json.loads(c.function.arguments) for c in streamed.choices[0].message.tool_calls] == [
        json.loads(call.function.arguments)
    ]
    chunks = list(patient_client.chat.completions.create(model=MODEL_ID, stream=True, **REPEATING))
    indexes = {c.index for chunk in chunks if chunk.choices for c in chunk.choices[0].delta.tool_calls or ()}
    assert indexes == {0}  # no delta of the repeated call went out
    strict = {"type": "function", "function": {**ISSUE_TOOL["function"], "strict": True}}
    strict["function"]["parameters"] = {**ISSUE_TOOL["function"]["parameters"], "additionalProperties": False}
    parsed = patient_client.chat.completions.parse(model=MODEL_ID, **{**REPEATING, "tools": [strict]})
    assert len(parsed.choices[0].message.tool_calls) == 1


def test_a_call_cut_by_max_tokens_is_dropped(client: openai.OpenAI) -> None:
    """One call is about 45 tokens: 70 hold the first and cut a second one; the
    cut one is dropped and the finish reason says the calls are made."""
    body = {**REPEATING, "max_tokens": 70}
    reply = client.chat.completions.create(model=MODEL_ID, **body)
    assert reply.choices[0].finish_reason == "tool_calls"
    assert len(reply.choices[0].message.tool_calls) == 1
    chunks = list(client.chat.completions.create(model=MODEL_ID, stream=True, **body))
    indexes = {call.index for chunk in chunks for call in chunk.choices[0].delta.tool_calls or ()} if chunks else set()
    assert indexes == {0}
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


@pytest.mark.parametrize(
    "choice",
    [
        {"type": "tool", "name": "get_weather"},  # the issue's case: 64 of 64 tokens, stop_reason max_tokens
        {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        {"type": "any", "disable_parallel_tool_use": True},
    ],
)
def test_anthropic_forced_tool_is_one_tool_use(claude: anthropic.Anthropic, choice: dict[str, Any]) -> None:
    message = claude.messages.create(
        model=MODEL_ID,
        max_tokens=64,
        messages=ASK,
        tools=[TOOL],
        tool_choice=choice,  # type: ignore[arg-type]
        extra_body={"temperature": 0},
    )
    assert message.stop_reason == "tool_use"
    (use,) = message.content
    assert use.type == "tool_use" and use.name == "get_weather" and matches(TOOL["input_schema"], use.input)
    assert message.usage.output_tokens < 64


def test_anthropic_any_with_parallel_tool_use_is_one_tool_use(patient_claude: anthropic.Anthropic) -> None:
    """Anthropic's `any` with parallel tool use allowed, on issue 44's repro."""
    body: dict[str, Any] = {
        "model": MODEL_ID,
        "max_tokens": 800,
        "messages": REPEATING["messages"],
        "tools": [{"name": "get_weather", "input_schema": ISSUE_TOOL["function"]["parameters"]}],
        "tool_choice": {"type": "any"},
        "extra_body": {"temperature": 0},
    }
    with patient_claude.messages.stream(**body) as stream:
        message = stream.get_final_message()
    assert message.stop_reason == "tool_use"
    (block,) = message.content  # SmolLM2 repeats the call: the repeat ends the answer unsent
    assert block.type == "tool_use" and block.input == {"city": "Paris", "unit": "celsius"}
    assert message.usage.output_tokens < 200
    whole = patient_claude.messages.create(**body)
    assert whole.stop_reason == "tool_use" and [b.input for b in whole.content] == [block.input]


def test_responses_named_function_is_one_call(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model=MODEL_ID,
        input=ASK[0]["content"],
        tools=[FUNCTION],
        tool_choice={"type": "function", "name": "get_weather"},  # type: ignore[arg-type,list-item]
        max_output_tokens=MAX_TOKENS,
        temperature=0,
    )
    assert response.status == "completed"
    (call,) = response.output
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    assert matches(WEATHER["function"]["parameters"], json.loads(call.arguments))
    assert response.usage is not None and response.usage.output_tokens < MAX_TOKENS // 2


def test_a_calls_fixed_text_is_the_models_own_tokens(client: openai.OpenAI, server: ServerThread) -> None:
    """Sampled hot, the text around the arguments still comes out in the
    canonical tokens: no spelling of it is left to chance (or to a near-tie)."""
    tokenizer = server.call(lambda: server.engine.tokenizer(MODEL_ID))

    def spelled(text: str) -> list[str]:
        return [tokenizer.token_text(t) for t in tokenizer.encode(text, add_special=False)]

    head, close = spelled('<tool_call>\n{"name": "get_weather", "arguments":'), spelled("\n</tool_call>")
    for seed in range(4):
        reply = client.chat.completions.create(
            model=MODEL_ID,
            messages=ASK,
            tools=TOOLS,
            tool_choice=NAMED,
            temperature=1.5,
            seed=seed,
            max_tokens=MAX_TOKENS,
            logprobs=True,
        )
        _one_call(reply, max_tokens=MAX_TOKENS)  # hot: the arguments may take long strings
        tokens = [entry.token for entry in reply.choices[0].logprobs.content]  # type: ignore[union-attr]
        assert tokens[: len(head)] == head and tokens[-len(close) :] == close, tokens
