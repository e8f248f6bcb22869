"""DNS-rebinding (Host) and cross-origin (CORS) protection on the real server."""

from __future__ import annotations

import socket

import httpx
import pytest

from tests.api.harness import API_KEY, ServerThread

pytestmark = pytest.mark.slow

KEY = {"Authorization": f"Bearer {API_KEY}"}


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8400", "localhost.evil.example", "10.1.2.3"])
def test_foreign_host_403(server: ServerThread, host: str) -> None:
    response = httpx.get(f"{server.base_url}/v1/models", headers={**KEY, "Host": host})
    assert response.status_code == 403
    error = response.json()["error"]
    assert error["type"] == "permission_error"
    assert "--allow-host" in error["message"]


@pytest.mark.parametrize(
    "host", ["localhost", "localhost:8400", "127.0.0.1:1", "[::1]:8400", "[::1]", "LOCALHOST", socket.gethostname()]
)
def test_local_hosts_allowed(server: ServerThread, host: str) -> None:
    response = httpx.get(f"{server.base_url}/v1/models", headers={**KEY, "Host": host})
    assert response.status_code == 200, response.text


def test_allow_host_setting(small_server: ServerThread) -> None:
    url = f"{small_server.base_url}/health"
    assert httpx.get(url, headers={"Host": "llm.lan:8400"}).status_code == 200
    assert httpx.get(url, headers={"Host": "other.lan"}).status_code == 403


def preflight(server: ServerThread, origin: str) -> httpx.Response:
    return httpx.options(
        f"{server.base_url}/v1/chat/completions",
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )


@pytest.mark.parametrize(
    "origin", ["http://localhost:3000", "http://127.0.0.1:5173", "https://localhost", "vscode-webview://1a2b3c4d"]
)
def test_preflight_allowed(server: ServerThread, origin: str) -> None:
    response = preflight(server, origin)  # no API key: preflights never carry one
    assert response.status_code == 200, response.text  # as llama-server answers
    assert response.headers["Access-Control-Allow-Origin"] == origin
    assert "POST" in response.headers["Access-Control-Allow-Methods"]
    assert "authorization" in response.headers["Access-Control-Allow-Headers"].lower()


@pytest.mark.parametrize("origin", ["https://evil.example", "http://localhost.evil.example", "null"])
def test_preflight_refused(server: ServerThread, origin: str) -> None:
    # llama-server's way: 200 without CORS headers, so the browser never sends the call.
    response = preflight(server, origin)
    assert response.status_code == 200
    assert "Access-Control-Allow-Origin" not in response.headers
    assert "Access-Control-Allow-Methods" not in response.headers


def test_cors_headers_on_answers_and_errors(server: ServerThread) -> None:
    origin = {"Origin": "http://localhost:3000"}
    ok = httpx.get(f"{server.base_url}/v1/models", headers={**KEY, **origin})
    assert ok.status_code == 200
    assert ok.headers["Access-Control-Allow-Origin"] == "http://localhost:3000"
    assert "Origin" in ok.headers["Vary"]
    unauthorized = httpx.get(f"{server.base_url}/v1/models", headers=origin)
    assert unauthorized.status_code == 401
    # The page may read why it failed.
    assert unauthorized.headers["Access-Control-Allow-Origin"] == "http://localhost:3000"
    plain = httpx.get(f"{server.base_url}/v1/models", headers=KEY)
    assert "Access-Control-Allow-Origin" not in plain.headers


def test_foreign_origin_simple_request_refused(server: ServerThread) -> None:
    # A "simple" cross-origin POST skips the preflight; it must not start work.
    response = httpx.post(
        f"{server.base_url}/v1/chat/completions",
        content=b'{"model": "x", "messages": []}',
        headers={**KEY, "Origin": "https://evil.example", "Content-Type": "text/plain"},
    )
    assert response.status_code == 403


def test_cors_origin_setting(small_server: ServerThread) -> None:
    allowed = preflight(small_server, "https://app.example")
    assert allowed.status_code == 200
    assert allowed.headers["Access-Control-Allow-Origin"] == "https://app.example"
    assert "Access-Control-Allow-Origin" not in preflight(small_server, "https://other.example").headers


def test_cors_origins_as_llama_server_takes_them() -> None:
    from localserve.api.security import OriginPolicy
    from localserve.cli.options import settings_from_args

    settings = settings_from_args(["--cors-origins", "https://a.example,https://b.example,localhost"], {})
    policy = OriginPolicy(settings)
    assert policy.allows("https://a.example", None) and policy.allows("https://b.example", None)
    assert policy.allows("http://localhost:3000", None) and not policy.allows("https://c.example", None)
    assert OriginPolicy(settings_from_args(["--cors-origins", "*"], {})).allows("https://c.example", None)
