"""Backend failure isolation: an exception inside one engine step (armed
through the test-only `POST /api/v1/debug/fault`) fails the requests of that
step, and only those; the server goes on serving."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import httpx
import pytest

from tests.api.harness import MODEL_ID, ServerThread
from tests.reliability.conftest import start_server_thread

pytestmark = pytest.mark.slow

LONG = {"max_tokens": 900, "ignore_eos": True}


@pytest.fixture(scope="module")
def fault_server() -> Iterator[ServerThread]:
    """One slot, so a second request waits outside the running step."""
    srv = start_server_thread(faults=True, parallel=1, max_queue=8, ctx_size=1024, kv_size=1024)
    try:
        yield srv
    finally:
        srv.stop()


def chat(text: str, **extra: object) -> dict[str, object]:
    return {"model": MODEL_ID, "messages": [{"role": "user", "content": text}], **extra}


def arm(srv: ServerThread, steps: int = 1) -> None:
    armed = httpx.post(f"{srv.base_url}/api/v1/debug/fault", json={"model": MODEL_ID, "steps": steps}, timeout=30)
    assert armed.status_code == 200, armed.text


def test_the_fault_route_validates_and_is_documented(fault_server: ServerThread) -> None:
    url = f"{fault_server.base_url}/api/v1/debug/fault"
    assert httpx.post(url, json={"model": MODEL_ID, "steps": 0}, timeout=30).status_code == 400
    assert httpx.post(url, json={"model": "no-such-model"}, timeout=30).status_code == 404
    doc = httpx.get(f"{fault_server.base_url}/openapi.json", timeout=30).json()
    body = doc["paths"]["/api/v1/debug/fault"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["$ref"].endswith("/FaultRequest")


def test_a_failed_step_is_a_500_envelope_and_the_next_request_is_served(fault_server: ServerThread) -> None:
    arm(fault_server)
    failed = httpx.post(f"{fault_server.base_url}/v1/chat/completions", json=chat("Hi", max_tokens=8), timeout=120)
    assert failed.status_code == 500, failed.text
    error = failed.json()["error"]
    assert error["type"] == "server_error" and error["code"] == "backend_error"
    assert "injected fault" in error["message"]
    ok = httpx.post(f"{fault_server.base_url}/v1/chat/completions", json=chat("Hi", max_tokens=8), timeout=120)
    assert ok.status_code == 200, ok.text
    assert ok.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_only_the_faulty_steps_requests_fail(fault_server: ServerThread) -> None:
    """A streams in the only slot; B waits for it. The faulty step holds A
    alone: A gets the SSE error event, B (not in that step) completes."""
    base = fault_server.base_url
    events: list[str] = []
    first_token = threading.Event()

    def stream_a() -> None:
        with httpx.stream(
            "POST", f"{base}/v1/chat/completions", json=chat("Write a long essay.", stream=True, **LONG), timeout=300
        ) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    if '"content":"' in line and '"content":""' not in line:
                        first_token.set()
        first_token.set()

    a = threading.Thread(target=stream_a)
    a.start()
    assert first_token.wait(120), "A never produced a token"
    b_result: list[httpx.Response] = []
    b = threading.Thread(
        target=lambda: b_result.append(
            httpx.post(f"{base}/v1/chat/completions", json=chat("Say hi.", max_tokens=8), timeout=300)
        )
    )
    b.start()
    assert fault_server.wait_in_flight(lambda n: n == 2, timeout=60) == 2  # B queued behind A
    arm(fault_server)
    a.join(300)
    b.join(300)
    assert not a.is_alive() and not b.is_alive()
    # A: some content, then one error event, and no [DONE].
    assert events and events[-1] != "[DONE]"
    last = json.loads(events[-1])
    assert last["error"]["code"] == "backend_error" and "injected fault" in last["error"]["message"]
    assert any('"content"' in e for e in events[:-1])
    # B was never in the failed step: a normal answer.
    assert b_result and b_result[0].status_code == 200, b_result[0].text if b_result else None
    assert b_result[0].json()["choices"][0]["message"]["content"]
    # And the server goes on.
    again = httpx.post(f"{base}/v1/chat/completions", json=chat("Hi", max_tokens=4), timeout=120)
    assert again.status_code == 200
    assert fault_server.wait_in_flight(lambda n: n == 0, timeout=30) == 0
