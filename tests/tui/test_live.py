"""The dashboard against a real server running the real model, over HTTP.

Set LOCALSERVE_DASHBOARD_SCREENSHOT=docs/dashboard.svg to save the
dashboard under load for the README.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from localserve.tui.app import DashboardApp
from localserve.tui.source import HttpSource
from localserve.tui.widgets.header import ConnectionBanner
from localserve.tui.widgets.requests import RequestTable
from tests.tui.helpers import wait_for
from tests.tui.live import MODEL_ID, LiveServer

pytestmark = pytest.mark.slow

SIZE = (120, 36)
PROMPT = "Write a very long story about a lighthouse keeper and the sea."


@dataclass
class StreamResult:
    answer_id: str = ""
    finish_reason: str | None = None
    num_chunks: int = 0


async def stream_chat(http: httpx.AsyncClient, *, max_tokens: int, priority: str = "default") -> StreamResult:
    """One streaming chat completion that does not stop early (ignore_eos)."""
    body = {
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": PROMPT}],
        "stream": True,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "priority": priority,
    }
    result = StreamResult()
    async with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            result.answer_id = chunk["id"]
            result.num_chunks += 1
            for choice in chunk["choices"]:
                result.finish_reason = choice.get("finish_reason") or result.finish_reason
    return result


async def server_requests(http: httpx.AsyncClient) -> list[dict]:
    return (await http.get("/api/v1/stats")).json()["requests"]


async def wait_idle(http: httpx.AsyncClient, timeout: float = 60.0) -> None:
    """Until requests of earlier tests have left the server."""
    async with asyncio.timeout(timeout):
        while await server_requests(http):
            await asyncio.sleep(0.1)


async def stop_all(tasks: list[asyncio.Task]) -> None:
    for task in tasks:
        task.cancel()  # closes the connection: the server aborts the request
    await asyncio.gather(*tasks, return_exceptions=True)


def generated(app: DashboardApp) -> dict[str, int]:
    snap = app.snapshot
    return {r.request_id: r.generated_tokens for r in snap.requests} if snap else {}


async def test_table_fills_and_counters_move(live: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=live.base_url, timeout=300, trust_env=False) as http:
        await wait_idle(http)
        priorities = ["interactive", "interactive", "default", "default", "batch", "batch"]
        tasks = [asyncio.create_task(stream_chat(http, max_tokens=900, priority=p)) for p in priorities]
        app = DashboardApp(HttpSource(live.base_url))
        try:
            async with app.run_test(size=SIZE) as pilot:
                table = app.query_one(RequestTable)
                await wait_for(pilot, lambda: table.row_count == 6, timeout=60, what="six rows")
                assert {r.model for r in table.requests.values()} == {MODEL_ID}
                assert {r.priority_class for r in table.requests.values()} == set(priorities[::2])
                # Four slots: two requests wait (the batch ones, lowest priority).
                assert app.snapshot is not None and app.snapshot.by_class("waiting")["batch"] >= 1
                before = generated(app)
                await wait_for(
                    pilot,
                    lambda: any(generated(app).get(rid, 0) > n for rid, n in before.items()),
                    timeout=60,
                    what="generated tokens to grow",
                )
                await wait_for(pilot, lambda: app.snapshot.decode_tokens_per_s > 0, timeout=30, what="a decode rate")
                assert app.snapshot.models[0].kv_used > 0
                assert all(r.state in ("running", "waiting") for r in app.snapshot.requests)
                if target := os.environ.get("LOCALSERVE_DASHBOARD_SCREENSHOT"):
                    await pilot.pause(40.0)  # a third of the charts filled
                    path = Path(target)
                    app.save_screenshot(path.name, path=str(path.parent))
        finally:
            await stop_all(tasks)


async def test_cancel_key_ends_the_request_on_the_server(live: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=live.base_url, timeout=300, trust_env=False) as http:
        await wait_idle(http)
        task = asyncio.create_task(stream_chat(http, max_tokens=900))
        app = DashboardApp(HttpSource(live.base_url))
        try:
            async with app.run_test(size=SIZE) as pilot:
                table = app.query_one(RequestTable)
                await wait_for(pilot, lambda: table.row_count == 1, timeout=60, what="the request's row")
                selected = table.selected
                assert selected is not None
                await pilot.press("c")
                result = await asyncio.wait_for(task, 60)
                assert result.finish_reason == "abort"
                assert result.answer_id == selected.request_id
                assert result.num_chunks < 900  # ended well before max_tokens
                await wait_for(pilot, lambda: table.row_count == 0, timeout=30, what="the row to go")
                assert await server_requests(http) == []
        finally:
            await stop_all([task])


async def test_banner_while_the_server_restarts(live: LiveServer) -> None:
    app = DashboardApp(HttpSource(live.base_url), retry_s=(0.2, 0.5))
    async with app.run_test(size=SIZE) as pilot:
        banner = app.query_one(ConnectionBanner)
        await wait_for(pilot, lambda: app.connected and not banner.visible_message, timeout=30, what="connected")
        await asyncio.to_thread(live.stop)
        await wait_for(pilot, lambda: "disconnected" in banner.visible_message, timeout=30, what="the banner")
        assert "retrying" in banner.visible_message
        await pilot.pause(1.0)  # a few failed attempts while nobody listens
        assert app.is_running and "disconnected" in banner.visible_message
        await asyncio.to_thread(live.start)
        await wait_for(pilot, lambda: not banner.visible_message, timeout=60, what="the banner to go")
        await asyncio.to_thread(live.wait_healthy)
        await wait_for(pilot, lambda: bool(app.snapshot and app.snapshot.models), timeout=60, what="the model")
