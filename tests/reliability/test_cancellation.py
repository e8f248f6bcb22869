"""Cancellation storm: 200 streaming requests with a large `max_tokens`, each
dropped by its client after the first token. The work must be freed: the
running count returns to 0 and a fresh request completes in normal time."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.api.harness import API_KEY, MODEL_ID, ServerThread
from tests.reliability.conftest import start_server_thread

pytestmark = pytest.mark.slow

NUM_REQUESTS = 200
CONCURRENCY = 40  # 16 slots and a queue of 64: stay under both, no 503 here


@pytest.fixture(scope="module")
def storm_server() -> Iterator[ServerThread]:
    """Like the shared API server (16 slots, API key), with one llama.cpp
    thread: on a busy machine, waiting threads make every step crawl."""
    srv = start_server_thread(api_key=API_KEY, parallel=16, max_queue=64, ctx_size=2048, kv_size=8192)
    try:
        yield srv
    finally:
        srv.stop()


HEADERS = {"Authorization": f"Bearer {API_KEY}"}


def storm_body(i: int) -> dict[str, object]:
    return {
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": f"Story number {i}: write a very long story."}],
        "max_tokens": 1500,
        "ignore_eos": True,
        "stream": True,
    }


async def drop_after_first_token(client: httpx.AsyncClient, i: int) -> float:
    """Stream until the first content token, then leave; half of the clients
    close cleanly, half reset the connection (RST)."""
    started = time.monotonic()
    async with client.stream("POST", "/v1/chat/completions", json=storm_body(i)) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if line.startswith("data: ") and '"content":"' in line and '"content":""' not in line:
                break
        else:
            raise AssertionError("the stream ended before its first token")
        if i % 2:
            _reset(response)
    return time.monotonic() - started


def _reset(response: httpx.Response) -> None:
    """Close the socket under the response with SO_LINGER 0: the peer sees a reset."""
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if isinstance(sock, socket.socket):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def fresh_request_seconds(server: ServerThread) -> float:
    started = time.monotonic()
    response = httpx.post(
        f"{server.base_url}/v1/chat/completions",
        headers=HEADERS,
        json={
            "model": MODEL_ID,
            "messages": [{"role": "user", "content": "Count to five."}],
            "max_tokens": 16,
            "temperature": 0,
        },
        timeout=120,
    )
    assert response.status_code == 200, response.text
    return time.monotonic() - started


def running_count(server: ServerThread) -> tuple[int, int]:
    """(in flight, running + waiting) of the model, as /api/v1/stats shows them."""
    stats = httpx.get(f"{server.base_url}/api/v1/stats", headers=HEADERS, timeout=30).json()
    model = next(m for m in stats["models"] if m["id"] == MODEL_ID)
    return model["in_flight"], sum(model["running"].values()) + sum(model["waiting"].values())


async def test_cancellation_storm_frees_everything(storm_server: ServerThread) -> None:
    server = storm_server
    baseline_s = await asyncio.to_thread(fresh_request_seconds, server)
    storm_started = time.monotonic()
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=0)
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(client: httpx.AsyncClient, i: int) -> float:
        async with gate:
            return await drop_after_first_token(client, i)

    async with httpx.AsyncClient(base_url=server.base_url, headers=HEADERS, timeout=300, limits=limits) as client:
        times = await asyncio.wait_for(asyncio.gather(*(one(client, i) for i in range(NUM_REQUESTS))), timeout=600)
    assert len(times) == NUM_REQUESTS
    storm_s = time.monotonic() - storm_started

    # Every dropped request is aborted: nothing in flight, nothing scheduled.
    deadline = time.monotonic() + 60
    while (counts := await asyncio.to_thread(running_count, server)) != (0, 0) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert counts == (0, 0)
    assert server.num_in_flight() == 0
    snapshot = server.call(lambda: server.engine.stats()[MODEL_ID].scheduler.sequences)
    deadline = time.monotonic() + 10
    while snapshot and time.monotonic() < deadline:  # the step thread publishes every 100 ms
        await asyncio.sleep(0.2)
        snapshot = server.call(lambda: server.engine.stats()[MODEL_ID].scheduler.sequences)
    assert snapshot == ()
    # 200 x 1500 tokens would keep the model busy for many minutes; freed, a
    # fresh request takes about as long as before the storm.
    after_s = await asyncio.to_thread(fresh_request_seconds, server)
    assert after_s < 5 * baseline_s + 10, (baseline_s, after_s)
    print(f"\nstorm: {NUM_REQUESTS} streams dropped after the first token in {storm_s:.1f} s; "
          f"fresh request {baseline_s:.2f} s before, {after_s:.2f} s after")  # fmt: skip
