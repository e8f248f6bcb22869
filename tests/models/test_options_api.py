"""Per-model options over HTTP on a real server with tiny GGUF models:
`POST /api/v1/load` options, the effective options in `/api/v1/stats`,
`/api/v1/loaded` and `localserve list`, and a running batch holding its
model against keep_alive=0."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from localserve.cli import main as cli
from localserve.models.registry import ModelSpec
from tests.api.harness import ServerThread, make_settings
from tests.models.conftest import write_catalog

CHAT = "/v1/chat/completions"


@pytest.fixture
def server(catalog: Path, tiny_models: dict[str, Path]) -> Iterator[ServerThread]:
    """No --parallel or --ctx-size: the config file's options apply."""
    entries = json.loads(catalog.read_text())["models"]
    entries.append({"id": "tiny-a", "labels": ["chat"], "options": {"ctx_size": 256, "parallel": 3},
                    "sources": [{"uri": str(tiny_models["a"])}]})  # fmt: skip
    write_catalog(catalog, [e for e in entries if e["id"] != "tiny-a" or "options" in e])
    settings = make_settings(models=[], threads=1, keep_alive="0", batch_concurrency=1)
    for name in ("parallel", "ctx_size", "kv_size"):
        setattr(settings, name, None)
    srv = ServerThread(settings).start()
    srv.wait_healthy(30)
    try:
        yield srv
    finally:
        srv.stop()


def stats_options(http: httpx.Client, model_id: str) -> dict[str, Any]:
    models = {m["id"]: m for m in http.get("/api/v1/stats").json()["models"]}
    return models[model_id]["options"]  # type: ignore[no-any-return]


def test_load_options_and_the_effective_options_everywhere(
    server: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        loaded = http.post("/api/v1/load", json={"model": "tiny-a", "keep_alive": "-1"})
        assert loaded.status_code == 200, loaded.text
        options = loaded.json()["options"]
        assert (options["ctx_per_slot"], options["parallel"], options["kv_tokens"]) == (256, 3, 768)
        assert options["sources"]["ctx_size"] == "config" and options["n_gpu_layers"] == 0
        assert options["kv_mib"] == round(768 * 256 / 2**20, 1) and options["n_layers"] == 2
        assert stats_options(http, "tiny-a") == options
        assert {r["id"]: r["options"] for r in http.get("/api/v1/loaded").json()["data"]}["tiny-a"] == options

        asked = {"model": "tiny-b", "keep_alive": "-1", "options": {"ctx_size": 128, "parallel": 2}}
        loaded_b = http.post("/api/v1/load", json=asked).json()["options"]
        assert (loaded_b["ctx_per_slot"], loaded_b["parallel"], loaded_b["sources"]["parallel"]) == (128, 2, "request")
        again = http.post("/api/v1/load", json={**asked, "options": {"ctx_size": 512}})
        assert again.status_code == 400 and "unload it first" in again.json()["error"]["message"]
        bad = http.post("/api/v1/load", json={"model": "tiny-c", "options": {"n_gpu_layers": "lots"}})
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
        unknown = http.post("/api/v1/load", json={"model": "tiny-c", "options": {"device": "tpu"}})
        assert unknown.status_code == 400 and "use one of: auto, cpu, gpu, gpu:N, npu" in unknown.text
        npu = http.post("/api/v1/load", json={"model": "tiny-c", "options": {"device": "NPU"}}).json()["error"]
        assert npu["code"] == "unsupported_device" and "llama.cpp cannot run on 'npu'" in npu["message"]
        assert http.post(CHAT, json={"model": "tiny-b", "messages": [{"role": "user", "content": "Hi"}],
                                     "max_tokens": 2, "keep_alive": -1}).status_code == 200  # fmt: skip

    assert cli.main(["list", "--url", server.base_url]) == 0
    out = capsys.readouterr().out
    assert "tiny-a: ctx 256 x 3 slots, GPU layers 0/2, KV 0.2 MiB, device CPU" in out
    assert "tiny-b: ctx 128 x 2 slots" in out
    assert cli.main(["list", "--url", server.base_url, "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert {"tiny-a", "tiny-b"} <= set(listing["loaded"])
    assert {r["id"]: r.get("options") for r in listing["models"]}["tiny-a"]["ctx_per_slot"] == 256


def test_a_running_batch_keeps_its_model_loaded_under_keep_alive_zero(server: ServerThread) -> None:
    """keep_alive=0 unloads a model as soon as it is idle; between two lines of
    a batch (one at a time here) it would be, but the runner holds it."""
    loads: list[str] = []
    registry = server.registry
    original = registry.open_model

    def counting_open(spec: ModelSpec) -> Any:
        loads.append(spec.model_id)
        return original(spec)

    registry.open_model = counting_open  # type: ignore[method-assign]
    lines = [
        {"custom_id": f"c{i}", "method": "POST", "url": CHAT,
         "body": {"model": "tiny-c", "messages": [{"role": "user", "content": f"Hi {i}"}], "max_tokens": 3}}
        for i in range(8)
    ]  # fmt: skip
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        upload = http.post("/v1/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch"})
        assert upload.status_code == 200, upload.text
        body = {"input_file_id": upload.json()["id"], "endpoint": CHAT, "completion_window": "24h"}
        batch = http.post("/v1/batches", json=body).json()
        status = wait_for_batch(http, batch["id"], lambda b: b["status"] in ("completed", "failed"))
        assert status["status"] == "completed" and status["request_counts"]["completed"] == 8
        assert loads == ["tiny-c"]  # loaded once for the whole batch
        assert wait_for(lambda: "tiny-c" not in {r["id"] for r in http.get("/api/v1/loaded").json()["data"]})


def wait_for_batch(http: httpx.Client, batch_id: str, done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        batch: dict[str, Any] = http.get(f"/v1/batches/{batch_id}").json()
        if done(batch) or time.monotonic() > deadline:
            return batch
        time.sleep(0.05)


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
