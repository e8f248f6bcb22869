"""The dashboard against scripted sources: what it shows and what its keys do."""

from __future__ import annotations

import copy
from datetime import datetime, timedelta

from localserve.tui.app import DashboardApp
from localserve.tui.source import SourceError
from localserve.tui.widgets.classes import ClassPanel
from localserve.tui.widgets.dialogs import ConfirmScreen, HelpScreen
from localserve.tui.widgets.header import ConnectionBanner, ServerHeader
from localserve.tui.widgets.models import ModelsPanel
from localserve.tui.widgets.requests import RequestTable
from tests.tui.fakes import DownSource, QueueSource, ScriptedSource, fixed_snapshot
from tests.tui.helpers import screen_text, wait_for

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


class Clock:
    """A wall clock the test moves."""

    def __init__(self) -> None:
        self.now = datetime(2025, 6, 1, 14, 3, 7)

    def __call__(self) -> datetime:
        return self.now


async def test_shows_models_classes_requests_and_batches() -> None:
    app = DashboardApp(ScriptedSource([fixed_snapshot()]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.num_snapshots == 1, what="the snapshot")
        await pilot.pause()
        assert app.query_one(RequestTable).row_count == 11
        assert table_ids(app)[0] == "chatcmpl-00" + "ab12cd34ef" * 3  # oldest first
        header = str(app.query_one(ServerHeader).render())
        assert "CPU 187%" in header and "RSS 612 MB" in header
        models = screen_text(app, ModelsPanel)
        assert "▶ smollm2-135m-instruct" in models and "llamacpp" in models and "openvino" in models
        assert "0/30" in models and "98 MiB" in models and "1.4 GiB" in models and "1024×8" in models
        assert "in 4m05s" in models and "in use" in models and "all-minilm-l6-v2" in models
        # --threads auto chose one thread of two while another program held a core
        title = str(app.query_one(ModelsPanel).border_title)
        assert "1/2" in models and "CPU busy elsewhere (1.0 cores): smollm2-135m-instruct runs on 1 of 2" in title
        assert app.query_one(ConnectionBanner).visible_message == ""
        assert len(app.query("BatchRow")) == 2


async def test_priority_panel_leads_with_interactive_figures_of_the_focused_model() -> None:
    app = DashboardApp(ScriptedSource([fixed_snapshot()]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.num_snapshots == 1)
        await pilot.pause()
        lines = screen_text(app, ClassPanel).splitlines()
        rows = [line.split() for line in lines if line.split()[:1] in (["interactive"], ["default"], ["batch"])]
        assert [row[0] for row in rows] == ["interactive", "default", "batch"]
        # class, run, queued, TTFT p50 p95, wait p50 p95, ITL p50 p95
        assert rows[0][1:] == ["2", "0", "118ms", "420ms", "4.0ms", "21ms", "31ms", "58ms"]
        assert rows[2][3:5] == ["6.20s", "10.5s"]  # batch waits by design; shown apart
        assert "smollm2-135m-instruct" in str(app.query_one(ClassPanel).border_title)
        # What the scheduler did with batch work, on the panel's bottom edge.
        assert str(app.query_one(ClassPanel).border_subtitle) == (
            "batch: shared · step limit 45ms · 1 in step, 3 held back"
        )
        await pilot.press("m")  # the next model: qwen has figures only for interactive
        await pilot.pause()
        rows = [line.split() for line in screen_text(app, ClassPanel).splitlines()]
        assert ["default", "0", "0", "-", "-", "-", "-", "-", "-"] in rows
        assert "qwen2.5-coder-0.5b" in str(app.query_one(ClassPanel).border_title)
        assert "▶ qwen2.5-coder-0.5b" in screen_text(app, ModelsPanel)


async def test_unmeasured_figures_are_dashes_not_zeros() -> None:
    snapshot = fixed_snapshot()
    snapshot["models"][0]["classes"] = {}
    snapshot["requests"] = [{**snapshot["requests"][0], "tokens_per_s": None, "ttft_s": None}]
    app = DashboardApp(ScriptedSource([snapshot]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.num_snapshots == 1)
        await pilot.pause()
        panel = screen_text(app, ClassPanel)
        assert "0ms" not in panel and "0 ms" not in panel
        assert ["interactive", "2", "0", "-", "-", "-", "-", "-", "-"] in [line.split() for line in panel.splitlines()]
        row = screen_text(app, RequestTable).splitlines()[1].split()  # under the column headers
        assert row[-2:] == ["-", "-"]  # TTFT and Tok/s


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


async def test_cancel_asks_and_cancels_the_request_selected_at_the_key() -> None:
    source = QueueSource()
    app = DashboardApp(source)
    async with app.run_test(size=SIZE) as pilot:
        first = fixed_snapshot()
        source.queue.put_nowait(first)
        await wait_for(pilot, lambda: app.num_snapshots == 1)
        await pilot.press("down", "c")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the question")
        chosen = table_ids(app)[1]
        assert chosen in str(app.screen.question)
        # While the question is open, rows re-sort under the cursor: a new
        # oldest request takes the first line.
        second = copy.deepcopy(first)
        second["requests"].append({**first["requests"][0], "id": "chatcmpl-new", "age_s": 500.0})
        source.queue.put_nowait(second)
        await wait_for(pilot, lambda: app.num_snapshots == 2)
        assert source.cancelled == []
        await pilot.press("y")
        await wait_for(pilot, lambda: source.cancelled, what="the cancel call")
        assert source.cancelled == [chosen]


async def test_cancel_declined_does_nothing() -> None:
    source = ScriptedSource([fixed_snapshot()])
    app = DashboardApp(source)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.num_snapshots == 1)
        await pilot.press("c")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("escape")
        await pilot.pause(0.2)
        assert source.cancelled == [] and not isinstance(app.screen, ConfirmScreen)


async def test_unload_asks_first_and_unloads_the_focused_model() -> None:
    source = ScriptedSource([fixed_snapshot()])
    app = DashboardApp(source)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.num_snapshots == 1)
        await pilot.press("ctrl+end")  # the last row runs on the second model: the focus follows it
        assert app.target_model() == "qwen2.5-coder-0.5b"
        await pilot.press("u")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert source.unloaded == []
        await pilot.press("y")
        await wait_for(pilot, lambda: source.unloaded, what="the unload call")
        assert source.unloaded == ["qwen2.5-coder-0.5b"]


async def test_help_overlay_opens_and_closes() -> None:
    app = DashboardApp(ScriptedSource([fixed_snapshot()]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.num_snapshots == 1)
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="the help")
        text = screen_text(app)
        assert "time to first token" in text and "filter requests" in text and "reverse the sort" in text
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: not isinstance(app.screen, HelpScreen), what="the help to close")


async def test_slash_filters_requests_and_escape_clears() -> None:
    app = DashboardApp(ScriptedSource([fixed_snapshot()]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.num_snapshots == 1)
        table = app.query_one(RequestTable)
        await pilot.press("slash", *"batch")
        await pilot.pause()
        assert table.row_count == 4 and all(r.priority_class == "batch" for r in table.requests.values())
        assert "4 of 11" in str(table.border_title) and "batch" in str(table.border_title)
        await pilot.press("enter")  # keeps the filter, back to the table
        assert table.has_focus and table.row_count == 4
        await pilot.press("c")  # keys act on the table again
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("n", "slash", "escape")
        await pilot.pause()
        assert table.row_count == 11 and table.has_focus


async def test_sort_keys_and_header_click_reorder_the_table() -> None:
    app = DashboardApp(ScriptedSource([fixed_snapshot()]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.num_snapshots == 1)
        table = app.query_one(RequestTable)
        assert table.sort_key == "age"
        await pilot.press("s")  # age -> wait
        assert table.sort_key == "wait"
        await pilot.press("s", "s")  # -> TTFT -> Tok/s, fastest first, no rate last
        assert table.sort_key == "tokens_per_s"
        assert table_ids(app)[0] == "cmpl-fim-7f3e"
        await pilot.press("r")
        assert not table.sort_reverse and table.requests[table_ids(app)[-1]].request_id == "cmpl-fim-7f3e"
        await pilot.press("S")  # back to TTFT
        assert table.sort_key == "ttft"
        await pilot.click("RequestTable", offset=(header_x(table, "priority"), 1))
        await pilot.pause()
        assert table.sort_key == "priority"
        assert table.selected is not None


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


async def test_starts_without_a_server_and_says_so() -> None:
    app = DashboardApp(DownSource(), retry_s=(0.05, 0.1))
    async with app.run_test(size=SIZE) as pilot:
        banner = app.query_one(ConnectionBanner)
        await wait_for(pilot, lambda: "disconnected" in banner.visible_message, what="the banner")
        assert "retry in" in banner.visible_message and "cannot connect" in banner.visible_message
        await wait_for(pilot, lambda: app.source.num_connects >= 3, what="retries")
        assert app.is_running and "STALE" not in str(app.query_one(ServerHeader).render())


async def test_lost_connection_marks_the_data_stale_since_when() -> None:
    source = QueueSource()
    clock = Clock()
    app = DashboardApp(source, retry_s=(5.0, 5.0), clock=clock)
    async with app.run_test(size=SIZE) as pilot:
        banner = app.query_one(ConnectionBanner)
        assert "connecting to" in banner.visible_message
        source.queue.put_nowait(fixed_snapshot())
        await wait_for(pilot, lambda: banner.visible_message == "", what="connected")
        clock.now += timedelta(seconds=20)
        source.queue.put_nowait(SourceError("connection lost"))
        await wait_for(pilot, lambda: "disconnected" in banner.visible_message, what="the banner")
        assert "since 14:03:27 (0s ago)" in banner.visible_message and "connection lost" in banner.visible_message
        assert app.screen.has_class("-stale")
        assert "STALE 14:03:07" in str(app.query_one(ServerHeader).render())  # when the data on screen came
        clock.now += timedelta(seconds=3)
        await wait_for(pilot, lambda: "(3s ago)" in banner.visible_message, what="the banner to count")
        assert "retry in 2s" in banner.visible_message
        source.queue.put_nowait(fixed_snapshot())
        await wait_for(pilot, lambda: banner.visible_message == "", timeout=15, what="the banner to go")
        assert not app.screen.has_class("-stale") and "STALE" not in str(app.query_one(ServerHeader).render())
        assert source.num_connects == 2


async def test_narrow_screen_keeps_full_class_names_and_wraps_the_header() -> None:
    snapshot = fixed_snapshot()
    snapshot["devices"] = [{"backend": "llamacpp", "available": True, "devices": ["CPU"]}]
    app = DashboardApp(ScriptedSource([snapshot]))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.num_snapshots == 1)
        await pilot.press("p")
        await pilot.pause()
        header = screen_text(app, ServerHeader)
        assert "devices llamacpp: CPU" in header and "PAUSED (p resumes)" in header  # wrapped, not cut
        table = screen_text(app, RequestTable)
        assert "interactive" in table and "default" in table and " int " not in table
        assert app.query_one(RequestTable).row_count == 11 and len(table.splitlines()) >= 6  # 5 rows shown, at least
        assert "decode 182 tok/s" in str(app.query_one(ClassPanel).border_title)  # the charts are hidden


async def test_the_header_shows_the_data_disk_and_marks_it_when_low_or_read_only() -> None:
    plenty, low, read_only = fixed_snapshot(), fixed_snapshot(), fixed_snapshot()
    plenty["disk"] = {"free_bytes": 52_300_000_000, "total_bytes": 10**11, "writable": True, "low": False}
    low["disk"] = {"free_bytes": 700_000_000, "total_bytes": 10**11, "writable": True, "low": True}
    read_only["disk"] = {"free_bytes": 0, "total_bytes": 10**11, "writable": False, "low": True}
    shown: list[tuple[str, list[object]]] = []  # the header's text, and the style of each part
    for snapshot in (plenty, low, read_only):
        app = DashboardApp(ScriptedSource([snapshot]))
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda app=app: app.num_snapshots == 1)
            await pilot.pause()
            header = app.query_one(ServerHeader)
            shown.append((str(header.render()), [part.style for part in header.parts()]))
    assert "disk 52.3 GB free" in shown[0][0] and "bold reverse yellow" not in shown[0][1]
    assert "disk 700 MB free" in shown[1][0] and "bold reverse yellow" in shown[1][1]
    assert "disk READ-ONLY" in shown[2][0] and "bold reverse red" in shown[2][1]
