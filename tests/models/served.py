"""`localserve serve` in its own process (another venv, another PYTHONPATH), stopped at the end."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def serve_process(command: list[str], env: dict[str, str], log: Path, timeout_s: float = 120) -> Iterator[str]:
    """Run `command ... --port P` until /health is 200; yield the base URL; stop it with SIGTERM."""
    port = free_port()
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*command, "--port", str(port)], env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                raise AssertionError(f"the server exited with {process.returncode}:\n{log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise AssertionError(f"the server was not healthy after {timeout_s} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
