"""`POST /v1/responses` (OpenAI's Responses API, stateless) through the
official `openai` SDK against the shared real server (SmolLM2): whole and
streamed answers, the exact event sequence, tool calls and a
function_call_output round trip, `text.format`, the token limit, refusals
of server-side state, cancellation, the Batch API, /openapi.json and /metrics."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import openai
import pytest

from tests.api.harness import MODEL_ID, ServerThread, open_raw_stream, read_until
from tests.api.test_batches import upload, wait_done
from tests.api.test_errors import FailAfter, set_fault
from tests.api.test_tools import WEATHER, matches

pytestmark = pytest.mark.slow

QUESTION = "What is the capital of France? Answer in one word."
FUNCTION = {"type": "function", **WEATHER["function"]}  # the Responses API's flat function tool
GREEDY: dict[str, Any] = {"temperature": 0}


def test_whole_response(client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL_ID, input=QUESTION, max_output_tokens=16, **GREEDY)
    assert response.object == "response" and response.id.startswith("resp_") and response.model == MODEL_ID
    assert response.status in ("completed", "incomplete")
    (item,) = response.output
    assert item.type == "message" and item.role == "assistant" and item.id.startswith("msg_")
    assert item.content[0].type == "output_text"
    assert "paris" in response.output_text.lower() and response.output_text == item.content[0].text
    usage = response.usage
    assert usage is not None and usage.input_tokens > 5 and 1 <= usage.output_tokens <= 16
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens


def test_instructions_and_message_items(client: openai.OpenAI) -> None:
    items: Any = [
        {"role": "developer", "content": "Answer with one word."},
        {"role": "user", "content": [{"type": "input_text", "text": "Name a color."}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Blue."}]},
        {"type": "message", "role": "user", "content": "Another one."},
    ]
    response = client.responses.create(
        model=MODEL_ID, instructions="Be brief.", input=items, max_output_tokens=8, **GREEDY
    )
    assert response.output_text and response.instructions == "Be brief."
    plain = client.responses.create(model=MODEL_ID, input="Another one.", max_output_tokens=8, **GREEDY)
    assert response.usage is not None and plain.usage is not None
    assert response.usage.input_tokens > plain.usage.input_tokens + 10  # the whole history is in the prompt


def test_stream_event_sequence(client: openai.OpenAI) -> None:
    # The prompt into the prefix cache first, so that both answers compared below read it alike
    # (a whole prompt and its last token alone round differently: README, Sampling defaults).
    client.responses.create(model=MODEL_ID, input=QUESTION, max_output_tokens=16, **GREEDY)
    whole = client.responses.create(model=MODEL_ID, input=QUESTION, max_output_tokens=16, **GREEDY)
    events = list(client.responses.create(model=MODEL_ID, input=QUESTION, max_output_tokens=16, stream=True, **GREEDY))
    kinds = [e.type for e in events]
    num_deltas = kinds.count("response.output_text.delta")
    last = "response.completed" if whole.status == "completed" else "response.incomplete"
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * num_deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        last,
    ]
    assert num_deltas >= 1
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = next(e for e in events if e.type == "response.output_text.done")
    final = events[-1].response
    assert text == done.text == final.output_text == whole.output_text
    item_ids = {e.item_id for e in events if hasattr(e, "item_id")}
    assert item_ids == {final.output[0].id}
    assert final.usage is not None and final.usage.output_tokens == whole.usage.output_tokens  # type: ignore[union-attr]


def test_token_limit_is_incomplete(client: openai.OpenAI) -> None:
    story = "Tell me a long story about a dragon."
    response = client.responses.create(model=MODEL_ID, input=story, max_output_tokens=3, **GREEDY)
    assert response.status == "incomplete" and response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None and response.usage.output_tokens == 3
    events = list(client.responses.create(model=MODEL_ID, input=story, max_output_tokens=3, stream=True, **GREEDY))
    assert events[-1].type == "response.incomplete" and events[-1].response.status == "incomplete"
    assert events[-2].type == "response.output_item.done" and events[-2].item.status == "incomplete"


def _call(response: Any) -> Any:
    calls = [item for item in response.output if item.type == "function_call"]
    assert calls, response.output
    return calls[0]


def test_forced_tool_call_and_a_result_round_trip(client: openai.OpenAI) -> None:
    ask = "What is the weather like in Paris today?"
    named: Any = {"type": "function", "name": "get_weather"}
    first = client.responses.create(
        model=MODEL_ID,
        input=ask,
        tools=[FUNCTION],
        tool_choice=named,
        parallel_tool_calls=False,  # one call, then the grammar ends the answer
        max_output_tokens=200,
        **GREEDY,
    )
    call = _call(first)
    assert first.status == "completed" and call.name == "get_weather" and call.status == "completed"
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    assert matches(WEATHER["function"]["parameters"], json.loads(call.arguments))
    assert first.output_text == ""
    history: Any = [
        {"role": "user", "content": ask},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "18 degrees and sunny"},
    ]
    second = client.responses.create(
        model=MODEL_ID, input=history, tools=[FUNCTION], tool_choice="none", max_output_tokens=32, **GREEDY
    )
    assert [item.type for item in second.output] == ["message"] and second.output_text
    alone = client.responses.create(
        model=MODEL_ID, input=ask, tools=[FUNCTION], tool_choice="none", max_output_tokens=1, **GREEDY
    )
    assert second.usage is not None and alone.usage is not None
    assert second.usage.input_tokens > alone.usage.input_tokens + 20  # the call and its result are in the prompt


def test_streamed_tool_call_events(client: openai.OpenAI) -> None:
    events = list(
        client.responses.create(
            model=MODEL_ID,
            input="What is the weather like in Paris today?",
            tools=[FUNCTION],
            tool_choice="required",
            parallel_tool_calls=False,
            max_output_tokens=200,
            stream=True,
            **GREEDY,
        )
    )
    kinds = [e.type for e in events]
    num_deltas = kinds.count("response.function_call_arguments.delta")
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * num_deltas,
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    added, done = events[2].item, events[-2].item
    assert added.type == "function_call" and added.status == "in_progress" and added.arguments == ""
    arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert arguments == events[-3].arguments == done.arguments
    assert done.call_id == added.call_id and done.name == "get_weather" and done.status == "completed"
    assert matches(WEATHER["function"]["parameters"], json.loads(arguments))
    assert _call(events[-1].response).call_id == added.call_id


def test_json_schema_format(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}, "country": {"type": "string", "maxLength": 30}},
        "required": ["city", "country"],
        "additionalProperties": False,
    }
    response = client.responses.create(
        model=MODEL_ID,
        input="Name a city and its country, as JSON.",
        text={"format": {"type": "json_schema", "name": "place", "schema": schema, "strict": True}},
        max_output_tokens=100,
        **GREEDY,
    )
    assert response.status == "completed"
    assert matches(schema, json.loads(response.output_text))
    assert response.text is not None and response.text.format.type == "json_schema"


@pytest.mark.parametrize(
    ("extra", "param", "words"),
    [
        ({"previous_response_id": "resp_123"}, "previous_response_id", "stateless"),
        ({"store": True}, "store", "stateless"),
        ({"conversation": "conv_1"}, "conversation", "stateless"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]", "stateless"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, None, "text only"),
        ({"tools": [FUNCTION], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice", "not in"),
        ({"priority": "urgent"}, "priority", "priority"),
    ],
)
def test_refused_with_a_clear_400(http: httpx.Client, extra: dict[str, Any], param: str | None, words: str) -> None:
    body = {"model": MODEL_ID, "input": "Hi", "max_output_tokens": 4, **extra}
    response = http.post("/v1/responses", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert words in error["message"] and error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param


def test_store_false_and_priority_are_accepted(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model=MODEL_ID, input="Hi", store=False, max_output_tokens=4, extra_body={"priority": "interactive"}
    )
    assert response.store is False and response.output_text is not None


def test_an_unknown_model_means_the_only_model(client: openai.OpenAI) -> None:
    response = client.responses.create(model="no-such-model", input="Hi", max_output_tokens=16)
    assert response.model == MODEL_ID


def test_client_that_leaves_cancels(server: ServerThread) -> None:
    body = json.dumps({"model": MODEL_ID, "input": "Count to a thousand.", "max_output_tokens": 1500, "stream": True})
    sock = open_raw_stream(server.port, "/v1/responses", body.encode(), {"Authorization": "Bearer test-key-1234"})
    try:
        assert b"response.output_text.delta" in read_until(sock, b"response.output_text.delta")
    finally:
        sock.close()
    assert server.wait_in_flight(lambda n: n == 0, timeout=10) == 0


def test_responses_as_a_batch_endpoint(client: openai.OpenAI) -> None:
    lines = [
        {"custom_id": f"r{i}", "method": "POST", "url": "/v1/responses",
         "body": {"model": MODEL_ID, "input": f"Say the number {i}.", "max_output_tokens": 6, "stream": True}}
        for i in range(3)
    ]  # fmt: skip
    lines.append({"custom_id": "bad", "method": "POST", "url": "/v1/responses",
                  "body": {"model": MODEL_ID, "input": "Hi", "previous_response_id": "resp_1"}})  # fmt: skip
    batch = client.batches.create(
        input_file_id=upload(client, lines), endpoint="/v1/responses", completion_window="24h"
    )
    batch = wait_done(client, batch.id)
    assert batch.status == "completed" and batch.endpoint == "/v1/responses"
    assert (batch.request_counts.completed, batch.request_counts.failed) == (3, 1)
    assert batch.usage.input_tokens > 0 and batch.usage.output_tokens > 0
    output = [json.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines()]  # type: ignore[arg-type]
    assert sorted(o["custom_id"] for o in output) == ["r0", "r1", "r2"]
    for o in output:
        body = o["response"]["body"]
        assert body["object"] == "response" and body["status"] in ("completed", "incomplete")
        assert o["response"]["request_id"] == body["id"]
    (error,) = [json.loads(line) for line in client.files.content(batch.error_file_id).text.splitlines()]  # type: ignore[arg-type]
    assert error["response"]["status_code"] == 400 and "stateless" in error["response"]["body"]["error"]["message"]


def test_routes_in_openapi_and_metrics(http: httpx.Client, client: openai.OpenAI) -> None:
    client.responses.create(model=MODEL_ID, input="Hi", max_output_tokens=2)
    paths = http.get("/openapi.json").json()["paths"]
    for path in ("/v1/responses", "/v1/messages", "/v1/messages/count_tokens"):
        assert "post" in paths[path], path
    assert "text/event-stream" in paths["/v1/responses"]["post"]["responses"]["200"]["content"]
    deadline = time.monotonic() + 5
    while 'endpoint="/v1/responses"' not in (metrics := http.get("/metrics").text) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert f'localserve_requests_total{{endpoint="/v1/responses",model="{MODEL_ID}",status="200"}}' in metrics


def test_failure_mid_stream_is_an_error_then_response_failed(small_server: ServerThread) -> None:
    set_fault(small_server, FailAfter(4))  # prefill + a few tokens, then failure
    try:
        body = {"model": MODEL_ID, "input": QUESTION, "max_output_tokens": 64, "stream": True}
        with httpx.stream("POST", f"{small_server.base_url}/v1/responses", json=body, timeout=30) as response:
            assert response.status_code == 200
            events = [json.loads(line[len("data: ") :]) for line in response.iter_lines() if line.startswith("data: ")]
    finally:
        set_fault(small_server, None)
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert events[-2]["code"] == "backend_error" and "injected fault" in events[-2]["message"]
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "backend_error"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert small_server.wait_in_flight(lambda n: n == 0, timeout=3) == 0
