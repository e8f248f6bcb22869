"""Swaps that drain, on a real server: SmolLM2 served twice, as `a` and `b`,
under `--max-loaded-models chat=1`. Only `a` loads at start; then the two
alternate with eight streams each, every swap starting while the other
model's answers are running, and every answer finishes whole."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.harness import ServerThread, make_settings

CHAT = "/v1/chat/completions"
NUM_STREAMS = 8
MAX_TOKENS = 48


def stream_answer(base_url: str, model: str, index: int) -> dict[str, Any]:
    """One streamed answer: its status, text, finish reason and error, if any."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"Tell me fact number {index} about the sea."}],
        "max_tokens": MAX_TOKENS,
        "stream": True,
    }
    result: dict[str, Any] = {"model": model, "text": "", "finish_reason": None, "error": None}
    with httpx.Client(base_url=base_url, timeout=300) as http, http.stream("POST", CHAT, json=body) as response:
        result["status"] = response.status_code
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line.removeprefix("data: "))
            if "error" in chunk:
                result["error"] = chunk["error"]
                continue
            for choice in chunk["choices"]:
                result["text"] += choice["delta"].get("content") or ""
                result["finish_reason"] = choice.get("finish_reason") or result["finish_reason"]
    return result


@pytest.mark.slow
def test_two_models_alternating_under_a_limit_of_one_finish_every_answer(
    smollm2_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="localserve.models.registry")
    settings = make_settings(
        models=[f"a={smollm2_path}", f"b={smollm2_path}"],
        max_loaded_models="chat=1",
        parallel=NUM_STREAMS,
        ctx_size=512,
        kv_size=0,
    )
    server = ServerThread(settings).start()
    results: list[dict[str, Any]] = []
    lock = threading.Lock()

    def ask(model: str, index: int) -> None:
        answer = stream_answer(server.base_url, model, index)
        with lock:
            results.append(answer)

    try:
        server.wait_healthy(120)
        with httpx.Client(base_url=server.base_url, timeout=30) as http:
            health = http.get("/health").json()
            assert health["status"] == "ok"
            assert health["not_loaded"] == {
                f"b={smollm2_path}": "not loaded at start (--max-loaded-models chat=1); loads on first request"
            }
            assert [row["id"] for row in http.get("/api/v1/loaded").json()["data"]] == ["a"]
        threads: list[threading.Thread] = []
        for round_index, model in enumerate(["a", "b", "a", "b"]):
            for i in range(NUM_STREAMS):
                thread = threading.Thread(target=ask, args=(model, round_index * NUM_STREAMS + i))
                thread.start()
                threads.append(thread)
            # The next model's requests come while these answers run: each swap drains.
            assert _wait_in_flight(server, model), f"{model}'s answers never started"
        for thread in threads:
            thread.join(300)
        assert len(results) == 4 * NUM_STREAMS
        cut = [r for r in results if r["status"] != 200 or r["error"] or r["finish_reason"] not in ("stop", "length")]
        assert not cut, f"{len(cut)} answers cut: {cut[:3]}"
        assert all(r["text"] for r in results)
        drains = [r.getMessage() for r in caplog.records if "finishing its answers in flight" in r.getMessage()]
        assert len(drains) >= 3, drains  # a swap per round, each with answers running
        assert not [r for r in caplog.records if "ended" in r.getMessage() and "still running" in r.getMessage()]
    finally:
        server.stop()


def _wait_in_flight(server: ServerThread, model_id: str, timeout: float = 120.0) -> bool:
    """Until `model_id` has an answer running (it may first wait for a swap)."""
    engine = server.engine
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.call(lambda: engine.has_model(model_id) and engine.num_in_flight(model_id) > 0):
            return True
        time.sleep(0.02)
    return False
