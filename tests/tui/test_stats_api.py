"""The server's stats routes: `GET /api/v1/stats`, `GET /api/v1/stats/stream`
(SSE) and `POST /api/v1/unload`. Fast tests use an app with no model; the
slow ones the real server with SmolLM2."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from localserve.api.admin.stats import add_one_shot_provider, set_batches_provider
from localserve.api.state import REGISTRY
from localserve.engine.oneshot.stats import OneShotQueueSnapshot
from localserve.models.kinds import ModelKind
from localserve.models.policy import FOREVER
from localserve.models.registry import LoadedOneShot, ModelRecord, ModelSpec
from localserve.models.registry.records import RecordState
from tests.tui.live import MODEL_ID, LiveServer, empty_app, make_settings, serve

SNAPSHOT_KEYS = {
    "object",
    "version",
    "time",
    "uptime_s",
    "process",
    "models",
    "loading",
    "load_errors",
    "not_loaded",
    "requests",
    "one_shot",
    "batches",
    "devices",
    "disk",
}


async def read_events(response: Any, num: int) -> list[dict[str, Any]]:
    events = []
    async for raw in response.content:
        line = raw.decode().strip()
        if line.startswith("data: "):
            events.append(json.loads(line[6:]))
            if len(events) == num:
                break
    return events


async def test_snapshot_of_a_server_without_models() -> None:
    async with serve(empty_app()) as client:
        response = await client.get("/api/v1/stats")
        assert response.status == 200
        body = await response.json()
    assert set(body) == SNAPSHOT_KEYS
    assert body["object"] == "localserve.stats"
    assert body["models"] == [] and body["requests"] == [] and body["batches"] == []
    process = body["process"]
    assert process["rss_bytes"] > 0 and process["pid"] > 0 and process["num_cpus"] >= 1
    assert process["cpu_percent"] >= 0
    disk = body["disk"]  # the data directory's disk, read at start-up
    assert set(disk) == {"data_dir", "free_bytes", "total_bytes", "writable", "low"}
    assert 0 <= disk["free_bytes"] <= disk["total_bytes"]


async def test_devices_appear_once_probed_off_the_event_loop() -> None:
    async with serve(empty_app()) as client:
        first = await (await client.get("/api/v1/stats")).json()
        assert isinstance(first["devices"], list)  # empty until the probe is done
        for _ in range(100):
            devices = (await (await client.get("/api/v1/stats")).json())["devices"]
            if devices:
                break
            await asyncio.sleep(0.1)
    by_backend = {d["backend"]: d for d in devices}
    assert by_backend["llamacpp"]["devices"] == ["cpu"] and "onnx" in by_backend and "openvino" in by_backend


async def test_stream_sends_a_snapshot_per_interval() -> None:
    async with serve(empty_app()) as client:
        response = await client.get("/api/v1/stats/stream", params={"interval_ms": "100"})
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        events = await read_events(response, 3)
        response.close()
    assert [e["object"] for e in events] == ["localserve.stats"] * 3
    assert events[0]["uptime_s"] < events[1]["uptime_s"] < events[2]["uptime_s"]


async def test_stream_ends_when_the_server_shuts_down() -> None:
    client = serve(empty_app())
    await client.start_server()
    response = await client.get("/api/v1/stats/stream")
    await read_events(response, 1)
    # The server stops while the client still reads: the stream must end at
    # once, not hold the shutdown for its whole timeout (60 s here).
    await asyncio.wait_for(client.server.close(), 10)
    await asyncio.wait_for(response.content.read(), 5)  # the stream has ended
    await client.close()


async def test_stream_rejects_a_bad_interval() -> None:
    async with serve(empty_app()) as client:
        response = await client.get("/api/v1/stats/stream", params={"interval_ms": "soon"})
        assert response.status == 400
        assert (await response.json())["error"]["param"] == "interval_ms"


async def test_hooks_add_batches_and_one_shot_stats() -> None:
    app = empty_app()
    batch = {
        "id": "batch_1",
        "object": "batch",
        "status": "in_progress",
        "endpoint": "/v1/chat/completions",
        "request_counts": {"total": 10, "completed": 4, "failed": 1},
        "metadata": {"model": "m"},
        "created_at": 1700000000,
    }
    set_batches_provider(app, lambda: [batch])
    add_one_shot_provider(app, "embeddings", lambda: {"queued": 2, "padding_ratio": 0.1})
    add_one_shot_provider(app, "broken", lambda: 1 / 0)  # a failing hook leaves the rest intact
    async with serve(app) as client:
        body = await (await client.get("/api/v1/stats")).json()
    assert body["batches"] == [
        {
            "id": "batch_1",
            "status": "in_progress",
            "endpoint": "/v1/chat/completions",
            "model": "m",
            "request_counts": {"total": 10, "completed": 4, "failed": 1},
            "created_at": 1700000000,
        }
    ]
    assert body["one_shot"] == {"embeddings": {"queued": 2, "padding_ratio": 0.1}, "broken": {}}


async def test_one_shot_models_of_the_registry_are_listed() -> None:
    app = empty_app()
    figures = {name: 0 for name in ("requests", "items", "dispatches", "batches", "errors", "rejected")}
    snapshot = OneShotQueueSnapshot(
        "onnxruntime", "CPU", 3, 1, 0, False, **figures, real_size=0, padded_size=0, busy_s=0.0,
        padding_ratio=0.0, recent_padding_ratio=0.0, mean_batch_size=8.0, max_batch_size_seen=8,
        recent_batch_sizes=(8,), items_per_s=0.0, busy_fraction=0.0, padding_free=False, max_batch_size=32,
        max_batch_tokens=16384, max_wait_ms=0.0, max_queue=256, group_by_length=True,
    )  # fmt: skip
    queue = SimpleNamespace(stats=lambda *_: snapshot, close=lambda: None)
    spec = ModelSpec("minilm", Path("/models/minilm"), ("embeddings",))
    model = LoadedOneShot(spec, "embeddings", SimpleNamespace(close=lambda: None), queue)  # type: ignore[arg-type]
    app[REGISTRY].records["minilm"] = ModelRecord(spec, ModelKind.EMBEDDINGS, FOREVER, RecordState.LOADED, model=model)
    async with serve(app) as client:
        body = await (await client.get("/api/v1/stats")).json()
    (entry,) = body["one_shot"].values()
    assert entry["kind"] == "embeddings" and entry["backend"] == "onnxruntime"
    assert entry["queue_items"] == 3 and entry["mean_batch_size"] == 8.0 and entry["recent_batch_sizes"] == [8]
    # Work is queued: in use, so keep-alive has not started.
    assert (entry["keep_alive"], entry["expires_in_s"], entry["in_use"]) == ("forever", None, True)
    assert body["one_shot"].keys() == {"minilm"}


async def test_stats_need_the_api_key() -> None:
    async with serve(empty_app(api_key="k")) as client:
        assert (await client.get("/api/v1/stats")).status == 401
        assert (await client.get("/api/v1/stats/stream")).status == 401
        assert (await client.get("/api/v1/stats", headers={"Authorization": "Bearer k"})).status == 200


async def test_unload_of_an_unknown_model_is_a_404() -> None:
    async with serve(empty_app()) as client:
        response = await client.post("/api/v1/unload", json={"model": "nope"})
        assert response.status == 404
        assert (await response.json())["error"]["code"] == "model_not_found"
        response = await client.post("/api/v1/unload", json={})
        assert response.status == 400
        assert (await response.json())["error"]["param"] == "model"


@pytest.mark.slow
def test_snapshot_of_the_real_model(live: LiveServer) -> None:
    body = httpx.get(f"{live.base_url}/api/v1/stats", timeout=30, trust_env=False).json()
    (model,) = body["models"]
    assert model["id"] == MODEL_ID and model["backend"] == "llamacpp" and model["device"]
    assert set(model["running"]) == set(model["waiting"]) == {"interactive", "default", "batch"}
    assert model["kv_total"] > 0 and model["max_num_seqs"] == 4 and model["n_ctx"] == 1024
    for key in ("decode_tokens_per_s", "prefill_tokens_per_s", "prefix_cache_hit_rate", "busy_fraction"):
        assert isinstance(model[key], float | int), key
    assert set(model["classes"]) == {"interactive", "default", "batch"}
    for figures in model["classes"].values():
        assert set(figures) == {"num_requests"} | {
            f"{kind}_p{q}_s" for kind in ("ttft", "queue_wait", "itl") for q in (50, 95)
        }
    # What the models panel needs: memory, context and slots, device and layers, keep-alive.
    options = model["options"]
    assert options["weights_mib"] > 50 and options["kv_mib"] > 0 and options["n_layers"] == 30
    assert options["n_gpu_layers"] == 0 and options["device"] == "CPU"
    assert model["keep_alive"] == "forever" and model["expires_in_s"] is None  # a --model: never unloaded
    assert "requests" not in model


@pytest.mark.slow
async def test_latencies_per_priority_class_and_per_request(live: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=live.base_url, timeout=120, trust_env=False) as http:

        async def chat(priority: str, max_tokens: int) -> None:
            body = {
                "model": MODEL_ID,
                "messages": [{"role": "user", "content": "Count to fifty."}],
                "max_tokens": max_tokens,
                "ignore_eos": True,
                "priority": priority,
            }
            assert (await http.post("/v1/chat/completions", json=body)).status_code == 200

        def figures(body: dict[str, Any]) -> dict[str, Any]:
            return next(m for m in body["models"] if m["id"] == MODEL_ID)["classes"]

        before = figures((await http.get("/api/v1/stats")).json())
        long_one = asyncio.create_task(chat("default", 200))
        seen: dict[str, Any] = {}
        for _ in range(300):  # the long request, while it runs: its own figures
            requests = (await http.get("/api/v1/stats")).json()["requests"]
            mine = [r for r in requests if r["priority_class"] == "default" and r["generated_tokens"] > 10]
            if mine:
                seen = mine[0]
                break
            await asyncio.sleep(0.05)
        await chat("interactive", 8)
        await chat("batch", 8)
        await long_one
        after = figures((await http.get("/api/v1/stats")).json())
    assert seen["max_tokens"] == 200 and seen["ttft_s"] > 0 and seen["queue_wait_s"] >= 0
    assert seen["tokens_per_s"] > 0  # more than a few tokens: a rate
    for name in ("interactive", "batch", "default"):
        assert after[name]["num_requests"] >= before[name]["num_requests"] + 1, name
        assert 0 < after[name]["queue_wait_p50_s"] <= after[name]["ttft_p95_s"], name
        assert after[name]["itl_p50_s"] > 0, name


@pytest.mark.slow
def test_unload_stops_serving_the_model() -> None:
    server = LiveServer(make_settings()).start().wait_healthy()
    try:
        with httpx.Client(base_url=server.base_url, timeout=60, trust_env=False) as http:
            response = http.post("/api/v1/unload", json={"model": MODEL_ID})
            assert response.status_code == 200
            assert response.json() == {"object": "model.unloaded", "model": MODEL_ID}
            assert http.get("/v1/models").json()["data"] == []
            assert http.get("/api/v1/stats").json()["models"] == []
            assert http.post("/api/v1/unload", json={"model": MODEL_ID}).status_code == 404
    finally:
        server.stop()
