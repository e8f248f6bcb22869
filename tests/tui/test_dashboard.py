"""The dashboard against scripted sources: what it shows and what its keys do."""

from __future__ import annotations

import copy

from localserve.tui.app import DashboardApp
from localserve.tui.source import SourceError
from localserve.tui.widgets.header import ConnectionBanner, ServerHeader
from localserve.tui.widgets.requests import RequestTable
from tests.tui.fakes import DownSource, QueueSource, ScriptedSource, fixed_snapshot
from tests.tui.helpers import wait_for

SIZE = (120, 36)


def table_ids(app: DashboardApp) -> list[str]:
    table = app.query_one(RequestTable)
    return [str(row.value) for row in table.rows]


def header_x(table: RequestTable, key: str) -> int:
    """The x offset (inside the table's border) of a column's header."""
    x = 1
    for column in table.ordered_columns:
        if column.key.value == key:
            return x + 1
        x += column.get_render_width(table)
    raise KeyError(key)


async def test_shows_requests_models_and_batches() -> None:
    app = DashboardApp(ScriptedSource([fixed_snapshot()]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.num_snapshots == 1, what="the snapshot")
        await pilot.pause()
        table = app.query_one(RequestTable)
        assert table.row_count == 11
        assert table_ids(app)[0] == "chatcmpl-00" + "ab12cd34ef" * 3  # oldest first
        header = str(app.query_one(ServerHeader).render())
        assert "smollm2-135m-instruct" in header and "llamacpp/cpu" in header and "openvino/npu" in header
        assert "CPU 187%" in header and "RSS 612 MB" in header
        assert "all-minilm-l6-v2  embeddings  queue 12  running 32" in header
        assert app.query_one(ConnectionBanner).visible_message == ""
        assert len(app.query("BatchRow")) == 2


async def test_selection_follows_its_request_when_rows_reorder() -> None:
    source = QueueSource()
    app = DashboardApp(source)
    async with app.run_test(size=SIZE) as pilot:
        first = fixed_snapshot()
        source.queue.put_nowait(first)
        await wait_for(pilot, lambda: app.num_snapshots == 1)
        table = app.query_one(RequestTable)
        await pilot.press("down", "down", "down")
        chosen = table.selected
        assert chosen is not None and table.cursor_row == 3
        # The two oldest requests finish and a new one arrives; the rest get older.
        second = copy.deepcopy(first)
        second["requests"] = [{**r, "age_s": r["age_s"] + 1} for r in second["requests"][2:]]
        second["requests"].append({**first["requests"][0], "id": "chatcmpl-new", "age_s": 500.0})
        source.queue.put_nowait(second)
        await wait_for(pilot, lambda: app.num_snapshots == 2)
        await pilot.pause()
        assert table_ids(app)[0] == "chatcmpl-new"
        selected = table.selected
        assert selected is not None and selected.request_id == chosen.request_id
        assert table.cursor_row == 2  # two rows above it left, one came in on top


async def test_cancel_key_cancels_the_selected_request() -> None:
    source = ScriptedSource([fixed_snapshot()])
    app = DashboardApp(source)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.num_snapshots == 1)
        await pilot.press("down", "c")
        await wait_for(pilot, lambda: source.cancelled, what="the cancel call")
        assert source.cancelled == [table_ids(app)[1]]


async def test_unload_key_asks_for_a_second_press() -> None:
    source = ScriptedSource([fixed_snapshot()])
    app = DashboardApp(source)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.num_snapshots == 1)
        await pilot.press("ctrl+end")  # the last row runs on the second model
        assert app.target_model() == "qwen2.5-coder-0.5b"
        assert "▶ qwen2.5-coder-0.5b" in str(app.query_one(ServerHeader).render())
        await pilot.press("u")
        await pilot.pause(0.2)
        assert source.unloaded == []
        await pilot.press("u")
        await wait_for(pilot, lambda: source.unloaded, what="the unload call")
        assert source.unloaded == ["qwen2.5-coder-0.5b"]


async def test_pause_freezes_the_view_and_resume_catches_up() -> None:
    source = QueueSource()
    app = DashboardApp(source)
    async with app.run_test(size=SIZE) as pilot:
        source.queue.put_nowait(fixed_snapshot())
        await wait_for(pilot, lambda: app.num_snapshots == 1)
        await pilot.press("p")
        assert "PAUSED" in str(app.query_one(ServerHeader).render())
        fewer = fixed_snapshot()
        fewer["requests"] = fewer["requests"][:3]
        source.queue.put_nowait(fewer)
        await wait_for(pilot, lambda: app.num_snapshots == 2)
        assert app.query_one(RequestTable).row_count == 11
        await pilot.press("p")
        assert app.query_one(RequestTable).row_count == 3
        assert "PAUSED" not in str(app.query_one(ServerHeader).render())


async def test_sort_key_and_header_click_reorder_the_table() -> None:
    app = DashboardApp(ScriptedSource([fixed_snapshot()]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.num_snapshots == 1)
        table = app.query_one(RequestTable)
        await pilot.press("s")  # age -> tok/s, fastest first
        assert table.sort_key == "tokens_per_s"
        assert table_ids(app)[0] == "cmpl-fim-7f3e"
        await pilot.click("RequestTable", offset=(header_x(table, "priority"), 1))
        await pilot.pause()
        assert table.sort_key == "priority"
        assert table.selected is not None


async def test_starts_without_a_server_and_says_so() -> None:
    app = DashboardApp(DownSource(), retry_s=(0.05, 0.1))
    async with app.run_test(size=SIZE) as pilot:
        banner = app.query_one(ConnectionBanner)
        await wait_for(pilot, lambda: "disconnected" in banner.visible_message, what="the banner")
        assert "retrying" in banner.visible_message and "cannot connect" in banner.visible_message
        await wait_for(pilot, lambda: app.source.num_connects >= 3, what="retries")
        assert app.is_running


async def test_banner_comes_and_goes_with_the_connection() -> None:
    source = QueueSource()
    app = DashboardApp(source, retry_s=(0.05, 0.1))
    async with app.run_test(size=SIZE) as pilot:
        banner = app.query_one(ConnectionBanner)
        assert "connecting to" in banner.visible_message
        source.queue.put_nowait(fixed_snapshot())
        await wait_for(pilot, lambda: banner.visible_message == "", what="connected")
        source.queue.put_nowait(SourceError("connection lost"))
        await wait_for(pilot, lambda: "disconnected" in banner.visible_message, what="the banner")
        assert app.screen.has_class("-stale")
        source.queue.put_nowait(fixed_snapshot())
        await wait_for(pilot, lambda: banner.visible_message == "", what="the banner to go")
        assert not app.screen.has_class("-stale")
        assert source.num_connects == 2
