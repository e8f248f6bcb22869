"""Every error a client can meet, in OpenAI's envelope with the right status."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from localserve.engine.faults import EVERY_STEP, FaultInjectingBackend
from tests.api.harness import API_KEY, MODEL_ID, ServerThread, open_raw_stream

pytestmark = pytest.mark.slow

HELLO = [{"role": "user", "content": "Hello"}]


def envelope(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    return error


def test_malformed_json(http: httpx.Client) -> None:
    response = http.post(
        "/v1/chat/completions", content=b'{"model": "x", "messages": [', headers={"Content-Type": "application/json"}
    )
    error = envelope(response, 400)
    assert error["type"] == "invalid_request_error"
    assert "JSON" in error["message"]


@pytest.mark.parametrize("body", [b"", b"[1, 2]", b"\xff\xfe"])
def test_body_not_a_json_object(http: httpx.Client, body: bytes) -> None:
    envelope(http.post("/v1/chat/completions", content=body), 400)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL_ID}, "messages"),
        ({"messages": HELLO}, "model"),
        ({"model": MODEL_ID, "messages": []}, "messages"),
        ({"model": MODEL_ID, "messages": HELLO, "temperature": 3}, "temperature"),
        ({"model": MODEL_ID, "messages": HELLO, "n": 17}, "n"),
        ({"model": MODEL_ID, "messages": HELLO, "top_logprobs": 2}, "top_logprobs"),
        ({"model": MODEL_ID, "messages": HELLO, "stop": ["x"] * 17}, "stop"),
        ({"model": MODEL_ID, "messages": HELLO, "priority": "urgent"}, "priority"),
        ({"model": MODEL_ID, "messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ],
)
def test_invalid_chat_fields(http: httpx.Client, body: dict[str, Any], param: str) -> None:
    error = envelope(http.post("/v1/chat/completions", json=body), 400)
    assert error["param"] == param
    assert param.split("[")[0] in error["message"]


def test_missing_field_message(http: httpx.Client) -> None:
    error = envelope(http.post("/v1/chat/completions", json={"model": MODEL_ID}), 400)
    assert error["message"] == "Missing required parameter: 'messages'."


def test_image_parts_refused(http: httpx.Client) -> None:
    parts = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": parts}]}
    error = envelope(http.post("/v1/chat/completions", json=body), 400)
    assert error["param"] == "messages[0].content"
    assert "image_url" in error["message"]


def test_text_parts_equal_plain_content(client: openai.OpenAI) -> None:
    parts = [{"type": "text", "text": "What is the capital "}, {"type": "text", "text": "of France?"}]
    answers = [
        client.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": content}], max_tokens=8, temperature=0
        )
        .choices[0]
        .message.content
        for content in (parts, "What is the capital of France?")
    ]
    assert answers[0] == answers[1]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"suffix": "return x"}, "suffix"),
        ({"prompt": [1, "a"]}, "prompt"),
        ({"prompt": [10**9]}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"echo": True, "logprobs": 1}, "logprobs"),
        ({"logit_bias": {"999999999": 1}}, "logit_bias"),
    ],
)
def test_invalid_completion_fields(http: httpx.Client, extra: dict[str, Any], param: str) -> None:
    body = {"model": MODEL_ID, "prompt": "Hi", **extra}
    error = envelope(http.post("/v1/completions", json=body), 400)
    assert error["param"] == param


def test_bad_json_schema(http: httpx.Client) -> None:
    body = {
        "model": MODEL_ID,
        "messages": HELLO,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}},
    }
    error = envelope(http.post("/v1/chat/completions", json=body), 400)
    assert error["param"].startswith("response_format")


def test_unknown_model_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="no-such-model", messages=HELLO)
    assert caught.value.status_code == 404
    assert caught.value.code == "model_not_found"
    assert "no-such-model" in caught.value.message
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


@pytest.mark.parametrize("model_id", ["%7Bbraces%7D", "a%5Cb", "..%2Fetc"])
def test_a_model_id_with_odd_characters_is_a_clear_400_not_a_405(http: httpx.Client, model_id: str) -> None:
    error = envelope(http.get(f"/v1/models/{model_id}"), 400)
    assert error["param"] == "model" and "invalid model id" in error["message"]


@pytest.mark.parametrize("model_id", ["org/no-such-model", "a%2Fb"])
def test_an_org_repo_name_that_is_nowhere_is_a_404(http: httpx.Client, model_id: str) -> None:
    # org/repo is how Hugging Face models are named (models/names.py): valid, just not here
    error = envelope(http.get(f"/v1/models/{model_id}"), 404)
    assert error["param"] == "model"


def test_prompt_longer_than_context_400(client: openai.OpenAI, server: ServerThread) -> None:
    long_text = "hello world " * 2000  # about 4000 tokens, context is 2048
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": long_text}])
    assert caught.value.code == "context_length_exceeded"
    assert str(server.settings.ctx_size) in caught.value.message
    assert caught.value.param == "messages"
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL_ID, prompt=long_text)
    assert caught.value.param == "prompt"
    assert str(server.settings.ctx_size) in caught.value.message


def test_unknown_route_and_wrong_method(http: httpx.Client) -> None:
    error = envelope(http.get("/v1/no-such-route"), 404)
    assert "/v1/no-such-route" in error["message"]
    response = http.get("/v1/chat/completions")
    error = envelope(response, 405)
    assert "POST" in response.headers["Allow"]
    assert error["code"] == "method_not_allowed"


def test_api_key(server: ServerThread) -> None:
    url = f"{server.base_url}/v1/models"
    error = envelope(httpx.get(url), 401)
    assert error["type"] == "authentication_error"
    envelope(httpx.get(url, headers={"Authorization": "Bearer wrong"}), 401)
    envelope(httpx.get(url, headers={"Authorization": f"Basic {API_KEY}"}), 401)
    envelope(httpx.post(f"{server.base_url}/v1/chat/completions", json={}), 401)
    assert httpx.get(url, headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 200
    assert httpx.get(f"{server.base_url}/health").json() == {"status": "ok"}
    wrong = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.create(model=MODEL_ID, messages=HELLO)


def test_no_key_needed_without_api_key(small_server: ServerThread) -> None:
    assert httpx.get(f"{small_server.base_url}/v1/models").status_code == 200


def test_body_too_large_413(small_server: ServerThread) -> None:
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "x" * 100_000}]}
    response = httpx.post(f"{small_server.base_url}/v1/chat/completions", json=body, timeout=30)
    error = envelope(response, 413)
    assert error["code"] == "payload_too_large"
    assert str(64 * 1024) in error["message"]


def test_queue_full_503(small_server: ServerThread) -> None:
    """One slot and a queue of one: a third request is refused with 503 and
    Retry-After; the two held requests end when their clients leave."""
    long_run = json.dumps(
        {"model": MODEL_ID, "messages": HELLO, "max_tokens": 900, "stream": True, "extra": 1, "ignore_eos": True}
    ).encode()
    held: list[socket.socket] = []
    try:
        for expected in (1, 2):
            held.append(open_raw_stream(small_server.port, "/v1/chat/completions", long_run))
            assert small_server.wait_in_flight(lambda n, e=expected: n == e, timeout=10) == expected
        response = httpx.post(
            f"{small_server.base_url}/v1/chat/completions",
            json={"model": MODEL_ID, "messages": HELLO, "max_tokens": 4},
            timeout=30,
        )
        error = envelope(response, 503)
        assert error["code"] == "queue_full"
        assert int(response.headers["Retry-After"]) >= 1
    finally:
        for sock in held:
            sock.close()
    # The waiting request left too: handler cancellation aborted it in the queue.
    assert small_server.wait_in_flight(lambda n: n == 0, timeout=3) == 0


def test_unexpected_error_is_a_500_envelope(client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug")

    # Same process: the server thread's handler sees the patched formatter.
    monkeypatch.setattr("localserve.serving.openai.chat.chat_completion", broken)
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model=MODEL_ID, messages=HELLO, max_tokens=2)
    assert caught.value.status_code == 500
    assert "a bug" not in caught.value.message  # internals stay in the log
    monkeypatch.undo()
    assert client.chat.completions.create(model=MODEL_ID, messages=HELLO, max_tokens=2).choices


@dataclass(frozen=True)
class FailAfter:
    """A fault for `set_fault`: every step from the n-th on fails."""

    num_good_steps: int


def set_fault(srv: ServerThread, fault: FailAfter | None) -> None:
    """Arm (or, with None, clear) a fault in the steps of `srv`'s model: it
    runs through a `FaultInjectingBackend` (`small_server` enables faults)."""
    backend = srv.call(lambda: srv.engine.backend(MODEL_ID))
    assert isinstance(backend, FaultInjectingBackend)
    if fault is None:
        backend.clear()
    else:
        backend.fail_steps(EVERY_STEP, after=fault.num_good_steps)


def test_backend_error_before_output_is_a_500(small_server: ServerThread) -> None:
    set_fault(small_server, FailAfter(0))
    try:
        for stream in (False, True):
            body = {"model": MODEL_ID, "messages": HELLO, "max_tokens": 8, "stream": stream}
            response = httpx.post(f"{small_server.base_url}/v1/chat/completions", json=body, timeout=30)
            error = envelope(response, 500)
            assert error["code"] == "backend_error"
            assert "injected fault" in error["message"]
    finally:
        set_fault(small_server, None)


def test_backend_error_mid_stream_is_an_sse_error(small_server: ServerThread) -> None:
    sdk = openai.OpenAI(base_url=f"{small_server.base_url}/v1", api_key="unused", max_retries=0)
    set_fault(small_server, FailAfter(4))  # prefill + a few tokens, then failure
    try:
        body = {"model": MODEL_ID, "messages": HELLO, "max_tokens": 64, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", f"{small_server.base_url}/v1/chat/completions", json=body, timeout=30) as response:
            assert response.status_code == 200
            events = [line for line in response.iter_lines() if line]
        assert events[-1].startswith('data: {"error"')
        assert "[DONE]" not in "".join(events)
        error = json.loads(events[-1][len("data: ") :])["error"]
        assert error["code"] == "backend_error"
        assert any('"content":"' in e and '"content":""' not in e for e in events[:-1])  # tokens came first
        # The choice ends with an error finish reason before the error event.
        assert json.loads(events[-2][len("data: ") :])["choices"][0]["finish_reason"] == "error"
        set_fault(small_server, FailAfter(3))
        stream = sdk.chat.completions.create(
            model=MODEL_ID, messages=HELLO, max_tokens=64, stream=True, extra_body={"ignore_eos": True}
        )
        with pytest.raises(openai.APIError, match="injected fault"):
            for _ in stream:
                pass
    finally:
        set_fault(small_server, None)
    assert small_server.wait_in_flight(lambda n: n == 0, timeout=3) == 0
