"""Every error a client can meet, in OpenAI's envelope with the right status
(or, on their routes, Ollama's and Anthropic's shapes).

What validation refuses needs no model: those tests send their requests to
the app through aiohttp's test client (`edge`), over a model registry whose
engine holds no model. The tests marked `slow` need a model's answers, its
tokenizer or the engine's limits, and use the real servers of conftest.py.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from aiohttp.test_utils import TestClient

from localserve.api.app import create_app
from localserve.engine.engine import Engine, EngineConfig
from localserve.engine.step.faults import EVERY_STEP, FaultInjectingBackend
from localserve.models.registry import ModelRegistry
from tests.api.harness import API_KEY, MODEL_ID, ServerThread, make_settings, open_raw_stream

slow = pytest.mark.slow

HELLO = [{"role": "user", "content": "Hello"}]

Edge = Callable[..., Awaitable[TestClient]]


@pytest.fixture
def edge(aiohttp_client: Any, tmp_path: Path) -> Edge:
    """Makes a test client of the app with no model behind it (settings as
    `make_settings`' but no start-up model, and `overrides`); the client
    sends the API key, if there is one."""

    async def make(**overrides: Any) -> TestClient:
        settings = make_settings(**{"models": [], "api_key": API_KEY, "data_dir": str(tmp_path), **overrides})
        app = create_app(settings, ModelRegistry(Engine(EngineConfig()), settings))
        headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
        return await aiohttp_client(app, headers=headers)

    return make


@pytest.fixture
async def api(edge: Edge) -> TestClient:
    return await edge()


def envelope(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    return error


async def edge_envelope(response: Any, status: int) -> dict[str, Any]:
    """`envelope` for an aiohttp test client's response."""
    text = await response.text()
    assert response.status == status, text
    assert response.headers["Content-Type"].startswith("application/json")
    error: dict[str, Any] = json.loads(text)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    return error


async def test_malformed_json(api: TestClient) -> None:
    response = await api.post(
        "/v1/chat/completions", data=b'{"model": "x", "messages": [', headers={"Content-Type": "application/json"}
    )
    error = await edge_envelope(response, 400)
    assert error["type"] == "invalid_request_error"
    assert "JSON" in error["message"]


@pytest.mark.parametrize("body", [b"", b"[1, 2]", b"\xff\xfe"])
async def test_body_not_a_json_object(api: TestClient, body: bytes) -> None:
    await edge_envelope(await api.post("/v1/chat/completions", data=body), 400)


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
async def test_invalid_chat_fields(api: TestClient, body: dict[str, Any], param: str) -> None:
    error = await edge_envelope(await api.post("/v1/chat/completions", json=body), 400)
    assert error["param"] == param
    assert param.split("[")[0] in error["message"]


async def test_missing_field_message(api: TestClient) -> None:
    error = await edge_envelope(await api.post("/v1/chat/completions", json={"model": MODEL_ID}), 400)
    assert error["message"] == "Missing required parameter: 'messages'."


async def test_image_parts_refused(api: TestClient) -> None:
    parts = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": parts}]}
    error = await edge_envelope(await api.post("/v1/chat/completions", json=body), 400)
    assert error["param"] == "messages[0].content"
    assert "image_url" in error["message"]


@slow
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


@slow
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


@slow
def test_bad_json_schema(http: httpx.Client) -> None:
    body = {
        "model": MODEL_ID,
        "messages": HELLO,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}},
    }
    error = envelope(http.post("/v1/chat/completions", json=body), 400)
    assert error["param"].startswith("response_format")


@slow
def test_unknown_model_is_the_only_model_but_not_in_v1_models(client: openai.OpenAI) -> None:
    # As llama-server: with one chat model, a name it does not serve means that model
    # (a 404 with --strict-model-names: tests/api/test_llamacpp_native.py).
    reply = client.chat.completions.create(model="no-such-model", messages=HELLO, max_tokens=2)
    assert reply.model == MODEL_ID
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("no-such-model")
    assert caught.value.code == "model_not_found" and "no-such-model" in caught.value.message


@pytest.mark.parametrize("model_id", ["%7Bbraces%7D", "a%5Cb", "..%2Fetc"])
async def test_a_model_id_with_odd_characters_is_a_clear_400_not_a_405(api: TestClient, model_id: str) -> None:
    error = await edge_envelope(await api.get(f"/v1/models/{model_id}"), 400)
    assert error["param"] == "model" and "invalid model id" in error["message"]


@pytest.mark.parametrize("model_id", ["org/no-such-model", "a%2Fb"])
async def test_an_org_repo_name_that_is_nowhere_is_a_404(api: TestClient, model_id: str) -> None:
    # org/repo is how Hugging Face models are named (models/names.py): valid, just not here
    error = await edge_envelope(await api.get(f"/v1/models/{model_id}"), 404)
    assert error["param"] == "model"


@slow
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


async def test_unknown_route_and_wrong_method(api: TestClient) -> None:
    error = await edge_envelope(await api.get("/v1/no-such-route"), 404)
    assert "/v1/no-such-route" in error["message"]
    response = await api.get("/v1/chat/completions")
    error = await edge_envelope(response, 405)
    assert "POST" in response.headers["Allow"]
    assert error["code"] == "method_not_allowed"


async def test_each_dialect_answers_errors_in_its_own_shape(edge: Edge) -> None:
    """One error middleware: OpenAI's envelope, Ollama's `{"error": "..."}`
    on its routes, Anthropic's `{"type": "error", ...}` on the Messages
    routes; the same statuses and headers everywhere."""
    api = await edge()
    bad_json = {"data": b"{", "headers": {"Content-Type": "application/json"}}
    response = await api.post("/api/chat", **bad_json)
    assert response.status == 400 and set(await response.json()) == {"error"}
    response = await api.get("/api/chat")
    assert response.status == 405 and "POST" in response.headers["Allow"]
    assert "is not allowed" in (await response.json())["error"]
    response = await api.post("/v1/messages", **bad_json)
    body = await response.json()
    assert response.status == 400 and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error" and "JSON" in body["error"]["message"]
    await edge_envelope(await api.post("/v1/chat/completions", **bad_json), 400)
    no_key = {"Authorization": ""}
    response = await api.get("/api/tags", headers=no_key)
    assert response.status == 401 and set(await response.json()) == {"error"}
    response = await api.post("/v1/messages", json={}, headers=no_key)
    assert response.status == 401 and (await response.json())["error"]["type"] == "authentication_error"


@slow
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


async def test_no_key_needed_without_api_key(edge: Edge) -> None:
    api = await edge(api_key=None)
    assert (await api.get("/v1/models")).status == 200


async def test_body_too_large_413(edge: Edge) -> None:
    api = await edge(max_body_bytes=64 * 1024)
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "x" * 100_000}]}
    error = await edge_envelope(await api.post("/v1/chat/completions", json=body), 413)
    assert error["code"] == "payload_too_large"
    assert str(64 * 1024) in error["message"]


@slow
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


@slow
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


@slow
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


@slow
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
