"""Hostile and broken requests, each answered in one line (issue 17): the
OpenAI error envelope with the right status, one log line, no traceback, and
a server that answers normally afterwards.

* malformed HTTP that aiohttp's parser refuses before the app runs
  (`api.http_edge`), tested with raw sockets;
* a body that says `Content-Encoding: gzip` and is not gzip;
* a body that stops arriving (`--body-timeout`);
* a lone UTF-16 surrogate in any text field, on the OpenAI and Ollama routes
  and in a Batch API line;
* a user message without `content`, a 0-byte audio upload, `dimensions` on a
  model not trained for it, `/openapi.json` behind `--api-key`.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.api.harness import API_KEY, MODEL_ID, ServerThread, make_settings, open_raw_stream, read_until
from tests.reliability.conftest import EMBEDDING_MODEL, SPEECH_MODEL

pytestmark = pytest.mark.slow

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
LONE = "ok \ud800 then"  # valid JSON once escaped ("\ud800"), not Unicode


def raw_exchange(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send bytes as they are; read until the server closes (or `timeout`)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        answer = b""
        try:
            while piece := sock.recv(65536):
                answer += piece
        except TimeoutError:
            pass
    return answer


def split_answer(answer: bytes) -> tuple[int, dict[str, str], Any]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, json.loads(body)


@pytest.fixture
def server_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Every log record of the test (the servers run in this process)."""
    with caplog.at_level(logging.INFO):
        yield caplog


def assert_no_traceback(log: pytest.LogCaptureFixture) -> None:
    for record in log.records:
        assert record.exc_info is None, f"{record.name}: {record.getMessage()} (with a traceback)"
        assert "Traceback" not in record.getMessage()


def assert_still_answers(server: ServerThread) -> None:
    with httpx.Client(base_url=server.base_url, headers=HEADERS, timeout=60) as http:
        assert http.get("/health").status_code == 200
        assert http.get("/v1/models").status_code == 200


# ---- malformed HTTP, refused by the parser --------------------------------------------

MALFORMED = {
    "non_numeric_content_length": (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: abc\r\n\r\n",
        "Content-Length",
    ),
    "duplicate_content_length": (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
        "Duplicate Content-Length",
    ),
    "header_line_too_long": (
        b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",
        "8190 bytes",
    ),
    "unknown_method": (b"BREW /health HTTP/1.1\r\nHost: localhost\r\n\r\n", "BREW /health"),
    "tls_on_the_http_port": (b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + b"x" * 50 + b"\r\n\r\n", "HTTPS"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_http_gets_the_json_envelope_and_one_log_line(
    fuzz_server: ServerThread, server_log: pytest.LogCaptureFixture, name: str
) -> None:
    request, detail = MALFORMED[name]
    status, headers, body = split_answer(raw_exchange(fuzz_server.port, request))
    assert status == 400
    assert headers["content-type"].startswith("application/json")
    error = body["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "bad_request"
    assert error["message"].startswith("The request is not valid HTTP") and detail in error["message"]
    lines = [r for r in server_log.records if "malformed request" in r.getMessage()]
    assert len(lines) == 1 and detail in lines[0].getMessage() and "\n" not in lines[0].getMessage()
    assert_no_traceback(server_log)
    assert_still_answers(fuzz_server)


def test_each_request_gets_one_access_log_line(fuzz_server: ServerThread, server_log: pytest.LogCaptureFixture) -> None:
    with httpx.Client(base_url=fuzz_server.base_url, headers={**HEADERS, "User-Agent": "probe/1.0"}) as http:
        assert http.get("/v1/models?x=1").status_code == 200
        assert http.get("/v1/models/nope").status_code == 404
    deadline = time.monotonic() + 10  # aiohttp logs a line once the answer is out
    while len(lines := [r.getMessage() for r in server_log.records if r.name == "aiohttp.access"]) < 2:
        assert time.monotonic() < deadline, lines
        time.sleep(0.02)
    assert len(lines) == 2, lines
    assert re.fullmatch(r'127\.0\.0\.1 "GET /v1/models\?x=1 HTTP/1\.1" 200 \d+ \d+\.\d{3}s "probe/1\.0"', lines[0])
    assert re.fullmatch(r'127\.0\.0\.1 "GET /v1/models/nope HTTP/1\.1" 404 \d+ \d+\.\d{3}s "probe/1\.0"', lines[1])


def test_an_abandoned_stream_gets_its_499_line(fuzz_server: ServerThread, server_log: pytest.LogCaptureFixture) -> None:
    """A client that leaves mid-stream: one access-log line, status 499, with
    the bytes sent, the time and the tokens it got (issue 44)."""
    body = {"model": MODEL_ID, "max_tokens": 200, "stream": True, "messages": [{"role": "user", "content": "A story"}]}
    sock = open_raw_stream(fuzz_server.port, "/v1/chat/completions", json.dumps(body).encode(), HEADERS)
    assert b"data: " in read_until(sock, b'"content":"')
    sock.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        lines = [r.getMessage() for r in server_log.records if r.name == "aiohttp.access"]
        if lines:
            break
        time.sleep(0.05)
    assert len(lines) == 1, lines
    assert re.fullmatch(
        r'127\.0\.0\.1 "POST /v1/chat/completions HTTP/1\.1" 499 [1-9]\d* \d+\.\d{3}s "-" tokens=[1-9]\d*', lines[0]
    ), lines[0]


def test_gzip_body_that_is_not_gzip_is_a_400(fuzz_server: ServerThread, server_log: pytest.LogCaptureFixture) -> None:
    body = b'{"model": "x", "messages": []}'
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer " + API_KEY.encode() + b"\r\n"
        b"Content-Type: application/json\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )
    status, headers, answer = split_answer(raw_exchange(fuzz_server.port, request))
    assert status == 400 and headers.get("connection") == "close"
    assert answer["error"]["type"] == "invalid_request_error"
    assert "could not be read" in answer["error"]["message"] and "gzip" in answer["error"]["message"]
    for route in ("/api/chat", "/v1/embeddings"):  # Ollama's error shape on its routes, same status
        response = httpx.post(
            fuzz_server.base_url + route,
            headers={**HEADERS, "Content-Encoding": "gzip", "Content-Type": "application/json"},
            content=b"\x1f\x8b garbage",
            timeout=30,
        )
        assert response.status_code == 400, (route, response.text)
    assert_no_traceback(server_log)
    assert_still_answers(fuzz_server)


# ---- a body that stops arriving ---------------------------------------------------------


@pytest.fixture(scope="module")
def stall_server() -> Iterator[ServerThread]:
    """No model (the body is read before any model is needed); a 1 s body timeout."""
    srv = ServerThread(make_settings(models=[], body_timeout_s=1.0)).start()
    try:
        srv.wait_healthy()
        yield srv
    finally:
        srv.stop()


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/api/chat", "/v1/audio/transcriptions"])
def test_a_stalled_body_gets_408_and_the_connection_closes(
    stall_server: ServerThread, server_log: pytest.LogCaptureFixture, route: str
) -> None:
    content_type = "multipart/form-data; boundary=xyz" if "audio" in route else "application/json"
    head = f"POST {route} HTTP/1.1\r\nHost: localhost\r\nContent-Type: {content_type}\r\nContent-Length: 1000\r\n\r\n"
    started = time.monotonic()
    answer = raw_exchange(stall_server.port, head.encode() + b'{"model": "x"', timeout=20)
    took = time.monotonic() - started
    status, headers, body = split_answer(answer)
    assert status == 408 and headers.get("connection") == "close", answer
    assert 0.9 <= took < 5, took  # the 1 s timeout, not the client's 20 s
    error = body["error"] if isinstance(body["error"], dict) else {"message": body["error"]}  # Ollama's shape
    assert "stopped arriving" in error["message"]
    assert_no_traceback(server_log)
    assert_still_answers(stall_server)


def test_a_slow_body_that_keeps_coming_is_read(stall_server: ServerThread) -> None:
    """The limit is on silence, not on the whole upload: bytes every 0.5 s keep it alive."""
    body = json.dumps({"model": "none", "messages": [{"role": "user", "content": "Hi"}]}).encode()
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", stall_server.port), timeout=20) as sock:
        sock.sendall(head.encode())
        for start in range(0, len(body), 10):  # ~3.5 s in all, more than three timeouts
            sock.sendall(body[start : start + 10])
            time.sleep(0.5)
        answer = b""
        while piece := sock.recv(65536):
            answer += piece
    status, _, reply = split_answer(answer)
    assert status in (400, 404), reply  # read whole and parsed: the model is unknown, not a timeout
    assert reply["error"]["code"] != "request_timeout"


# ---- lone surrogates ----------------------------------------------------------------------

SURROGATE_BODIES = {
    "/v1/chat/completions": (
        {"model": MODEL_ID, "messages": [{"role": "user", "content": LONE}], "max_tokens": 2},
        "messages[0].content",
    ),
    "/v1/completions": ({"model": MODEL_ID, "prompt": ["fine", LONE], "max_tokens": 2}, "prompt[1]"),
    "/v1/embeddings": ({"model": EMBEDDING_MODEL, "input": LONE}, "input"),
    "/api/chat": ({"model": MODEL_ID, "messages": [{"role": "user", "content": LONE}], "stream": False}, "content"),
    "/api/generate": ({"model": MODEL_ID, "prompt": LONE, "stream": False}, "prompt"),
    "/api/embed": ({"model": EMBEDDING_MODEL, "input": [LONE]}, "input[0]"),
    "/infill": ({"input_prefix": "def f(", "input_suffix": LONE}, "input_suffix"),
    "/v1/chat/completions (tool schema)": (
        {
            "model": MODEL_ID,
            "messages": [{"role": "user", "content": "Hi"}],
            "response_format": {"type": "json_schema", "json_schema": {"schema": {"\udc80key": {"type": "string"}}}},
        },
        "response_format.json_schema.schema",
    ),
}


@pytest.mark.parametrize("case", sorted(SURROGATE_BODIES))
def test_a_lone_surrogate_is_a_400_naming_the_field(
    fuzz_server: ServerThread, server_log: pytest.LogCaptureFixture, case: str
) -> None:
    body, field = SURROGATE_BODIES[case]
    route = case.split()[0]
    response = httpx.post(fuzz_server.base_url + route, headers=HEADERS, content=json.dumps(body), timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    if isinstance(error, dict):  # OpenAI's envelope; Ollama's routes answer {"error": "..."}
        assert error["type"] == "invalid_request_error" and error["param"].startswith(field), error
        error = error["message"]
    assert "lone UTF-16 surrogate" in error and field in error, error
    assert_no_traceback(server_log)


def test_a_lone_surrogate_in_a_batch_line_fails_that_line_with_400(fuzz_server: ServerThread) -> None:
    lines = [
        {
            "custom_id": "bad",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": SURROGATE_BODIES["/v1/chat/completions"][0],
        },
        {
            "custom_id": "good",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": MODEL_ID, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
        },
    ]
    with httpx.Client(base_url=fuzz_server.base_url, headers=HEADERS, timeout=60) as http:
        upload = http.post(
            "/v1/files",
            files={"file": ("lines.jsonl", "".join(json.dumps(line) + "\n" for line in lines).encode())},
            data={"purpose": "batch"},
        )
        assert upload.status_code == 200, upload.text
        created = http.post(
            "/v1/batches",
            json={"input_file_id": upload.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        )
        assert created.status_code == 200, created.text
        deadline = time.monotonic() + 300
        while (batch := http.get(f"/v1/batches/{created.json()['id']}").json())["status"] not in (
            "completed",
            "failed",
        ):
            assert time.monotonic() < deadline, batch
            time.sleep(0.2)
        assert batch["request_counts"] == {"total": 2, "completed": 1, "failed": 1}, batch
        errors = [json.loads(x) for x in http.get(f"/v1/files/{batch['error_file_id']}/content").text.splitlines()]
    assert [row["custom_id"] for row in errors] == ["bad"]
    response = errors[0]["response"]
    assert response["status_code"] == 400, response
    assert response["body"]["error"]["param"] == "messages[0].content"


# ---- requests the schema used to accept, and other one-line answers ----------------------------


@pytest.mark.parametrize(
    ("message", "accepted"),
    [
        ({"role": "user"}, False),
        ({"role": "user", "content": None}, False),
        ({"role": "system"}, False),
        ({"role": "tool", "tool_call_id": "call_1"}, False),
        ({"role": "assistant"}, False),
        ({"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]}, True),
        ({"role": "user", "content": ""}, True),
    ],
)
def test_a_message_needs_content(fuzz_server: ServerThread, message: dict[str, Any], accepted: bool) -> None:
    messages = [message] if message["role"] == "user" else [message, {"role": "user", "content": "Hi"}]
    response = httpx.post(
        f"{fuzz_server.base_url}/v1/chat/completions",
        headers=HEADERS,
        json={"model": MODEL_ID, "messages": messages, "max_tokens": 2},
        timeout=60,
    )
    if accepted:
        assert response.status_code == 200, response.text
        return
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"].startswith("messages[") and "content" in error["message"], error


def test_an_empty_audio_file_is_named_as_empty(fuzz_server: ServerThread) -> None:
    response = httpx.post(
        f"{fuzz_server.base_url}/v1/audio/transcriptions",
        headers=HEADERS,
        files={"file": ("talk.wav", b"")},
        data={"model": SPEECH_MODEL},
        timeout=60,
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "file" and "empty (0 bytes)" in error["message"] and "talk.wav" in error["message"]
    missing = httpx.post(
        f"{fuzz_server.base_url}/v1/audio/transcriptions",
        headers=HEADERS,
        files={"model": (None, SPEECH_MODEL)},
        timeout=60,
    )
    assert missing.status_code == 400 and "Missing required parameter: 'file'" in missing.json()["error"]["message"]


def test_dimensions_on_a_model_not_trained_for_it_names_the_ones_that_are(fuzz_server: ServerThread) -> None:
    if EMBEDDING_MODEL not in fuzz_server.registry.oneshot:
        pytest.skip(f"{EMBEDDING_MODEL} is not installed")
    with httpx.Client(base_url=fuzz_server.base_url, headers=HEADERS, timeout=60) as http:
        refused = http.post("/v1/embeddings", json={"model": EMBEDDING_MODEL, "input": "Hi", "dimensions": 128})
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert error["param"] == "dimensions" and "384" in error["message"]
        assert "not trained" in error["message"] and "nomic-embed-text-v1.5" in error["message"]
        own = http.post("/v1/embeddings", json={"model": EMBEDDING_MODEL, "input": "Hi", "dimensions": 384})
        assert own.status_code == 200 and len(own.json()["data"][0]["embedding"]) == 384


def test_openapi_document_needs_the_api_key(fuzz_server: ServerThread) -> None:
    without = httpx.get(f"{fuzz_server.base_url}/openapi.json", timeout=30)
    assert without.status_code == 401 and without.json()["error"]["type"] == "authentication_error"
    document = httpx.get(f"{fuzz_server.base_url}/openapi.json", headers=HEADERS, timeout=30).json()
    assert {"bearer": []} in document["security"]  # (also x-api-key, as Anthropic clients send it)
    assert "security" not in document["paths"]["/openapi.json"]["get"]  # the global rule: the key
    assert document["paths"]["/health"]["get"]["security"] == []  # the one public route
    assert httpx.get(f"{fuzz_server.base_url}/health", timeout=30).status_code == 200
