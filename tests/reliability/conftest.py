"""Servers for the reliability tests: in-process `ServerThread`s (see
`tests/api/harness.py`) where the engine must be watched, and real
`python -m localserve serve` processes where a signal must be sent.

llama.cpp runs with one thread per model here: the tests run next to other
work on two cores, and spinning threads that wait for a busy core slow a
step down tenfold."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import pytest

from localserve.api.admin.debug import ENABLE_ENV
from localserve.errors import ModelNotFoundError
from localserve.models.registry import resolve
from tests.api.harness import API_KEY, MODEL_ID, ServerThread, make_settings

REPO = Path(__file__).resolve().parents[2]
EMBEDDING_MODEL = "all-minilm-l6-v2"
SPEECH_MODEL = "whisper-tiny.en"


def installed(model_id: str) -> bool:
    try:
        resolve(model_id)
    except ModelNotFoundError:
        return False
    return True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def reliability_settings(**overrides: Any) -> Any:
    base: dict[str, Any] = {"threads": 1}
    base.update(overrides)
    return make_settings(**base)


def start_server_thread(faults: bool = False, **overrides: Any) -> ServerThread:
    """A healthy in-process server; `faults` enables the debug fault route."""
    env = {ENABLE_ENV: "1"} if faults else {}
    with mock.patch.dict(os.environ, env):
        srv = ServerThread(reliability_settings(**overrides)).start()
    try:
        srv.wait_healthy(timeout=120)
    except BaseException:
        srv.stop()
        raise
    return srv


class ServerProcess:
    """`python -m localserve serve` in a child process, on a free port."""

    def __init__(self, home: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.home = home
        self.log_path = home / f"server-{self.port}.log"
        command = [sys.executable, "-m", "localserve", "serve", "--port", str(self.port), "--model", MODEL_ID]
        command += ["--threads", "1", "--log-level", "warning", *args]
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            command,
            cwd=REPO,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "LOCALSERVE_HOME": str(home), **(env or {})},
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_healthy(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.1)
        raise TimeoutError(f"server did not become healthy:\n{self.log()}")

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()


@pytest.fixture(scope="session")
def fuzz_server() -> Iterator[ServerThread]:
    """For schemathesis and the fuzz tests: a small context (256 tokens) bounds
    any generation; the embeddings and speech models join when installed."""
    models = [MODEL_ID] + [m for m in (EMBEDDING_MODEL, SPEECH_MODEL) if installed(m)]
    srv = start_server_thread(models=models, api_key=API_KEY, parallel=4, ctx_size=256, kv_size=1024, batch_tokens=256)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def server_process(tmp_path: Path) -> Iterator[Any]:
    """A factory of server processes, all killed at the end of the test."""
    started: list[ServerProcess] = []

    def start(*args: str, home: Path | None = None) -> ServerProcess:
        srv = ServerProcess(home or tmp_path, *args)
        started.append(srv)
        srv.wait_healthy()
        return srv

    yield start
    for srv in started:
        srv.close()


# The shared session server of the API tests (16 slots, API key), reused here.
from tests.api.conftest import server  # noqa: E402,F401
