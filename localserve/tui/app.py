"""`localserve top`: a live dashboard of a server's queues and throughput.

The app only talks to a `SnapshotSource` (HTTP in real use): an async
worker follows its snapshots and posts them as messages, reconnecting with
a back-off whenever the connection fails, so the app never crashes on a
server that is down, restarting or not started yet.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.message import Message
from textual.widgets import DataTable, Footer

from localserve.tui.snapshot import Snapshot
from localserve.tui.source import HttpSource, SnapshotSource, SourceError
from localserve.tui.widgets.batches import BatchPanel
from localserve.tui.widgets.header import ConnectionBanner, ServerHeader
from localserve.tui.widgets.queues import QueuePanel
from localserve.tui.widgets.requests import RequestTable
from localserve.tui.widgets.throughput import ThroughputPanel

log = logging.getLogger(__name__)

UNLOAD_CONFIRM_S = 3.0  # a second `u` within this long unloads


@dataclass
class SnapshotReceived(Message):
    snapshot: Snapshot


@dataclass
class ConnectionLost(Message):
    reason: str
    retry_in_s: float


class DashboardApp(App[None]):
    """The dashboard for the server behind `source`."""

    TITLE = "localserve top"
    CSS = """
    #panels { height: 7; }
    Screen.-stale #panels, Screen.-stale RequestTable, Screen.-stale BatchPanel { opacity: 60%; }
    """
    BINDINGS = [
        Binding("c", "cancel_request", "Cancel request"),
        Binding("u", "unload_model", "Unload model"),
        Binding("p", "toggle_pause", "Pause/resume"),
        Binding("s", "cycle_sort", "Sort"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, source: SnapshotSource, *, retry_s: tuple[float, float] = (0.5, 3.0)) -> None:
        super().__init__()
        self.source = source
        self.retry_s = retry_s  # first and longest wait between reconnection attempts
        self.snapshot: Snapshot | None = None
        self.connected = False
        self.paused = False
        self.num_snapshots = 0
        self._unload_armed: tuple[str, float] | None = None

    def compose(self) -> ComposeResult:
        yield ConnectionBanner()
        yield ServerHeader(self.source.label)
        with Horizontal(id="panels"):
            yield QueuePanel()
            yield ThroughputPanel()
        yield RequestTable()
        yield BatchPanel()
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(ConnectionBanner).connecting(self.source.label)
        self.query_one(RequestTable).focus()
        self.follow()

    async def on_unmount(self) -> None:
        await self.source.aclose()

    # ---- the stats stream ----------------------------------------------------------

    @work(exclusive=True, group="stats")
    async def follow(self) -> None:
        """Follow the source for the app's life; reconnect after any failure."""
        first_wait, longest_wait = self.retry_s
        wait = first_wait
        while True:
            reason = "the stats stream ended"
            try:
                async for snapshot in self.source.snapshots():
                    wait = first_wait
                    self.post_message(SnapshotReceived(snapshot))
            except SourceError as exc:
                reason = str(exc)
            except Exception as exc:  # a bug or a bad answer must not end the dashboard
                log.exception("stats stream failed")
                reason = f"{type(exc).__name__}: {exc}"
            self.post_message(ConnectionLost(reason, wait))
            await asyncio.sleep(wait)
            wait = min(longest_wait, wait * 2)

    def on_snapshot_received(self, message: SnapshotReceived) -> None:
        self.num_snapshots += 1
        self.snapshot = message.snapshot
        if not self.connected:
            self.connected = True
            self.query_one(ConnectionBanner).connected()
            self.screen.remove_class("-stale")
        self.query_one(ThroughputPanel).record(message.snapshot)
        if not self.paused:
            self.refresh_view()

    def on_connection_lost(self, message: ConnectionLost) -> None:
        self.connected = False
        self.query_one(ConnectionBanner).disconnected(message.reason, message.retry_in_s)
        if self.snapshot is not None:
            self.screen.add_class("-stale")

    def refresh_view(self) -> None:
        snap = self.snapshot
        if snap is None:
            return
        self.query_one(RequestTable).show(snap.requests)
        self.query_one(QueuePanel).show(snap)
        self.query_one(ThroughputPanel).show(snap)
        self.query_one(BatchPanel).show(snap.batches)
        self._show_header()

    def _show_header(self) -> None:
        self.query_one(ServerHeader).show(self.snapshot, self.target_model(), self.paused)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_header()  # the ▶ follows the selected request's model

    def target_model(self) -> str:
        """The model `u` unloads: the selected request's, else the first one."""
        selected = self.query_one(RequestTable).selected
        if selected is not None and selected.model:
            return selected.model
        models = self.snapshot.models if self.snapshot else ()
        return models[0].model_id if models else ""

    # ---- actions -------------------------------------------------------------------

    def action_cancel_request(self) -> None:
        request = self.query_one(RequestTable).selected
        if request is None:
            self.notify("no request selected", severity="warning")
            return
        self.cancel(request.request_id)

    def action_unload_model(self) -> None:
        model_id = self.target_model()
        if not model_id:
            self.notify("no model loaded", severity="warning")
            return
        now = time.monotonic()
        armed = self._unload_armed
        if armed is None or armed[0] != model_id or now - armed[1] > UNLOAD_CONFIRM_S:
            self._unload_armed = (model_id, now)
            self.notify(f"press u again to unload {model_id}", severity="warning", timeout=UNLOAD_CONFIRM_S)
            return
        self._unload_armed = None
        self.unload(model_id)

    def action_toggle_pause(self) -> None:
        self.paused = not self.paused
        if self.paused:
            self._show_header()
        else:
            self.refresh_view()

    def action_cycle_sort(self) -> None:
        self.query_one(RequestTable).cycle_sort()

    @work(group="actions")
    async def cancel(self, request_id: str) -> None:
        try:
            self.notify(await self.source.cancel(request_id))
        except SourceError as exc:
            self.notify(f"could not cancel {request_id}: {exc}", severity="error")

    @work(group="actions")
    async def unload(self, model_id: str) -> None:
        try:
            self.notify(await self.source.unload(model_id))
        except SourceError as exc:
            self.notify(f"could not unload {model_id}: {exc}", severity="error")


def run(url: str, api_key: str | None = None) -> None:
    """Run the dashboard against the server at `url` until the user quits."""
    DashboardApp(HttpSource(url, api_key)).run()
