"""Model management over HTTP on a real server with tiny GGUF models: loads
on demand, two models at once, LRU, keep_alive, pull/delete, and ids that
try to escape the store."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from localserve.engine.backend import GenerativeBackend
from localserve.engine.step.faults import WrappedBackend
from localserve.engine.types import StepPlan, StepResult
from localserve.models.plan import LoadReport
from localserve.models.registry import ModelRegistry, ModelSpec
from localserve.models.store import hf_cache
from tests.api.harness import ServerThread, make_settings
from tests.models.hub import FakeHub
from tests.models.test_store_catalog import BAD_IDS

CHAT = "/v1/chat/completions"


def chat(http: httpx.Client, model: str, **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, **extra}
    return http.post(CHAT, json=body)


def loaded(http: httpx.Client) -> dict[str, dict[str, Any]]:
    return {row["id"]: row for row in http.get("/api/v1/loaded").json()["data"]}


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_request_for_an_unloaded_model_loads_it(start_server: Callable[..., ServerThread]) -> None:
    server = start_server()
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        assert loaded(http) == {}
        assert http.get("/v1/models/tiny-a").status_code == 404  # looking does not load
        response = chat(http, "tiny-a")
        assert response.status_code == 200, response.text
        assert loaded(http)["tiny-a"]["kind"] == "chat"
        assert "tiny-a" in [m["id"] for m in http.get("/v1/models").json()["data"]]
        missing = chat(http, "qwen2.5-0.5b-instruct")  # in the catalog, not downloaded
        assert missing.status_code == 404 and "localserve pull" in missing.json()["error"]["message"]
        wrong_kind = chat(http, "all-minilm-l6-v2")
        assert wrong_kind.status_code == 400 and "/v1/embeddings" in wrong_kind.json()["error"]["message"]
        assert "all-minilm-l6-v2" not in loaded(http)  # refused before loading


class HeldBackend(WrappedBackend):
    """A model whose steps wait for `HeldRegistry.gate`."""

    def execute(self, batch: StepPlan) -> StepResult:
        HeldRegistry.gate.wait(120)
        return super().execute(batch)


class HeldRegistry(ModelRegistry):
    """Every model it loads computes no step until the test opens `gate`: a
    request stays in flight however fast or slow the machine is."""

    gate = threading.Event()

    def open_model(self, spec: ModelSpec) -> tuple[GenerativeBackend, LoadReport]:
        backend, report = super().open_model(spec)
        return HeldBackend(backend), report


def test_two_models_load_and_answer_concurrently(catalog: Path) -> None:
    """Decided from state, not timing: both models load on demand and each
    holds a running request at the same moment (their steps are held until
    then), then both answer in full."""
    HeldRegistry.gate.clear()
    settings = make_settings(models=[], parallel=2, ctx_size=512, kv_size=1024, threads=1)
    server = ServerThread(settings, HeldRegistry).start()
    num_chunks: dict[str, int] = {}

    def stream(model: str) -> None:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "Count"}],
            "max_tokens": 300,
            "ignore_eos": True,
            "stream": True,
        }
        with httpx.Client(base_url=server.base_url, timeout=180) as http, http.stream("POST", CHAT, json=body) as r:
            assert r.status_code == 200
            num_chunks[model] = sum(1 for line in r.iter_lines() if line.startswith("data: {"))

    threads = [threading.Thread(target=stream, args=(m,)) for m in ("tiny-a", "tiny-b")]
    try:
        server.wait_healthy(30)
        for thread in threads:
            thread.start()  # both load on demand, at the same time
        together = wait_for(lambda: _in_flight(server, "tiny-a") > 0 and _in_flight(server, "tiny-b") > 0, 120)
        assert together, "the two models never had requests in flight at the same time"
        time.sleep(0.5)  # ample for 300 tokens of these models, were their steps not held
        assert _in_flight(server, "tiny-a") == 1 and _in_flight(server, "tiny-b") == 1 and not num_chunks
        HeldRegistry.gate.set()
        for thread in threads:
            thread.join(120)
        assert set(num_chunks) == {"tiny-a", "tiny-b"} and min(num_chunks.values()) > 100
        with httpx.Client(base_url=server.base_url) as http:
            assert set(loaded(http)) == {"tiny-a", "tiny-b"}
    finally:
        HeldRegistry.gate.set()
        server.stop()


def _in_flight(server: ServerThread, model_id: str) -> int:
    engine = server.engine
    return int(server.call(lambda: engine.num_in_flight(model_id) if engine.has_model(model_id) else 0))


def test_lru_eviction_order(start_server: Callable[..., ServerThread]) -> None:
    server = start_server(max_loaded_models="chat=2")
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        for model in ("tiny-a", "tiny-b", "tiny-a"):  # tiny-b is now the least recently used
            assert chat(http, model).status_code == 200
        assert chat(http, "tiny-c").status_code == 200
        assert set(loaded(http)) == {"tiny-a", "tiny-c"}
        assert chat(http, "tiny-d").status_code == 200  # tiny-a was used before tiny-c
        assert set(loaded(http)) == {"tiny-c", "tiny-d"}
        assert chat(http, "tiny-b").status_code == 200  # an evicted model comes back on demand
        assert set(loaded(http)) == {"tiny-d", "tiny-b"}


def test_keep_alive_zero_unloads_after_the_request(start_server: Callable[..., ServerThread]) -> None:
    server = start_server()
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        assert chat(http, "tiny-a", keep_alive=0).status_code == 200
        assert wait_for(lambda: "tiny-a" not in loaded(http), 5)
        assert "tiny-a" not in server.call(lambda: server.registry.loaded)
        loaded_now = http.post("/api/v1/load", json={"model": "tiny-b", "keep_alive": "300ms"})
        assert loaded_now.status_code == 200 and loaded_now.json()["kind"] == "chat"
        assert "tiny-b" in loaded(http)
        assert wait_for(lambda: "tiny-b" not in loaded(http), 5)
        assert http.post("/api/v1/load", json={"model": "tiny-c", "keep_alive": "-1"}).json()["keep_alive"] == "forever"
        bad = chat(http, "tiny-c", keep_alive="soon")
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "keep_alive"


def test_path_traversal_ids_are_rejected_with_400(start_server: Callable[..., ServerThread], home: Path) -> None:
    server = start_server()
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        for bad in BAD_IDS:
            for path, body in (
                (CHAT, {"model": bad, "messages": [{"role": "user", "content": "Hi"}]}),
                ("/v1/completions", {"model": bad, "prompt": "Hi"}),
                ("/v1/embeddings", {"model": bad, "input": "Hi"}),
                ("/api/v1/pull", {"model": bad}),
                ("/api/v1/load", {"model": bad}),
            ):
                response = http.post(path, json=body)
                assert response.status_code == 400, (path, bad, response.text)
            response = http.delete(f"/api/v1/models/{quote(bad, safe='')}")
            # "", "." and ".." vanish when the URL is normalised: the router answers for /api/v1/models.
            expected = (400, 404, 405) if bad in ("", ".", "..") else (400,)
            assert response.status_code in expected, (bad, response.text)
        for bad in ("hf://../x/y.gguf", "hf://test/r/../../x.gguf", "hf://test/r@../../x/y.gguf"):
            assert http.post("/api/v1/pull", json={"model": bad}).status_code == 400
    assert not any(home.parent.rglob("x")) and not (home.parent / "b").exists()


def test_pull_over_http_streams_progress_then_the_model_serves(
    start_server: Callable[..., ServerThread], hub: FakeHub, tiny_models: dict[str, Path]
) -> None:
    data = tiny_models["a"].read_bytes()
    key = hub.add("test/tiny-gguf", "tiny.gguf", data)
    hub.drop_after[key] = len(data) // 2
    server = start_server()
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        assert chat(http, "hub-tiny").status_code == 404  # known, not downloaded yet
        with http.stream("POST", "/api/v1/pull", json={"model": "hub-tiny"}) as response:
            assert response.status_code == 200
            assert response.headers["Content-Type"].startswith("application/x-ndjson")
            lines = [json.loads(line) for line in response.iter_lines() if line]
        statuses = [line["status"] for line in lines]
        assert statuses[0] == "resolving" and statuses[-1] == "success" and "downloading" in statuses
        last = [line for line in lines if line["status"] == "downloading"][-1]
        assert last["completed"] == last["total"] == len(data) and last["file"] == "tiny.gguf"
        assert hub.gets[-1][1] is not None  # the dropped transfer resumed with a Range request
        again = http.post("/api/v1/pull", json={"model": "hub-tiny", "stream": False})
        assert again.status_code == 200 and again.json()["status"] == "success"
        assert chat(http, "hub-tiny").status_code == 200
        assert "hub-tiny" in loaded(http)

        deleted = http.delete("/api/v1/models/hub-tiny")
        assert deleted.status_code == 200 and deleted.json()["deleted"] is True
        assert "hub-tiny" not in loaded(http) and not hf_cache.repo_folder("test/tiny-gguf").exists()
        assert chat(http, "hub-tiny").status_code == 404
        assert http.delete("/api/v1/models/hub-tiny").status_code == 404
        assert http.post("/api/v1/pull", json={"model": "no-such-model"}).status_code == 404


def test_a_refused_download_over_http_ends_the_stream_with_an_error(
    start_server: Callable[..., ServerThread], hub: FakeHub
) -> None:
    hub.add("test/tiny-gguf", "tiny.gguf", os.urandom(100_000), served_sha256="ef" * 32)
    server = start_server()
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        lines = [json.loads(line) for line in http.post("/api/v1/pull", json={"model": "hub-tiny"}).iter_lines()]
        assert lines[-1]["status"] == "error" and lines[-1]["error"]["code"] == "checksum_mismatch"
        single = http.post("/api/v1/pull", json={"model": "hub-tiny", "stream": False})
        assert single.status_code == 502 and single.json()["error"]["code"] == "checksum_mismatch"
    assert not [p for p in hf_cache.hub_cache_dir().rglob("*") if p.is_file() and not p.name.endswith(".lock")]


@pytest.mark.slow
def test_smollm2_and_a_tiny_model_answer_side_by_side(start_server: Callable[..., ServerThread]) -> None:
    server = start_server()
    answers: dict[str, httpx.Response] = {}

    def ask(model: str) -> None:
        with httpx.Client(base_url=server.base_url, timeout=120) as http:
            answers[model] = chat(
                http,
                model,
                messages=[{"role": "user", "content": "What is the capital of France? Answer in one word."}],
                max_tokens=12,
                temperature=0,
            )

    threads = [threading.Thread(target=ask, args=(m,)) for m in ("smollm2-135m-instruct", "tiny-a")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert answers["tiny-a"].status_code == 200
    smol = answers["smollm2-135m-instruct"]
    assert smol.status_code == 200, smol.text
    assert "Paris" in smol.json()["choices"][0]["message"]["content"]
    with httpx.Client(base_url=server.base_url) as http:
        assert {"smollm2-135m-instruct", "tiny-a"} <= set(loaded(http))
