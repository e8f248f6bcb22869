"""Snapshot tests of the main screen (pytest-textual-snapshot): a fixed,
deterministic server history, rendered at 80x24 and 160x48.

After an intended change of the layout, review and accept the new images with
`pytest tests/tui/test_snapshots.py --snapshot-update`.
"""

from __future__ import annotations

from textual.pilot import Pilot

from localserve.tui.app import DashboardApp
from tests.tui.fakes import DownSource, ScriptedSource, history
from tests.tui.helpers import wait_for

NUM_SNAPSHOTS = 120


def busy_app() -> DashboardApp:
    return DashboardApp(ScriptedSource(history(NUM_SNAPSHOTS)))


async def all_received(pilot: Pilot) -> None:
    await wait_for(pilot, lambda: pilot.app.num_snapshots == NUM_SNAPSHOTS, timeout=30, what="the history")  # type: ignore[attr-defined]
    await pilot.pause()


def test_dashboard_80x24(snap_compare) -> None:
    assert snap_compare(busy_app(), terminal_size=(80, 24), run_before=all_received)


def test_dashboard_160x48(snap_compare) -> None:
    assert snap_compare(busy_app(), terminal_size=(160, 48), run_before=all_received)


def test_disconnected_80x24(snap_compare) -> None:
    app = DashboardApp(DownSource(), retry_s=(30.0, 30.0))  # one failure, then a long, quiet wait

    async def disconnected(pilot: Pilot) -> None:
        await wait_for(pilot, lambda: app.source.num_connects == 1 and not app.connected, what="the first failure")
        await wait_for(pilot, lambda: "disconnected" in str(app.query_one("ConnectionBanner").render()))

    assert snap_compare(app, terminal_size=(80, 24), run_before=disconnected)
