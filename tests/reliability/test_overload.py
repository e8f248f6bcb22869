"""Overload: with `max_queue` 8, 100 concurrent requests each end with an
answer or a 503 + `Retry-After` (which the `openai` SDK retries); none
hangs, none gets a 500."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.api.harness import MODEL_ID, ServerThread
from tests.reliability.conftest import start_server_thread

pytestmark = pytest.mark.slow

NUM_REQUESTS = 100
PARALLEL, MAX_QUEUE = 2, 8


@pytest.fixture(scope="module")
def overload_server() -> Iterator[ServerThread]:
    srv = start_server_thread(parallel=PARALLEL, max_queue=MAX_QUEUE, ctx_size=512, kv_size=1024)
    try:
        yield srv
    finally:
        srv.stop()


async def test_overload_is_refused_politely(overload_server: ServerThread) -> None:
    statuses: Counter[int] = Counter()
    refusals: list[httpx.Response] = []

    async def seen(response: httpx.Response) -> None:
        statuses[response.status_code] += 1
        if response.status_code == 503:
            await response.aread()
            refusals.append(response)

    http_client = httpx.AsyncClient(event_hooks={"response": [seen]}, timeout=120)
    client = openai.AsyncOpenAI(
        base_url=f"{overload_server.base_url}/v1", api_key="none", max_retries=2, http_client=http_client
    )

    async def one(i: int) -> str:
        try:
            answer = await client.chat.completions.create(
                model=MODEL_ID, messages=[{"role": "user", "content": f"Say hello {i}."}], max_tokens=4
            )
        except openai.APIStatusError as exc:
            assert exc.status_code == 503, exc
            assert exc.response.headers.get("Retry-After"), exc.response.headers
            return "refused"
        assert answer.choices[0].finish_reason in ("stop", "length")
        return "answered"

    try:
        outcomes = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(NUM_REQUESTS))), timeout=540)
    finally:
        await http_client.aclose()
    counts = Counter(outcomes)
    # Every request ended, with an answer or a polite refusal.
    assert counts["answered"] + counts["refused"] == NUM_REQUESTS
    assert counts["answered"] >= PARALLEL + MAX_QUEUE  # the first wave fits
    # The limit engaged, every refusal was a 503 envelope with Retry-After,
    # and the SDK retried them (more responses than requests).
    assert statuses[503] > 0 and set(statuses) <= {200, 503}, statuses
    assert sum(statuses.values()) > NUM_REQUESTS
    for response in refusals:
        assert response.headers["Retry-After"].isdigit()
        assert response.json()["error"]["code"] == "queue_full"
    assert overload_server.wait_in_flight(lambda n: n == 0, timeout=60) == 0
    print(f"\noverload: {dict(counts)}; HTTP statuses seen {dict(statuses)}")
