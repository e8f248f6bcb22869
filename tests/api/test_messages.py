"""`POST /v1/messages` and `/v1/messages/count_tokens` (Anthropic's Messages
API) through the official `anthropic` SDK against the shared real server
(SmolLM2): whole and streamed messages, the raw event sequence, token
counts, stop sequences, a forced tool_use and a tool_result round trip, and
Anthropic's errors (shape, status, SDK classes), `x-api-key` included."""

from __future__ import annotations

import json
import socket
from typing import Any

import anthropic
import httpx
import pytest

from tests.api.harness import API_KEY, MODEL_ID, ServerThread, open_raw_stream
from tests.api.test_errors import FailAfter, set_fault
from tests.api.test_tools import WEATHER, matches

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
TOOL = {
    "name": "get_weather",
    "description": WEATHER["function"]["description"],
    "input_schema": WEATHER["function"]["parameters"],
}
GREEDY = {"extra_body": {"temperature": 0}}  # the SDK takes sampling fields in the body


@pytest.fixture(scope="module")
def claude(server: ServerThread) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key=API_KEY, max_retries=0, timeout=120)


def test_whole_message(claude: anthropic.Anthropic) -> None:
    message = claude.messages.create(model=MODEL_ID, max_tokens=16, messages=QUESTION, **GREEDY)  # type: ignore[arg-type]
    assert message.type == "message" and message.role == "assistant" and message.model == MODEL_ID
    assert message.id.startswith("msg_")
    (block,) = message.content
    assert block.type == "text" and "paris" in block.text.lower()
    assert message.stop_reason in ("end_turn", "max_tokens") and message.stop_sequence is None
    usage = message.usage
    assert usage.input_tokens + (usage.cache_read_input_tokens or 0) > 5 and 1 <= usage.output_tokens <= 16
    count = claude.messages.count_tokens(model=MODEL_ID, messages=QUESTION)  # type: ignore[arg-type]
    assert count.input_tokens == usage.input_tokens + (usage.cache_read_input_tokens or 0)


def test_system_and_block_content(claude: anthropic.Anthropic) -> None:
    messages: Any = [
        {"role": "user", "content": [{"type": "text", "text": "Name a color."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Blue."}]},
        {"role": "user", "content": "Another one."},
    ]
    short: Any = [{"type": "text", "text": "Answer with one word."}]
    system: Any = [*short, {"type": "text", "text": "Never explain. Never add punctuation. Use lower case only."}]
    longer = claude.messages.count_tokens(model=MODEL_ID, messages=messages, system=system)
    shorter = claude.messages.count_tokens(model=MODEL_ID, messages=messages, system=short)
    assert longer.input_tokens > shorter.input_tokens + 10 > 20  # both blocks of the system prompt count
    message = claude.messages.create(model=MODEL_ID, max_tokens=8, messages=messages, system=system, **GREEDY)  # type: ignore[arg-type]
    assert message.content and message.content[0].type == "text"


def test_stream_equals_whole(claude: anthropic.Anthropic) -> None:
    # The prompt into the prefix cache first, so that both answers compared below read it alike
    # (a whole prompt and its last token alone round differently: README, Sampling defaults).
    claude.messages.create(model=MODEL_ID, max_tokens=1, messages=QUESTION, **GREEDY)  # type: ignore[arg-type]
    whole = claude.messages.create(model=MODEL_ID, max_tokens=16, messages=QUESTION, **GREEDY)  # type: ignore[arg-type]
    with claude.messages.stream(model=MODEL_ID, max_tokens=16, messages=QUESTION, **GREEDY) as stream:  # type: ignore[arg-type]
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == final.content[0].text == whole.content[0].text  # type: ignore[union-attr]
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens
    assert final.id.startswith("msg_")


def test_raw_event_sequence(server: ServerThread) -> None:
    """Anthropic's events in order, each named (`event:`) as the SDK requires, `ping` included."""
    body = {"model": MODEL_ID, "max_tokens": 16, "messages": QUESTION, "stream": True, "temperature": 0}
    headers = {"x-api-key": API_KEY, "anthropic-version": "2023-06-01", "anthropic-beta": "tools-2024-04-04"}
    with httpx.stream("POST", f"{server.base_url}/v1/messages", json=body, headers=headers, timeout=60) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        blocks = response.read().decode().strip().split("\n\n")
    events = []
    for block in blocks:
        name_line, data_line = block.split("\n")
        name, data = name_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))
        assert data["type"] == name
        events.append(data)
    kinds = [e["type"] for e in events]
    num_deltas = kinds.count("content_block_delta")
    assert kinds == [
        "message_start",
        "ping",
        "content_block_start",
        *["content_block_delta"] * num_deltas,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] > 0
    assert events[2]["content_block"] == {"type": "text", "text": ""} and events[2]["index"] == 0
    assert all(e["delta"]["type"] == "text_delta" for e in events if e["type"] == "content_block_delta")
    assert (
        events[-2]["delta"]["stop_reason"] in ("end_turn", "max_tokens") and events[-2]["usage"]["output_tokens"] >= 1
    )


def test_stop_sequences(claude: anthropic.Anthropic) -> None:
    message = claude.messages.create(
        model=MODEL_ID,
        max_tokens=32,
        messages=QUESTION,
        stop_sequences=["\n", " "],
        **GREEDY,  # type: ignore[arg-type]
    )
    assert message.stop_reason == "stop_sequence" and message.stop_sequence in ("\n", " ")
    with claude.messages.stream(
        model=MODEL_ID,
        max_tokens=32,
        messages=QUESTION,
        stop_sequences=["\n", " "],
        **GREEDY,  # type: ignore[arg-type]
    ) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == message.stop_sequence


def test_forced_tool_use_and_a_tool_result_round_trip(claude: anthropic.Anthropic) -> None:
    ask: Any = [{"role": "user", "content": "What is the weather like in Paris today?"}]
    choice: Any = {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}
    first = claude.messages.create(
        model=MODEL_ID,
        max_tokens=200,
        messages=ask,
        tools=[TOOL],
        tool_choice=choice,
        **GREEDY,  # type: ignore[arg-type]
    )
    assert first.stop_reason == "tool_use"
    (use,) = first.content
    assert use.type == "tool_use" and use.name == "get_weather" and use.id.startswith("toolu_")
    assert matches(TOOL["input_schema"], use.input)
    history: Any = [
        *ask,
        {"role": "assistant", "content": [block.model_dump() for block in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18 degrees, sunny"}]},
    ]
    second = claude.messages.create(model=MODEL_ID, max_tokens=32, messages=history, tools=[TOOL], **GREEDY)  # type: ignore[arg-type]
    assert second.content and second.stop_reason in ("end_turn", "max_tokens", "tool_use")
    with_result = claude.messages.count_tokens(model=MODEL_ID, messages=history, tools=[TOOL])  # type: ignore[arg-type]
    alone = claude.messages.count_tokens(model=MODEL_ID, messages=ask, tools=[TOOL])  # type: ignore[arg-type]
    assert with_result.input_tokens > alone.input_tokens + 20  # the call and its result are in the prompt


def test_streamed_tool_use(claude: anthropic.Anthropic) -> None:
    ask: Any = [{"role": "user", "content": "What is the weather like in Paris today?"}]
    choice: Any = {"type": "any", "disable_parallel_tool_use": True}
    with claude.messages.stream(
        model=MODEL_ID,
        max_tokens=200,
        messages=ask,
        tools=[TOOL],
        tool_choice=choice,
        **GREEDY,  # type: ignore[arg-type]
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    (use,) = final.content
    assert use.type == "tool_use" and matches(TOOL["input_schema"], use.input)
    partial = "".join(e.delta.partial_json for e in events if e.type == "content_block_delta")  # type: ignore[union-attr]
    assert json.loads(partial) == use.input


def test_errors_have_anthropic_shape_and_classes(claude: anthropic.Anthropic, server: ServerThread) -> None:
    # A model this server does not serve is its only model, as llama-server answers Claude Code's names.
    served = claude.messages.create(model="claude-sonnet-4-5", max_tokens=4, messages=QUESTION)  # type: ignore[arg-type]
    assert served.model == MODEL_ID
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude.messages.create(model=MODEL_ID, max_tokens=-1, messages=QUESTION)  # type: ignore[arg-type]
    assert bad.value.status_code == 400
    assert bad.value.body["type"] == "error" and bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    wrong = anthropic.Anthropic(base_url=server.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as denied:
        wrong.messages.create(model=MODEL_ID, max_tokens=4, messages=QUESTION)  # type: ignore[arg-type]
    assert denied.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude.messages.create(model=MODEL_ID, max_tokens=4, messages=[], **GREEDY)
    assert bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    response = httpx.post(
        f"{server.base_url}/v1/messages", json={"model": MODEL_ID, "messages": QUESTION}, headers={"x-api-key": API_KEY}
    )
    assert response.status_code == 400 and "max_tokens" in response.json()["error"]["message"]
    image: Any = [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}]
    with pytest.raises(anthropic.BadRequestError, match="not supported"):
        claude.messages.create(model=MODEL_ID, max_tokens=4, messages=image)


def test_full_queue_is_overloaded_529(small_server: ServerThread) -> None:
    """One slot and a queue of one: the third request is Anthropic's overloaded error."""
    long_run = json.dumps(
        {"model": MODEL_ID, "messages": QUESTION, "max_tokens": 900, "stream": True, "ignore_eos": True}
    ).encode()
    held: list[socket.socket] = []
    client = anthropic.Anthropic(base_url=small_server.base_url, api_key="unused", max_retries=0)
    try:
        for expected in (1, 2):
            held.append(open_raw_stream(small_server.port, "/v1/chat/completions", long_run))
            assert small_server.wait_in_flight(lambda n, e=expected: n == e, timeout=10) == expected
        with pytest.raises(anthropic.OverloadedError) as overloaded:
            client.messages.create(model=MODEL_ID, max_tokens=4, messages=QUESTION)  # type: ignore[arg-type]
        assert overloaded.value.status_code == 529
        assert overloaded.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
        assert int(overloaded.value.response.headers["Retry-After"]) >= 1
    finally:
        for sock in held:
            sock.close()
    assert small_server.wait_in_flight(lambda n: n == 0, timeout=5) == 0


def test_failure_mid_stream_is_an_error_event(small_server: ServerThread) -> None:
    client = anthropic.Anthropic(base_url=small_server.base_url, api_key="unused", max_retries=0)
    set_fault(small_server, FailAfter(4))
    try:
        stream = client.messages.stream(model=MODEL_ID, max_tokens=64, messages=QUESTION)  # type: ignore[arg-type]
        with pytest.raises(anthropic.APIStatusError, match="injected fault"), stream as events:
            for _ in events:
                pass
    finally:
        set_fault(small_server, None)
    assert small_server.wait_in_flight(lambda n: n == 0, timeout=3) == 0


def test_priority_extension(claude: anthropic.Anthropic) -> None:
    message = claude.messages.create(
        model=MODEL_ID,
        max_tokens=4,
        messages=QUESTION,
        metadata={"user_id": "u1"},
        extra_body={"priority": "batch"},  # type: ignore[arg-type]
    )
    assert message.content
    with pytest.raises(anthropic.BadRequestError, match="priority"):
        claude.messages.create(model=MODEL_ID, max_tokens=4, messages=QUESTION, extra_body={"priority": "soon"})  # type: ignore[arg-type]
