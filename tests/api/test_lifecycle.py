"""Start-up (/health), client disconnects and cancellation, on real servers."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from localserve.engine.backend import GenerativeBackend
from localserve.models.plan import LoadReport
from localserve.models.registry import ModelRegistry, ModelSpec
from tests.api.harness import API_KEY, MODEL_ID, ServerThread, make_settings, open_raw_stream, read_until

pytestmark = pytest.mark.slow


class GatedRegistry(ModelRegistry):
    """Opens models only once the test opens the gate: start-up held at "loading"."""

    gate = threading.Event()

    def open_model(self, spec: ModelSpec) -> tuple[GenerativeBackend, LoadReport]:
        self.gate.wait(60)
        return super().open_model(spec)


@pytest.fixture
def gated_server() -> Iterator[ServerThread]:
    GatedRegistry.gate.clear()
    srv = ServerThread(make_settings(parallel=2, ctx_size=512, kv_size=1024), GatedRegistry).start()
    try:
        yield srv
    finally:
        GatedRegistry.gate.set()
        srv.stop()


def test_health_loading_then_ok(gated_server: ServerThread) -> None:
    health = httpx.get(f"{gated_server.base_url}/health")
    assert health.status_code == 503
    assert health.json() == {"status": "loading"}
    early = httpx.post(
        f"{gated_server.base_url}/v1/chat/completions",
        json={"model": MODEL_ID, "messages": [{"role": "user", "content": "Hi"}]},
    )
    assert early.status_code == 503
    assert early.json()["error"]["code"] == "model_loading"
    GatedRegistry.gate.set()
    gated_server.wait_healthy(timeout=60)
    assert httpx.get(f"{gated_server.base_url}/health").json() == {"status": "ok"}


def test_health_reports_a_failed_model() -> None:
    srv = ServerThread(make_settings(models=["/nonexistent/model.gguf"])).start()
    try:
        deadline = time.monotonic() + 10
        while (health := httpx.get(f"{srv.base_url}/health")).json()["status"] == "loading":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert health.status_code == 503
        assert health.json()["status"] == "error"
        assert "/nonexistent/model.gguf" in json.dumps(health.json()["errors"])
    finally:
        srv.stop()


def test_disconnect_aborts_and_frees_the_slot(small_server: ServerThread) -> None:
    """One slot: a client that leaves mid-stream must free it at once, or the
    next request would wait for 900 more tokens."""
    body = json.dumps(
        {
            "model": MODEL_ID,
            "messages": [{"role": "user", "content": "Write a very long essay."}],
            "max_tokens": 900,
            "ignore_eos": True,
            "stream": True,
        }
    ).encode()
    sock = open_raw_stream(small_server.port, "/v1/chat/completions", body)
    try:
        # The first chunk goes out with the first generated token.
        head = read_until(sock, b'"content":"')
        assert b"200 OK" in head and b'"content":"' in head
        assert small_server.num_in_flight() == 1
    finally:
        sock.close()
    left_at = time.monotonic()
    assert small_server.wait_in_flight(lambda n: n == 0, timeout=2) == 0
    quick = httpx.post(
        f"{small_server.base_url}/v1/chat/completions",
        json={"model": MODEL_ID, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
        timeout=30,
    )
    assert quick.status_code == 200
    # 900 tokens take several seconds here; a freed slot answers at once.
    assert time.monotonic() - left_at < 3.0


def test_cancel_endpoint(client: openai.OpenAI, server: ServerThread) -> None:
    stream = client.chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": "Write a very long essay."}],
        max_tokens=1500,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = iter(stream)
    first = next(chunks)
    cancel = httpx.post(
        f"{server.base_url}/api/v1/requests/{first.id}/cancel", headers={"Authorization": f"Bearer {API_KEY}"}
    )
    assert cancel.status_code == 200, cancel.text
    assert cancel.json()["num_cancelled"] == 1
    rest = list(chunks)
    assert rest[-1].choices[0].finish_reason == "abort"
    assert len(rest) < 1000
    again = httpx.post(
        f"{server.base_url}/api/v1/requests/{first.id}/cancel", headers={"Authorization": f"Bearer {API_KEY}"}
    )
    assert again.status_code == 404
