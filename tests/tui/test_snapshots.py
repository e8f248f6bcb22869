"""Snapshot tests of the main screen (pytest-textual-snapshot): a fixed,
deterministic server history on a fixed wall clock, rendered at 80x24 and
200x50, after losing the connection (stale data), without any server, and
with the help open.

After an intended change of the layout, review and accept the new images with
`pytest tests/tui/test_snapshots.py --snapshot-update`.
"""

from __future__ import annotations

from datetime import datetime

from textual.pilot import Pilot

from localserve.tui.app import DashboardApp
from localserve.tui.widgets.dialogs import HelpScreen
from tests.tui.fakes import LABEL, DownSource, ScriptedSource, history
from tests.tui.helpers import wait_for

NUM_SNAPSHOTS = 120


def clock() -> datetime:
    return datetime(2025, 6, 1, 14, 3, 7)


def busy_app(*, then_fail: str | None = None) -> DashboardApp:
    source = ScriptedSource(history(NUM_SNAPSHOTS), then_fail=then_fail)
    return DashboardApp(source, retry_s=(30.0, 30.0), clock=clock)  # a lost connection: one long, quiet wait


async def all_received(pilot: Pilot) -> None:
    await wait_for(pilot, lambda: pilot.app.num_snapshots == NUM_SNAPSHOTS, timeout=30, what="the history")  # type: ignore[attr-defined]
    await pilot.pause()


def test_dashboard_80x24(snap_compare) -> None:
    assert snap_compare(busy_app(), terminal_size=(80, 24), run_before=all_received)


def test_dashboard_200x50(snap_compare) -> None:
    assert snap_compare(busy_app(), terminal_size=(200, 50), run_before=all_received)


def test_stale_after_losing_the_server_80x24(snap_compare) -> None:
    app = busy_app(then_fail=f"cannot connect to {LABEL}")

    async def lost(pilot: Pilot) -> None:
        await all_received(pilot)
        await wait_for(pilot, lambda: not app.connected, what="the lost connection")
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 24), run_before=lost)


def test_disconnected_80x24(snap_compare) -> None:
    app = DashboardApp(DownSource(), retry_s=(30.0, 30.0), clock=clock)  # one failure, then a long, quiet wait

    async def disconnected(pilot: Pilot) -> None:
        await wait_for(pilot, lambda: app.source.num_connects == 1 and not app.connected, what="the first failure")
        await wait_for(pilot, lambda: "disconnected" in str(app.query_one("ConnectionBanner").render()))

    assert snap_compare(app, terminal_size=(80, 24), run_before=disconnected)


def test_help_80x24(snap_compare) -> None:
    app = busy_app()

    async def help_open(pilot: Pilot) -> None:
        await all_received(pilot)
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="the help")
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 24), run_before=help_open)
