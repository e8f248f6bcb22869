"""`localserve top`: a live dashboard of a server's models, priority classes
and requests.

The app only talks to a `SnapshotSource` (HTTP in real use): an async
worker follows its snapshots and posts them as messages, reconnecting with
a back-off whenever the connection fails, so the app never crashes on a
server that is down, restarting or not started yet. While disconnected it
keeps the last data on screen, dimmed and marked stale, and says since when.

The layout follows the terminal: below `NARROW_WIDTH` columns or
`SHORT_HEIGHT` rows the charts give their room to the request table (the
decode rate moves into the priority panel's title); from `WIDE_WIDTH`
columns the panels and the table show more columns.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from rich.text import Text
from textual import events, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.message import Message
from textual.widgets import DataTable, Footer, Input

from localserve.tui.fmt import fmt_rate
from localserve.tui.snapshot import Snapshot
from localserve.tui.source import HttpSource, SnapshotSource, SourceError
from localserve.tui.widgets.batches import BatchPanel
from localserve.tui.widgets.classes import ClassPanel
from localserve.tui.widgets.dialogs import ConfirmScreen, HelpScreen
from localserve.tui.widgets.header import ConnectionBanner, ServerHeader
from localserve.tui.widgets.models import ModelsPanel
from localserve.tui.widgets.requests import FilterInput, RequestTable
from localserve.tui.widgets.throughput import ThroughputPanel

log = logging.getLogger(__name__)

NARROW_WIDTH, WIDE_WIDTH = 110, 160
SHORT_HEIGHT = 32


@dataclass
class SnapshotReceived(Message):
    snapshot: Snapshot


@dataclass
class ConnectionLost(Message):
    reason: str
    retry_in_s: float


class DashboardApp(App[None]):
    """The dashboard for the server behind `source`; `clock` gives the wall
    time shown for a lost connection (tests fix it)."""

    TITLE = "localserve top"
    CSS = """
    #panels { height: auto; }
    ClassPanel { width: 2fr; }
    Screen.-wide ClassPanel { width: 1fr; }
    ThroughputPanel { height: 100%; }
    Screen.-narrow ThroughputPanel, Screen.-short ThroughputPanel { display: none; }
    Screen.-short BatchPanel { max-height: 3; }
    /* On a short screen a panel's bottom edge is the next panel's top. */
    Screen.-short ModelsPanel, Screen.-short ClassPanel, Screen.-short BatchPanel { border-bottom: none; }
    #filter { display: none; height: 1; border: none; padding: 0 1; }
    #filter.-open { display: block; }
    Screen.-stale ModelsPanel, Screen.-stale #panels, Screen.-stale RequestTable, Screen.-stale BatchPanel {
        opacity: 55%;
    }
    """
    BINDINGS = [
        Binding("question_mark", "help", "Help"),
        Binding("slash", "open_filter", "Filter"),
        Binding("c", "cancel_request", "Cancel"),
        Binding("u", "unload_model", "Unload"),
        Binding("m", "next_model", "Next model", show=False),
        Binding("s", "cycle_sort(1)", "Sort"),
        Binding("S", "cycle_sort(-1)", "Sort back", show=False),
        Binding("r", "reverse_sort", "Reverse sort", show=False),
        Binding("p", "toggle_pause", "Pause"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(
        self,
        source: SnapshotSource,
        *,
        retry_s: tuple[float, float] = (0.5, 3.0),
        clock: Callable[[], datetime] = datetime.now,
    ) -> None:
        super().__init__()
        self.source = source
        self.retry_s = retry_s  # first and longest wait between reconnection attempts
        self.clock = clock
        self.snapshot: Snapshot | None = None
        self.snapshot_at: datetime | None = None  # when the shown data came
        self.connected = False
        self.lost_since: datetime | None = None
        self.paused = False
        self.num_snapshots = 0
        self.focused_model = ""  # the ▶ model: the priority panel shows it, `u` unloads it

    def compose(self) -> ComposeResult:
        yield ConnectionBanner()
        yield ServerHeader(self.source.label)
        yield ModelsPanel()
        with Horizontal(id="panels"):
            yield ClassPanel()
            yield ThroughputPanel()
        yield FilterInput(placeholder="filter requests: id, model, class or state", id="filter")
        yield RequestTable()
        yield BatchPanel()
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(ConnectionBanner).connecting(self.source.label)
        self.query_one(RequestTable).focus()
        self.set_interval(1.0, self._tick)
        self.follow()

    async def on_unmount(self) -> None:
        await self.source.aclose()

    def on_resize(self, event: events.Resize) -> None:
        width, height = event.size
        self.screen.set_class(width < NARROW_WIDTH, "-narrow")
        self.screen.set_class(width >= WIDE_WIDTH, "-wide")
        self.screen.set_class(height < SHORT_HEIGHT, "-short")
        self.refresh_view()

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
        self.snapshot, self.snapshot_at = message.snapshot, self.clock()
        if not self.connected:
            self.connected, self.lost_since = True, None
            self.query_one(ConnectionBanner).connected()
            self.screen.remove_class("-stale")
        self.query_one(ThroughputPanel).record(message.snapshot)
        if not self.paused:
            self.refresh_view()

    def on_connection_lost(self, message: ConnectionLost) -> None:
        now = self.clock()
        if self.connected or self.lost_since is None:
            self.lost_since = now
        self.connected = False
        banner = self.query_one(ConnectionBanner)
        banner.disconnected(message.reason, since=self.lost_since, now=now, retry_in_s=message.retry_in_s)
        if self.snapshot is not None:
            self.screen.add_class("-stale")
        self._show_header()

    def _tick(self) -> None:
        self.query_one(ConnectionBanner).tick(self.clock())

    def refresh_view(self) -> None:
        snap = self.snapshot
        if snap is None:
            return
        if snap.model(self.focused_model) is None:
            self.focused_model = snap.models[0].model_id if snap.models else ""
        self.query_one(RequestTable).show(snap.requests)
        self.query_one(ThroughputPanel).show(snap)
        self.query_one(BatchPanel).show(snap.batches)
        self._show_models()
        self._show_header()

    def _show_models(self) -> None:
        snap = self.snapshot
        if snap is None:
            return
        self.query_one(ModelsPanel).show(snap, self.focused_model)
        charts_hidden = self.screen.has_class("-narrow") or self.screen.has_class("-short")
        extra = f" · decode {fmt_rate(snap.decode_tokens_per_s)} tok/s" if charts_hidden else ""
        self.query_one(ClassPanel).show(snap.model(self.focused_model), extra_title=extra)

    def _show_header(self) -> None:
        stale_since = self.snapshot_at if not self.connected else None
        self.query_one(ServerHeader).show(self.snapshot, paused=self.paused, stale_since=stale_since)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        selected = self.query_one(RequestTable).selected
        if selected is not None and selected.model and selected.model != self.focused_model:
            self.focused_model = selected.model  # the ▶ follows the selected request's model
            self._show_models()

    def target_model(self) -> str:
        """The model `u` unloads and the priority panel shows."""
        return self.focused_model

    # ---- actions -------------------------------------------------------------------

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_open_filter(self) -> None:
        box = self.query_one("#filter", FilterInput)
        box.add_class("-open")
        box.focus()

    def action_close_filter(self) -> None:
        box = self.query_one("#filter", FilterInput)
        box.set_class(bool(box.value), "-open")  # a filter in force stays in sight
        self.query_one(RequestTable).focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.query_one(RequestTable).filter_by(event.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.action_close_filter()

    def action_cancel_request(self) -> None:
        request = self.query_one(RequestTable).selected
        if request is None:
            self.notify("no request selected", severity="warning")
            return
        request_id = request.request_id  # bound now: rows may move before the answer
        question = Text.assemble(
            "Cancel request ",
            (request_id, "bold"),
            f"?\n{request.priority_class} on {request.model}, {request.generated_tokens} tokens generated",
        )

        def answered(yes: bool | None) -> None:
            if yes:
                self.cancel(request_id)

        self.push_screen(ConfirmScreen(question), answered)

    def action_unload_model(self) -> None:
        model_id = self.focused_model
        if not model_id:
            self.notify("no model loaded", severity="warning")
            return
        question = Text.assemble("Unload model ", (model_id, "bold"), "?\nIts requests in flight end with an error.")

        def answered(yes: bool | None) -> None:
            if yes:
                self.unload(model_id)

        self.push_screen(ConfirmScreen(question), answered)

    def action_next_model(self) -> None:
        snap = self.snapshot
        ids = [m.model_id for m in snap.models] if snap else []
        if ids:
            index = ids.index(self.focused_model) + 1 if self.focused_model in ids else 0
            self.focused_model = ids[index % len(ids)]
            self._show_models()

    def action_toggle_pause(self) -> None:
        self.paused = not self.paused
        if self.paused:
            self._show_header()
        else:
            self.refresh_view()

    def action_cycle_sort(self, step: int) -> None:
        self.query_one(RequestTable).cycle_sort(step)

    def action_reverse_sort(self) -> None:
        self.query_one(RequestTable).reverse_sort()

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
