"""Servers shared by the API tests. `server` (real SmolLM2, 16 slots, API
key) is loaded once per session and used by nearly every test;
`small_server` (one slot, a queue of one, a 64 KiB body limit, extra allowed
host and origin, no key, fault injection) is for the limits and failure tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from unittest import mock

import httpx
import openai
import pytest

from localserve.api.admin.debug import ENABLE_ENV
from tests.api.harness import API_KEY, ServerThread, make_settings


@pytest.fixture(scope="session")
def server() -> Iterator[ServerThread]:
    """The shared server: 16 slots, 2048-token context, API key required."""
    srv = ServerThread(make_settings(api_key=API_KEY)).start()
    try:
        srv.wait_healthy()
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def small_server() -> Iterator[ServerThread]:
    """One slot, a waiting queue of one, small body limit, no API key;
    `llm.lan` and `https://app.example` allowed as extra host and origin;
    its model runs through a `FaultInjectingBackend` (`test_errors.set_fault`)."""
    settings = make_settings(
        parallel=1,
        max_queue=1,
        ctx_size=1024,
        kv_size=1024,
        max_body_bytes=64 * 1024,
        allow_hosts=["llm.lan"],
        cors_origins=["https://app.example"],
    )
    with mock.patch.dict(os.environ, {ENABLE_ENV: "1"}):  # read when the app is built
        srv = ServerThread(settings).start()
    try:
        srv.wait_healthy()
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def client(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture
def aclient(server: ServerThread) -> openai.AsyncOpenAI:
    # Function-scoped: an async client belongs to the loop of the test using it.
    return openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture
def http(server: ServerThread) -> Iterator[httpx.Client]:
    """Plain HTTP to the shared server, with the API key."""
    with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60) as c:
        yield c
