"""Property-based fuzzing of every JSON route and every multipart route of a
live server (issue 17): lone UTF-16 surrogates, wrong types, deep nesting,
huge numbers, long strings; multipart bodies with empty, truncated,
duplicated and odd parts. Every answer is below 500, nothing logs a
traceback or an error, and the server answers a real request normally
afterwards.

Each example changes one place of a valid body (or replaces the whole body),
so most requests get as far as the handler's own checks and a few still
generate (two tokens, unless `max_tokens` itself is the mutated field).
Derandomized and bounded: `LOCALSERVE_FUZZ_ROUTE_EXAMPLES` examples per
route (default 25; about a minute for all routes on two busy cores)."""

from __future__ import annotations

import copy
import json
import logging
import os
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localserve.api.admin.openapi import build_document
from tests.api.harness import API_KEY, MODEL_ID, ServerThread
from tests.reliability.conftest import EMBEDDING_MODEL, SPEECH_MODEL

pytestmark = [
    pytest.mark.slow,
    # aiohttp warns (and goes on) about the odd Content-Disposition headers sent on purpose.
    pytest.mark.filterwarnings("ignore::aiohttp.multipart.BadContentDispositionHeader"),
]

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
ROUTE_FUZZ = settings(
    max_examples=int(os.environ.get("LOCALSERVE_FUZZ_ROUTE_EXAMPLES", "25")),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
HI = [{"role": "user", "content": "Hi"}]
#: A valid body per JSON route: the fuzzer changes one place of it.
BASE_BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"model": MODEL_ID, "messages": HI, "max_tokens": 2, "temperature": 0},
    "/v1/completions": {"model": MODEL_ID, "prompt": "Hi", "max_tokens": 2, "stop": ["\n"]},
    "/v1/embeddings": {"model": EMBEDDING_MODEL, "input": ["Hi", "there"], "encoding_format": "float"},
    "/v1/batches": {"input_file_id": "file-none", "endpoint": "/v1/chat/completions", "completion_window": "24h"},
    "/v1/responses": {"model": MODEL_ID, "input": "Hi", "max_output_tokens": 2},
    "/v1/messages": {"model": MODEL_ID, "max_tokens": 2, "messages": HI, "system": "Be brief."},
    "/v1/messages/count_tokens": {"model": MODEL_ID, "messages": HI},
    "/api/show": {"model": MODEL_ID},
    "/api/chat": {"model": MODEL_ID, "messages": HI, "stream": False, "options": {"num_predict": 2}},
    "/api/generate": {"model": MODEL_ID, "prompt": "Hi", "stream": False, "options": {"num_predict": 2}},
    "/api/embed": {"model": EMBEDDING_MODEL, "input": ["Hi"]},
    "/api/embeddings": {"model": EMBEDDING_MODEL, "prompt": "Hi"},
    "/infill": {"input_prefix": "def add(a, b):\n    return ", "input_suffix": "\n", "n_predict": 2},
    # llama-server's native routes (issue 44)
    "/completion": {"prompt": "Hi", "n_predict": 2, "temperature": 0},
    "/completions": {"prompt": ["Hi", 42], "n_predict": 2},
    "/tokenize": {"content": "Hi there", "with_pieces": True},
    "/detokenize": {"tokens": [1, 2, 3]},
    "/apply-template": {"messages": HI},
    "/embedding": {"content": "Hi"},
    "/embeddings": {"input": ["Hi", [1, 2]]},
    "/chat/completions/input_tokens": {"model": MODEL_ID, "messages": HI},
    "/v1/chat/completions/input_tokens": {"messages": HI},
    # rerank, score and classify (issue 41)
    "/v1/rerank": {"model": EMBEDDING_MODEL, "query": "Hi", "documents": ["there", {"text": "you"}], "top_n": 1},
    "/rerank": {"model": EMBEDDING_MODEL, "query": "Hi", "documents": ["there", "you"]},
    "/v2/rerank": {"model": EMBEDDING_MODEL, "query": "Hi", "documents": ["there"], "return_documents": True},
    "/v1/score": {"model": EMBEDDING_MODEL, "text_1": "Hi", "text_2": ["there", "you"]},
    "/v1/classify": {"model": EMBEDDING_MODEL, "input": ["Hi"]},
}
#: Not fuzzed: what changes the server's models or reaches the network, and
#: the `/api/v1/...` and unprefixed twins of OpenAI routes (the same handlers as `/v1/...`).
EXCLUDED = re.compile(
    r"^/api/(pull|delete|copy)$|^/api/v1/(unload|load|pull|debug/fault)$|^/api/v1/|^/(chat/completions|responses)$"
)
MARK = "\x00fuzz-mark\x00"


def json_routes(server: ServerThread) -> list[str]:
    doc = build_document(server.app)
    return sorted(
        path
        for path, ops in doc["paths"].items()
        for op in ops.values()
        if "application/json" in op.get("requestBody", {}).get("content", {}) and not EXCLUDED.search(path)
    )


def multipart_routes(server: ServerThread) -> list[str]:
    doc = build_document(server.app)
    return sorted(
        path
        for path, ops in doc["paths"].items()
        for op in ops.values()
        if "multipart/form-data" in op.get("requestBody", {}).get("content", {}) and not EXCLUDED.search(path)
    )


# ---- hostile JSON ----------------------------------------------------------------------

LONE_SURROGATE = st.tuples(st.text(max_size=6), st.integers(0xD800, 0xDFFF).map(chr), st.text(max_size=6)).map(
    lambda parts: json.dumps("".join(parts))  # "\udXXX": valid JSON, not Unicode
)
WRONG_TYPES = st.sampled_from(
    ["null", "true", "false", "0", "-1", "1.5", '""', '"x"', "[]", "{}", "[1, 2]", '{"a": 1}']
)
HUGE_NUMBERS = st.sampled_from(
    [
        "1e308", "-1e308", "1e309", "-1e309", "1e-400", "-0", "NaN", "Infinity", "-Infinity",
        "9223372036854775808", "-9223372036854775809", "18446744073709551616",
        "9" * 400, "9" * 5000,  # past Python's 4300-digit limit for int()
        "123456789.123456789e300",
    ]
)  # fmt: skip
DEEP = st.integers(2, 6000).flatmap(
    lambda n: st.sampled_from(["[" * n + "]" * n, '{"a": ' * n + "1" + "}" * n, "[" * n + '"\\ud800"' + "]" * n])
)
LONG_TEXT = st.integers(1_000, 100_000).map(lambda n: json.dumps("word " * (n // 5)))
ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
).map(json.dumps)
HOSTILE = st.one_of(LONE_SURROGATE, WRONG_TYPES, HUGE_NUMBERS, DEEP, LONG_TEXT, ANY_JSON)


def paths_of(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place of a JSON value: the root, keys, list items, and one new key per object."""
    places = [prefix]
    if isinstance(value, dict):
        places.append((*prefix, "unexpected_field"))
        for key, item in value.items():
            places += paths_of(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            places += paths_of(item, (*prefix, index))
    return places


def body_with(base: dict[str, Any], place: tuple[Any, ...], fragment: str) -> str:
    """`base` as JSON text with the JSON text `fragment` at `place` (text, so it
    may nest deeper or hold bigger numbers than Python's json would write)."""
    if not place:
        return fragment
    body = copy.deepcopy(base)
    target = body
    for step in place[:-1]:
        target = target[step]
    target[place[-1]] = MARK
    return json.dumps(body).replace(json.dumps(MARK), fragment, 1)


# ---- multipart ---------------------------------------------------------------------------

WAV_HEAD = b"RIFF\x24\x08\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00\x80\x3e\x00\x00\x00\x7d\x00\x00\x02\x00\x10\x00data\x00\x08\x00\x00"
PART_NAMES = ["file", "model", "purpose", "response_format", "temperature", "language", "prompt", "timestamp_granularities[]", "x"]  # fmt: skip
PART_VALUES = st.one_of(
    st.just(b""),
    st.binary(max_size=600),
    st.sampled_from([SPEECH_MODEL.encode(), b"batch", b"json", b"verbose_json", b"word", b"-1", b"nan", b"1e999"]),
    st.binary(max_size=400).map(lambda tail: WAV_HEAD + tail),
    st.text(max_size=40).map(lambda text: text.encode("utf-8", "surrogatepass")),  # may hold surrogates' bytes
    st.just(b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'),
)
PART = st.tuples(
    st.sampled_from(PART_NAMES),
    st.sampled_from([None, "a.wav", "", "lines.jsonl", "../../etc/passwd", "x\ty", "caf\u00e9.mp3"]),
    PART_VALUES,
    st.sampled_from(["quoted", "bare", "no-disposition"]),
)


def multipart_body(parts: list[tuple[str, str | None, bytes, str]], boundary: str, closed: bool) -> bytes:
    out = b""
    for name, filename, value, style in parts:
        out += f"--{boundary}\r\n".encode()
        if style != "no-disposition":
            quoted = f'"{name}"' if style == "quoted" else name
            disposition = f"Content-Disposition: form-data; name={quoted}"
            if filename is not None:
                disposition += f'; filename="{filename}"'
            out += disposition.encode() + b"\r\n"
        out += b"Content-Type: application/octet-stream\r\n\r\n" + value + b"\r\n"
    return out + (f"--{boundary}--\r\n".encode() if closed else b"")


# ---- the checks ----------------------------------------------------------------------------


@pytest.fixture
def server_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.INFO):
        yield caplog


def assert_clean_log(log: pytest.LogCaptureFixture) -> None:
    for record in log.records:
        text = f"{record.name}: {record.getMessage()}"
        assert record.exc_info is None, f"traceback logged: {text}"
        assert "Traceback" not in text and record.levelno < logging.ERROR, text


def assert_answers_normally(server: ServerThread) -> None:
    with httpx.Client(base_url=server.base_url, headers=HEADERS, timeout=120) as http:
        assert http.get("/health").json() == {"status": "ok"}
        reply = http.post("/v1/chat/completions", json=BASE_BODIES["/v1/chat/completions"])
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] >= 1
    assert server.wait_in_flight(lambda n: n == 0, timeout=60) == 0


def assert_not_a_server_error(response: httpx.Response, what: str) -> None:
    assert response.status_code < 500, f"{what}: {response.status_code} {response.text[:500]}"
    if response.status_code >= 400:
        assert isinstance(response.json(), dict), response.text[:200]  # an error envelope, in some dialect


def test_every_json_route_is_fuzzed(fuzz_server: ServerThread) -> None:
    """A new JSON route gets a base body here, or is fuzzed from an empty one."""
    missing = [path for path in json_routes(fuzz_server) if path not in BASE_BODIES]
    assert not missing, f"give these routes a base body in BASE_BODIES: {missing}"


@pytest.mark.parametrize("route", sorted(BASE_BODIES))
def test_json_route_answers_hostile_bodies_below_500(
    fuzz_server: ServerThread, server_log: pytest.LogCaptureFixture, route: str
) -> None:
    base = BASE_BODIES[route]
    places = paths_of(base)

    @ROUTE_FUZZ
    @given(place=st.sampled_from(places), fragment=HOSTILE)
    def run(place: tuple[Any, ...], fragment: str) -> None:
        content = body_with(base, place, fragment).encode("utf-8", "surrogatepass")
        headers = {**HEADERS, "Content-Type": "application/json"}
        response = httpx.post(fuzz_server.base_url + route, headers=headers, content=content, timeout=180)
        assert_not_a_server_error(response, f"{route} with {fragment[:80]!r} at {place}")

    run()
    assert_clean_log(server_log)
    assert_answers_normally(fuzz_server)


@pytest.mark.parametrize("route", ["/v1/audio/transcriptions", "/v1/audio/translations", "/v1/files"])
def test_multipart_route_answers_odd_parts_below_500(
    fuzz_server: ServerThread, server_log: pytest.LogCaptureFixture, route: str
) -> None:
    assert route in multipart_routes(fuzz_server)

    @ROUTE_FUZZ
    @given(
        parts=st.lists(PART, max_size=5),
        cut=st.one_of(st.none(), st.floats(0.0, 1.0)),
        closed=st.booleans(),
        boundary=st.sampled_from(["xyz", "----b0undary", "a" * 70]),
    )
    def run(parts: list[tuple[str, str | None, bytes, str]], cut: float | None, closed: bool, boundary: str) -> None:
        body = multipart_body(parts, boundary, closed)
        if cut is not None:
            body = body[: int(len(body) * cut)]
        response = httpx.post(
            fuzz_server.base_url + route,
            headers={**HEADERS, "Content-Type": f"multipart/form-data; boundary={boundary}"},
            content=body,
            timeout=180,
        )
        assert_not_a_server_error(response, f"{route} with {len(parts)} parts, cut {cut}, closed {closed}")

    run()
    assert_clean_log(server_log)
    assert_answers_normally(fuzz_server)
