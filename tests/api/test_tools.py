"""Tool calling on /v1/chat/completions: the parser and prompt as units, and
the real SmolLM2 over HTTP (its template knows nothing of tools, so this is
the system-prompt fallback, with the grammar doing the rest)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest

from localserve.backends.chat_template import ChatTemplate
from localserve.serving.openai.request import tools as openai_tools
from localserve.serving.openai.schemas import NamedToolChoice, ToolDef
from localserve.serving.tools import TOOL_OPEN, plan_tools, prompt_messages, renders_tools
from localserve.serving.tools_parse import ToolCallParser, parse_reply
from tests.api.harness import API_KEY, MODEL_ID, ServerThread, make_settings

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 40},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer"},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
TOOLS = [WEATHER, ADD]
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]


def matches(schema: dict[str, Any], value: Any) -> bool:
    """A small JSON-schema check: the keywords the tests' schemas use."""
    kind = schema.get("type")
    checks = {
        "object": lambda v: isinstance(v, dict),
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "array": lambda v: isinstance(v, list),
    }
    if kind is not None and not checks[kind](value):
        return False
    if "enum" in schema and value not in schema["enum"]:
        return False
    if kind == "string" and len(value) > schema.get("maxLength", len(value)):
        return False
    if kind == "object":
        properties = schema.get("properties", {})
        if any(name not in value for name in schema.get("required", [])):
            return False
        if schema.get("additionalProperties") is False and set(value) - set(properties):
            return False
        return all(matches(properties[k], v) for k, v in value.items() if k in properties)
    return True


def check_calls(calls: list[Any], tools: list[dict[str, Any]]) -> None:
    """Every call names a given tool, and its arguments parse and fit its schema."""
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    assert calls
    for call in calls:
        assert call.type == "function"
        assert call.id.startswith("call_")
        arguments = json.loads(call.function.arguments)
        assert matches(schemas[call.function.name], arguments), (call.function.name, arguments)


# ---- units: parser, prompt, grammar ---------------------------------------------------------

CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'


def _fed_in_pieces(text: str, size: int) -> ToolCallParser:
    parser = ToolCallParser()
    for i in range(0, len(text), size):
        parser.feed(text[i : i + size])
    parser.finish()
    return parser


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_streamed_parse_equals_whole(size: int) -> None:
    text = CALL_TEXT + "\n" + CALL_TEXT.replace("Paris", 'Lyon \\"x\\" {}')
    parser = _fed_in_pieces(text, size)
    whole = parse_reply(text)
    assert [(c.name, c.arguments) for c in parser.calls] == [(c.name, c.arguments) for c in whole.calls]
    assert [json.loads(c.arguments)["city"] for c in whole.calls] == ["Paris", 'Lyon "x" {}']
    assert whole.content is None


def test_parse_text_and_partial_calls() -> None:
    assert parse_reply("Hello <b>there</b>").calls == []
    assert parse_reply("Hello <b>there</b>").content == "Hello <b>there</b>"
    assert parse_reply("<tool").content == "<tool"  # a held-back prefix ends as text
    cut = CALL_TEXT[:40]  # the token limit hit inside the call
    assert parse_reply(cut) == parse_reply(cut).__class__(cut, [])
    two = parse_reply(CALL_TEXT + "\n" + CALL_TEXT[:50])
    assert len(two.calls) == 1  # the complete one only
    other_shape = '<tool_call>{"arguments": {"a": 1}, "name": "add"}</tool_call>'
    assert [(c.name, json.loads(c.arguments)) for c in parse_reply(other_shape).calls] == [("add", {"a": 1})]


def test_streamed_deltas_rebuild_the_call() -> None:
    parser = ToolCallParser()
    deltas = [d for ch in CALL_TEXT for d in parser.feed(ch)]
    heads = [d for d in deltas if d.name]
    assert len(heads) == 1 and heads[0].name == "get_weather" and heads[0].call_id.startswith("call_")
    arguments = "".join(d.arguments for d in deltas)
    assert json.loads(arguments) == {"city": "Paris", "unit": "celsius"}
    assert [d.done for d in deltas].count(True) == 1
    assert not any(d.content for d in deltas)


def _plan(choice: Any = "auto", parallel: bool = True):  # type: ignore[no-untyped-def]
    if isinstance(choice, dict):
        choice = NamedToolChoice.model_validate(choice)
    return plan_tools(openai_tools([ToolDef.model_validate(t) for t in TOOLS], choice, parallel=parallel))


def test_plan_and_grammar_shapes() -> None:
    assert plan_tools(openai_tools([ToolDef.model_validate(WEATHER)], "none", parallel=True)) is None
    assert plan_tools(openai_tools(None, "auto", parallel=True)) is None
    auto, required = _plan("auto"), _plan("required", parallel=False)
    assert "start: ls_calls | LS_TEXT" in auto.grammar and not auto.required
    assert "start: ls_calls\n" in required.grammar and "ls_calls: ls_call\n" in required.grammar
    named = _plan({"type": "function", "function": {"name": "add"}})
    assert named.required and named.names == ["add"] and "get_weather" not in named.grammar


def test_fallback_prompt_for_a_template_without_tools(server: ServerThread) -> None:
    source = server.call(lambda: server.engine.tokenizer(MODEL_ID).chat_template)
    template = ChatTemplate(source, bos_token="<|im_start|>", eos_token="<|im_end|>")
    assert not renders_tools(template)  # SmolLM2's template does not mention tools
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "no rain"},
    ]
    messages, tools = prompt_messages(history, _plan(), template)
    assert tools is None
    text = template.render(messages)
    assert text.count("<|im_start|>system") == 1 and '"name": "get_weather"' in text and TOOL_OPEN in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    # Both results in one user turn, as Qwen's template writes them.
    assert "<|im_start|>user\n<tool_response>\n18 C, sunny\n</tool_response>\n<tool_response>\nno rain" in text


def test_native_template_gets_tools_and_object_arguments() -> None:
    source = (
        "{% for m in messages %}{{ m.role }}:{{ m.content }}"
        "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.arguments | tojson }}</tool_call>{% endfor %}\n"
        "{% endfor %}{% if tools %}TOOLS={{ tools | length }}{% endif %}"
    )
    template = ChatTemplate(source)
    assert renders_tools(template)
    history = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
            ],
        }
    ]
    messages, tools = prompt_messages(history, _plan(), template)
    text = template.render(messages, tools=tools)
    assert '<tool_call>{"a": 1, "b": 2}</tool_call>' in text and "TOOLS=2" in text


# ---- the real model ----------------------------------------------------------------------------


@pytest.mark.slow
def test_twenty_seeded_samples_always_parse_and_match(server: ServerThread) -> None:
    """Seeds 0..19 at temperature 0.8, `required` on even seeds and a named
    function on odd ones: every call's arguments are JSON that fits the
    function's schema, and the reply is calls only."""
    # Ten answers share the CPU: a patient client, so a busy machine is not a failure.
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=900)
    named = {"type": "function", "function": {"name": "get_weather"}}

    def sample(seed: int) -> openai.types.chat.ChatCompletion:
        return client.chat.completions.create(
            model=MODEL_ID,
            messages=ASK,
            tools=TOOLS,
            tool_choice="required" if seed % 2 == 0 else named,
            temperature=0.8,
            seed=seed,
            max_tokens=800,  # room for the grammar's most calls (8) of the longest arguments
        )

    with ThreadPoolExecutor(max_workers=10) as pool:
        replies = list(pool.map(sample, range(20)))
    for seed, reply in enumerate(replies):
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.content is None
        check_calls(choice.message.tool_calls, TOOLS)
        if seed % 2:
            assert {c.function.name for c in choice.message.tool_calls} == {"get_weather"}


@pytest.fixture(scope="module")
def exact_client() -> Iterator[openai.OpenAI]:
    """A server whose greedy answers repeat token for token, given
    `speculative: false` and `cache_prompt: false` (README, Sampling
    defaults): a KV stream per slot, so a sequence's cells start at the
    stream's first cell each time; in a shared pool they go wherever the
    pool has room, and where they lie changes how attention rounds (3 of 36
    repeats of this request differed there, 0 of 36 here)."""
    srv = ServerThread(make_settings(api_key=API_KEY, parallel=2, ctx_size=1024, kv_size=2048)).start()
    try:
        srv.wait_healthy()
        yield openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    finally:
        srv.stop()


@pytest.mark.slow
def test_streamed_tool_calls_equal_whole(exact_client: openai.OpenAI) -> None:
    client = exact_client
    kwargs: dict[str, Any] = dict(
        model=MODEL_ID,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,  # greedy decoding would repeat the call up to the grammar's limit
        temperature=0,
        max_tokens=120,
        # Computed alike both times: no drafts (a verify step rounds unlike a one-token step) and the whole
        # prompt each time (a cached prefix with its last token alone rounds unlike a whole prompt).
        extra_body={"speculative": False, "cache_prompt": False},
    )
    reply = client.chat.completions.create(**kwargs)
    whole = reply.choices[0]
    chunks = list(client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    usage = chunks.pop().usage
    assert usage and usage.prompt_tokens_details and reply.usage and reply.usage.prompt_tokens_details
    assert usage.prompt_tokens_details.cached_tokens == reply.usage.prompt_tokens_details.cached_tokens == 0
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for delta_call in chunk.choices[0].delta.tool_calls or []:
            entry = calls.setdefault(delta_call.index, {"id": "", "name": "", "arguments": ""})
            entry["id"] += delta_call.id or ""
            entry["name"] += (delta_call.function and delta_call.function.name) or ""
            entry["arguments"] += (delta_call.function and delta_call.function.arguments) or ""
        assert not chunk.choices[0].delta.content
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls
    ]
    assert all(c["id"].startswith("call_") for c in calls.values())


@pytest.mark.slow
def test_parallel_off_gives_one_call(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL_ID,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0.8,
        seed=3,
        max_tokens=120,
    )
    assert len(reply.choices[0].message.tool_calls) == 1
    check_calls(reply.choices[0].message.tool_calls, TOOLS)


@pytest.mark.slow
def test_auto_is_text_or_valid_calls(client: openai.OpenAI) -> None:
    for seed in range(3):
        choice = client.chat.completions.create(
            model=MODEL_ID, messages=ASK, tools=TOOLS, temperature=0.8, seed=seed, max_tokens=120
        ).choices[0]
        if choice.message.tool_calls:
            check_calls(choice.message.tool_calls, TOOLS)
            assert choice.finish_reason in ("tool_calls", "length")  # length: a later call was cut
        elif choice.finish_reason == "stop":  # text: the grammar's other branch
            assert choice.message.content and not choice.message.content.lstrip().startswith(TOOL_OPEN)


@pytest.mark.slow
def test_none_means_plain_text(client: openai.OpenAI) -> None:
    choice = client.chat.completions.create(
        model=MODEL_ID, messages=ASK, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=24
    ).choices[0]
    assert choice.message.tool_calls is None and choice.message.content
    assert choice.finish_reason in ("stop", "length")


@pytest.mark.slow
def test_history_with_tool_results(client: openai.OpenAI) -> None:
    messages = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 18, "sky": "sunny"}'},
    ]
    reply = client.chat.completions.create(
        model=MODEL_ID, messages=messages, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=24
    )
    assert reply.choices[0].message.content


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
        ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "response_format"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "no-such-type"}}}]},
            "tools",
        ),
    ],
)
def test_invalid_tool_requests(http: httpx.Client, extra: dict[str, Any], param: str) -> None:
    response = http.post("/v1/chat/completions", json={"model": MODEL_ID, "messages": ASK, **extra})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_a_repeated_call_ends_the_reply_unsent() -> None:
    same = CALL_TEXT.replace('{"city": "Paris", "unit": "celsius"}', '{"unit": "celsius",  "city": "Paris"}')
    other = CALL_TEXT.replace("Paris", "Lyon")
    text = CALL_TEXT + "\n" + other + "\n" + same + "\n" + CALL_TEXT.replace("Paris", "Nice")
    for size in (1, 5, 1000):
        parser = ToolCallParser()
        deltas = [d for i in range(0, len(text), size) for d in parser.feed(text[i : i + size])]
        parser.finish()
        assert parser.repeated and [json.loads(c.arguments)["city"] for c in parser.calls] == ["Paris", "Lyon"]
        assert {d.index for d in deltas} == {0, 1}  # nothing of the repeat (index 2) went out
    assert [json.loads(c.arguments)["city"] for c in parse_reply(text).calls] == ["Paris", "Lyon"]


def test_a_later_call_is_held_until_complete_and_dropped_if_cut() -> None:
    parser = ToolCallParser()
    first = parser.feed(CALL_TEXT + "\n")
    assert first[-1].done and {d.index for d in first} == {0}
    assert parser.feed(CALL_TEXT.replace("Paris", "Lyon")[:60]) == []  # held back
    assert parser.finish() == [] and len(parser.calls) == 1 and parser.num_complete == 1
