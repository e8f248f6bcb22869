"""kill -9 in the middle of a batch: the server is a real subprocess with its
data in a temporary LOCALSERVE_HOME. After a restart the batch completes with
every line answered once, and no line that had finished before the kill is
run again (the store counts each line's attempts; the test reads it)."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

pytestmark = pytest.mark.slow

MODEL_ID = "smollm2-135m-instruct"
NUM_LINES = 200
PARALLEL = 16
ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """`python -m localserve serve` in a subprocess, started and killed at will."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = home / "server.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        cmd = [sys.executable, "-m", "localserve", "serve", "--port", str(self.port), "--model", MODEL_ID,
               "--ctx-size", "1024", "--parallel", str(PARALLEL), "--threads", "2", "--log-level", "warning"]  # fmt: skip
        env = {**os.environ, "LOCALSERVE_HOME": str(self.home)}
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while True:
            assert self.proc.poll() is None, f"server died: {self.log.read_text()[-3000:]}"
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "server did not become healthy"
            time.sleep(0.1)

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    srv = Server(tmp_path)
    try:
        yield srv
    finally:
        srv.stop()


def line_rows(home: Path, batch_id: str) -> dict[str, tuple[int, str | None]]:
    """custom_id -> (attempts, result id or None), read from the store's file."""
    db = sqlite3.connect(home / "jobs" / "jobs.sqlite3")
    try:
        rows = db.execute("SELECT custom_id, attempts, result_id FROM lines WHERE batch_id = ?", (batch_id,))
        return {custom_id: (attempts, result_id) for custom_id, attempts, result_id in rows}
    finally:
        db.close()


def test_kill_9_mid_batch_then_restart_completes_without_redoing_lines(server: Server) -> None:
    server.start()
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=2, timeout=60)
    lines = [
        {"custom_id": f"line-{i:03d}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": MODEL_ID, "messages": [{"role": "user", "content": f"Say {i}."}], "max_tokens": 6}}
        for i in range(NUM_LINES)
    ]  # fmt: skip
    source = client.files.create(
        file=("in.jsonl", "".join(json.dumps(x) + "\n" for x in lines).encode()), purpose="batch"
    )
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")

    deadline = time.monotonic() + 600
    while client.batches.retrieve(batch.id).request_counts.completed < 30:
        assert time.monotonic() < deadline, "the batch made no progress"
        time.sleep(0.1)
    server.kill()

    before = line_rows(server.home, batch.id)
    finished_before = {cid: result_id for cid, (_, result_id) in before.items() if result_id}
    assert 30 <= len(finished_before) < NUM_LINES, "killed mid-run"

    server.start()  # same LOCALSERVE_HOME: the batch resumes
    deadline = time.monotonic() + 900
    while (resumed := client.batches.retrieve(batch.id)).status not in ("completed", "failed", "cancelled", "expired"):
        assert time.monotonic() < deadline, f"resumed batch stuck: {resumed.request_counts}"
        time.sleep(0.2)
    assert resumed.status == "completed"
    assert (resumed.request_counts.total, resumed.request_counts.completed) == (NUM_LINES, NUM_LINES)

    output = [json.loads(x) for x in client.files.content(resumed.output_file_id).text.splitlines()]
    custom_ids = [o["custom_id"] for o in output]
    assert len(custom_ids) == len(set(custom_ids)) == NUM_LINES, "every line exactly once"
    assert {o["response"]["status_code"] for o in output} == {200}

    after = line_rows(server.home, batch.id)
    # A line finished before the kill kept its one attempt and its answer.
    assert all(after[cid][0] == 1 for cid in finished_before)
    result_ids = {o["custom_id"]: o["id"] for o in output}
    assert all(result_ids[cid] == rid for cid, rid in finished_before.items())
    # Only the lines in flight at the kill (at most one per slot) ran twice.
    num_attempts = sum(attempts for attempts, _ in after.values())
    assert NUM_LINES <= num_attempts <= NUM_LINES + PARALLEL
    assert all(attempts >= 1 for attempts, _ in after.values())
