"""The real server (SmolLM2) with its data directory on a small tmpfs that
fills, and on a read-only mount: chat keeps answering, an upload that does
not fit is a 507 that leaves nothing behind, a batch pauses while the disk is
full and finishes once space is back with every line once, and /health,
/metrics and the stats say how much is free."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.harness import MODEL_ID, ServerThread, make_settings
from tests.fixtures.small_disk import fill, read_only, small_tmpfs

pytestmark = pytest.mark.slow


def chat_ok(http: httpx.Client) -> None:
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "Say yes."}], "max_tokens": 4}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"]


def upload(http: httpx.Client, data: bytes, purpose: str = "batch") -> httpx.Response:
    return http.post("/v1/files", files={"file": ("in.jsonl", data)}, data={"purpose": purpose})


def batch_input(num_lines: int) -> bytes:
    lines = []
    for i in range(num_lines):
        body = {"model": MODEL_ID, "messages": [{"role": "user", "content": f"Count to {i}."}], "max_tokens": 4}
        lines.append(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}))
    return ("\n".join(lines) + "\n").encode()


@pytest.fixture
def server_on(tmp_path: Path) -> Iterator[Any]:
    servers: list[ServerThread] = []

    def start(data_dir: Path, **overrides: Any) -> tuple[ServerThread, httpx.Client]:
        srv = ServerThread(make_settings(data_dir=str(data_dir), parallel=4, kv_size=4096, **overrides)).start()
        servers.append(srv)
        srv.wait_healthy()
        return srv, httpx.Client(base_url=srv.base_url, timeout=60)

    yield start
    for srv in servers:
        srv.stop()


def test_a_full_data_disk_loses_nothing(server_on: Any, tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "data", "16m") as data:
        srv, http = server_on(data, prefix_cache_disk=8 << 20)
        assert http.get("/v1/files").status_code == 200  # the job store is made while there is room
        filler = fill(data)

        refused = upload(http, bytes(3 << 20))
        assert refused.status_code == 507, refused.text
        error = refused.json()["error"]
        assert error["code"] == "insufficient_storage" and "No space left" in error["message"]
        assert [p.name for p in (data / "jobs" / "files").iterdir()] == []  # no partial file, no row
        assert http.get("/v1/files").json()["data"] == []
        chat_ok(http)  # serving never stops for the disk
        assert http.get("/health").json() == {"status": "ok"}  # writable: a full disk is not a health matter
        assert "localserve_disk_free_bytes" in http.get("/metrics").text
        assert http.get("/api/v1/stats").json()["disk"]["low"]

        filler.unlink()
        file_id = upload(http, batch_input(6)).json()["id"]
        batch = http.post(
            "/v1/batches",
            json={"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        ).json()
        filler = fill(data)  # the disk fills while the batch runs
        time.sleep(2)
        chat_ok(http)
        assert http.get(f"/v1/batches/{batch['id']}").json()["status"] in ("validating", "in_progress", "finalizing")
        filler.unlink()
        deadline = time.monotonic() + 120
        while (done := http.get(f"/v1/batches/{batch['id']}").json())["status"] not in ("completed", "failed"):
            assert time.monotonic() < deadline, done
            time.sleep(0.5)
        assert done["status"] == "completed" and done["request_counts"]["completed"] == 6, done
        output = http.get(f"/v1/files/{done['output_file_id']}/content").text.splitlines()
        assert sorted(json.loads(line)["custom_id"] for line in output) == [f"c{i}" for i in range(6)]
        http.close()


def test_a_read_only_data_directory_serves_with_disk_features_off(server_on: Any, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    with read_only(data):
        srv, http = server_on(data)
        chat_ok(http)
        health = http.get("/health").json()
        assert health["status"] == "ok" and health["disk"]["writable"] is False
        refused = upload(http, batch_input(1))
        assert refused.status_code == 507, refused.text
        assert "read-only" in refused.json()["error"]["message"]
        stats = http.get("/api/v1/stats").json()
        assert stats["disk"]["writable"] is False
        http.close()
