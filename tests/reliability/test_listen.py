"""`--host` with several addresses (llama-server's `--host 127.0.0.1,::1`):
`localserve serve` listens on each, and the Host check lets each through."""

from __future__ import annotations

import socket
from typing import Any

import httpx
import pytest

from localserve.api.security import HostPolicy
from localserve.config import ServerSettings
from tests.api.harness import MODEL_ID

pytestmark = pytest.mark.slow


def test_hosts_are_the_comma_separated_addresses() -> None:
    assert ServerSettings(host="127.0.0.1, [::1]").hosts == ["127.0.0.1", "::1"]
    assert ServerSettings().hosts == ["127.0.0.1"]
    policy = HostPolicy(ServerSettings(host="127.0.0.1,192.0.2.7"))
    assert policy.allows("192.0.2.7") and not policy.allows("192.0.2.8") and not policy.any_ip
    assert HostPolicy(ServerSettings(host="127.0.0.1,0.0.0.0")).any_ip


def test_serve_listens_on_each_address(server_process: Any) -> None:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    srv = server_process("--host", "127.0.0.1,::1", "--parallel", "1", "--ctx-size", "512")
    for base in (f"http://127.0.0.1:{srv.port}", f"http://[::1]:{srv.port}"):
        assert httpx.get(f"{base}/health", timeout=10).status_code == 200
        body = {"model": MODEL_ID, "prompt": "Once upon a time", "max_tokens": 2}
        assert httpx.post(f"{base}/v1/completions", json=body, timeout=60).status_code == 200
