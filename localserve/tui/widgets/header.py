"""Top of the screen: the connection banner and the server line."""

from __future__ import annotations

from datetime import datetime, timedelta

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from localserve.tui.fmt import fmt_bytes, fmt_duration
from localserve.tui.snapshot import Snapshot


class ConnectionBanner(Widget):
    """One line, shown only while the dashboard is not connected: since when,
    when it tries again, and why (the header marks the data left on screen stale)."""

    DEFAULT_CSS = """
    ConnectionBanner {
        dock: top;
        height: 1;
        padding: 0 1;
        background: $error;
        color: $text;
        text-style: bold;
        display: none;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    ConnectionBanner.-connecting { background: $warning; color: $background; }
    ConnectionBanner.-visible { display: block; }
    """

    message: reactive[str] = reactive("", layout=False)

    def __init__(self) -> None:
        super().__init__()
        self._lost: tuple[datetime, str, datetime] | None = None  # since, reason, next try

    def connecting(self, label: str) -> None:
        self._lost = None
        self.message = f"connecting to {label} …"
        self.set_classes("-visible -connecting")

    def disconnected(self, reason: str, *, since: datetime, now: datetime, retry_in_s: float) -> None:
        """The connection failed (again); `since`: when it was first lost."""
        self._lost = (since, reason, now + timedelta(seconds=retry_in_s))
        self.set_classes("-visible")
        self.tick(now)

    def connected(self) -> None:
        self._lost = None
        self.message = ""
        self.set_classes("")

    def tick(self, now: datetime) -> None:
        """Say again how long ago the connection was lost (called every second)."""
        if self._lost is None:
            return
        since, reason, next_try = self._lost
        ago = fmt_duration((now - since).total_seconds())
        retry = fmt_duration(max(0.0, (next_try - now).total_seconds()))
        self.message = f"disconnected since {since:%H:%M:%S} ({ago} ago) · retry in {retry} · {reason}"

    @property
    def visible_message(self) -> str:
        """What the banner says, or "" when it is hidden (for tests)."""
        return self.message if self.has_class("-visible") else ""

    def render(self) -> Text:
        return Text(self.message, no_wrap=True, overflow="ellipsis")


class ServerHeader(Widget):
    """The server line: URL, version, uptime, CPU, memory, devices, and the
    PAUSED / STALE marks first. Its parts wrap whole onto a second line
    rather than being cut."""

    DEFAULT_CSS = """
    ServerHeader {
        height: auto;
        max-height: 3;
        padding: 0 1;
        background: $panel;
    }
    """

    def __init__(self, label: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.label = label
        self.snapshot: Snapshot | None = None
        self.paused = False
        self.stale_since: datetime | None = None

    def show(self, snapshot: Snapshot | None, *, paused: bool, stale_since: datetime | None) -> None:
        self.snapshot, self.paused, self.stale_since = snapshot, paused, stale_since
        self.refresh(layout=True)

    def parts(self) -> list[Text]:
        parts = [Text("localserve top", style="bold"), Text(self.label, style="cyan")]
        if self.paused:
            parts.append(Text("⏸ PAUSED (p resumes)", style="bold reverse yellow"))
        if self.stale_since is not None and self.snapshot is not None:
            parts.append(Text(f"STALE {self.stale_since:%H:%M:%S}", style="bold reverse red"))
        snap = self.snapshot
        if snap is not None:
            parts.append(Text(f"v{snap.version}  up {fmt_duration(snap.uptime_s)}", style="dim"))
            parts.append(Text(f"CPU {snap.process.cpu_percent:.0f}%  RSS {fmt_bytes(snap.process.rss_bytes)}"))
            if snap.devices:
                parts.append(Text(f"devices {'  '.join(snap.devices)}", style="dim"))
            if not snap.disk_writable:
                parts.append(Text("disk READ-ONLY", style="bold reverse red"))
            elif snap.disk_free_bytes >= 0:
                style = "bold reverse yellow" if snap.disk_low else ""
                parts.append(Text(f"disk {fmt_bytes(snap.disk_free_bytes)} free", style=style))
        return parts

    def render(self) -> Text:
        return wrap_parts(self.parts(), max(20, self.content_size.width))

    def get_content_height(self, container, viewport, width: int) -> int:  # type: ignore[no-untyped-def]
        return len(wrap_parts(self.parts(), max(20, width)).split())


def wrap_parts(parts: list[Text], width: int, gap: int = 2) -> Text:
    """Parts on lines of `width` cells, two spaces apart; a part that does
    not fit on the current line starts the next one (cut only if it is
    longer than a whole line)."""
    lines: list[Text] = []
    line = Text(no_wrap=True, overflow="ellipsis")
    for part in parts:
        if line.cell_len and line.cell_len + gap + part.cell_len > width:
            lines.append(line)
            line = Text(no_wrap=True, overflow="ellipsis")
        if line.cell_len:
            line.append(" " * gap)
        line.append_text(part)
    lines.append(line)
    return Text("\n", no_wrap=True, overflow="ellipsis").join(lines)
