"""The dashboard against a real server running the real model, over HTTP.

Set LOCALSERVE_DASHBOARD_SCREENSHOT=docs/dashboard.svg to save the
dashboard for the README, with a batch job in progress beside interactive
chats (`test_priority_story_with_a_batch_job`).
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
from localserve.tui.widgets.classes import ClassPanel
from localserve.tui.widgets.dialogs import ConfirmScreen
from localserve.tui.widgets.header import ConnectionBanner
from localserve.tui.widgets.requests import RequestTable
from tests.tui.helpers import screen_text, wait_for
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
        finally:
            await stop_all(tasks)


async def chat_forever(http: httpx.AsyncClient, priority: str, max_tokens: int) -> None:
    """Short chats one after another, as a person at a chat window would send them."""
    while True:
        await stream_chat(http, max_tokens=max_tokens, priority=priority)


async def start_batch_job(http: httpx.AsyncClient, num_lines: int, max_tokens: int) -> str:
    """A Batch API job of `num_lines` chats (the runner sends them at `batch` priority)."""
    lines = [
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": MODEL_ID,
                "messages": [{"role": "user", "content": f"{PROMPT} Chapter {i}."}],
                "max_tokens": max_tokens,
                "ignore_eos": True,
            },
        }
        for i in range(num_lines)
    ]
    data = "\n".join(json.dumps(line) for line in lines).encode()
    upload = await http.post("/v1/files", files={"file": ("story.jsonl", data)}, data={"purpose": "batch"})
    assert upload.status_code == 200, upload.text
    body = {"input_file_id": upload.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    batch = await http.post("/v1/batches", json=body)
    assert batch.status_code == 200, batch.text
    return str(batch.json()["id"])


def class_row(app: DashboardApp, name: str) -> list[str]:
    return next(line.split() for line in screen_text(app, ClassPanel).splitlines() if line.split()[:1] == [name])


async def test_priority_story_with_a_batch_job(live: LiveServer) -> None:
    """Interactive chats beside a batch job: the dashboard shows their figures
    apart, and the interactive ones are the short ones."""
    async with httpx.AsyncClient(base_url=live.base_url, timeout=300, trust_env=False) as http:
        await wait_idle(http)
        chats = [asyncio.create_task(stream_chat(http, max_tokens=900))]  # one long default answer
        chats += [asyncio.create_task(chat_forever(http, "interactive", max_tokens=24)) for _ in range(2)]
        while not await server_requests(http):
            await asyncio.sleep(0.05)
        batch_id = await start_batch_job(http, num_lines=60, max_tokens=16)
        app = DashboardApp(HttpSource(live.base_url))
        try:
            async with app.run_test(size=SIZE) as pilot:

                def measured() -> bool:
                    snap = app.snapshot
                    model = snap.models[0] if snap and snap.models else None
                    return bool(
                        model
                        and model.of_class("interactive").num_requests >= 3
                        and model.of_class("batch").ttft_p95_s is not None
                        and snap.batches
                        and snap.batches[0].num_done > 0
                    )

                await wait_for(pilot, measured, timeout=180, what="figures of both classes and batch progress")
                model = app.snapshot.models[0]
                interactive, batch = model.of_class("interactive"), model.of_class("batch")
                assert interactive.ttft_p95_s < batch.ttft_p95_s  # batch work waits by design; shown apart
                assert interactive.queue_wait_p95_s is not None and interactive.itl_p50_s is not None
                job = app.snapshot.batches[0]
                assert job.batch_id == batch_id and job.status == "in_progress" and job.failed == 0
                assert class_row(app, "interactive")[0] == "interactive" and "-" not in class_row(app, "interactive")
                assert model.keep_alive.keep_alive and model.weights_mib > 0 and model.n_layers == 30
                if target := os.environ.get("LOCALSERVE_DASHBOARD_SCREENSHOT"):
                    await pilot.pause(20.0)  # some of the charts filled; the batch job still runs
                    assert app.snapshot.batches[0].status == "in_progress" and app.snapshot.batches[0].failed == 0
                    path = Path(target)
                    app.save_screenshot(path.name, path=str(path.parent))
        finally:
            await stop_all(chats)
            await http.post(f"/v1/batches/{batch_id}/cancel")


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
                await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the question")
                await pilot.press("y")
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
        assert "retry in" in banner.visible_message
        await pilot.pause(1.0)  # a few failed attempts while nobody listens
        assert app.is_running and "disconnected" in banner.visible_message
        await asyncio.to_thread(live.start)
        await wait_for(pilot, lambda: not banner.visible_message, timeout=60, what="the banner to go")
        await asyncio.to_thread(live.wait_healthy)
        await wait_for(pilot, lambda: bool(app.snapshot and app.snapshot.models), timeout=60, what="the model")
