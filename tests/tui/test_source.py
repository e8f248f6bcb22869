"""`HttpSource` against the real stats routes (an app with no model), and the
lenient snapshot parsing."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestServer

from localserve.tui.fmt import fmt_duration
from localserve.tui.snapshot import Snapshot
from localserve.tui.source import HttpSource, SourceError, sse_data
from tests.tui.fakes import fixed_snapshot
from tests.tui.live import empty_app, free_port


async def lines(*items: str) -> AsyncIterator[str]:
    for item in items:
        yield item


async def test_sse_data_joins_lines_and_skips_comments() -> None:
    stream = lines(": hello", 'data: {"a":', "data: 1}", "", "event: x", "data: 2", "", "data: 3")
    assert [d async for d in sse_data(stream)] == ['{"a":\n1}', "2", "3"]


async def test_streams_snapshots_from_a_server() -> None:
    async with TestServer(empty_app()) as server:
        source = HttpSource(str(server.make_url("")), interval_ms=100)
        try:
            received = []
            async for snapshot in source.snapshots():
                received.append(snapshot)
                if len(received) == 2:
                    break
        finally:
            await source.aclose()
    assert received[0].version and received[0].process.rss_bytes > 0
    assert received[1].uptime_s > received[0].uptime_s


async def test_explains_a_missing_api_key() -> None:
    async with TestServer(empty_app(api_key="secret")) as server:
        source = HttpSource(str(server.make_url("")))
        with pytest.raises(SourceError, match="wants an API key"):
            async for _ in source.snapshots():
                pass
        with pytest.raises(SourceError, match="wants an API key"):
            await source.cancel("chatcmpl-1")
        await source.aclose()
        keyed = HttpSource(str(server.make_url("")), api_key="secret")
        with pytest.raises(SourceError, match="no running request"):  # the server's own message
            await keyed.cancel("chatcmpl-1")
        await keyed.aclose()


async def test_explains_a_server_that_is_not_there() -> None:
    source = HttpSource(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(SourceError, match="cannot connect"):
        async for _ in source.snapshots():
            pass
    with pytest.raises(SourceError, match="did not answer"):
        await source.unload("m")
    await source.aclose()


def test_parsing_is_lenient() -> None:
    assert Snapshot.from_json({}) == Snapshot()
    odd = Snapshot.from_json({"models": [{"id": "m", "kv_used": "many", "running": {"batch": 2}}, 7], "requests": None})
    assert odd.models[0].kv_used == 0 and odd.models[0].num_running == 2 and odd.requests == ()
    full = Snapshot.from_json(fixed_snapshot())
    assert full.by_class("running") == {"interactive": 3, "default": 3, "batch": 1}
    assert full.batches[0].num_done == 215 and full.decode_tokens_per_s == pytest.approx(182.4)


def test_durations_read_well() -> None:
    assert [fmt_duration(s) for s in (0, 59.9, 65, 3725, 90000)] == ["0s", "59s", "1m05s", "1h02m", "1d01h"]


def test_devices_of_installed_backends_are_listed() -> None:
    snap = Snapshot.from_json(
        {
            "devices": [
                {"backend": "llamacpp", "available": True, "devices": ["CPU", "CUDA0"]},
                {"backend": "openvino", "available": False, "devices": []},
                "junk",
            ]
        }
    )
    assert snap.devices == ("llamacpp: CPU,CUDA0",)
