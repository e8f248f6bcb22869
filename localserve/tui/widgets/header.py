"""Top of the screen: the connection banner and the server/models header."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from localserve.tui.snapshot import Snapshot, fmt_bytes, fmt_duration


class ConnectionBanner(Widget):
    """One line, shown only while the dashboard is not connected."""

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

    def connecting(self, label: str) -> None:
        self.message = f"connecting to {label} …"
        self.set_classes("-visible -connecting")

    def disconnected(self, reason: str, retry_in_s: float) -> None:
        self.message = f"disconnected — retrying in {retry_in_s:g} s: {reason}"
        self.set_classes("-visible")

    def connected(self) -> None:
        self.message = ""
        self.set_classes("")

    @property
    def visible_message(self) -> str:
        """What the banner says, or "" when it is hidden (for tests)."""
        return self.message if self.has_class("-visible") else ""

    def render(self) -> Text:
        return Text(self.message, no_wrap=True, overflow="ellipsis")


class ServerHeader(Widget):
    """Server line (URL, uptime, CPU, memory), then one line per model
    (generative ones, then one-shot ones: embeddings, speech)."""

    DEFAULT_CSS = """
    ServerHeader {
        height: auto;
        max-height: 5;
        padding: 0 1;
        background: $panel;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    def __init__(self, label: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.label = label
        self.snapshot: Snapshot | None = None
        self.target_model = ""  # the model `u` would unload, marked with ▶
        self.paused = False

    def show(self, snapshot: Snapshot | None, target_model: str, paused: bool) -> None:
        self.snapshot, self.target_model, self.paused = snapshot, target_model, paused
        self.refresh(layout=True)

    def render(self) -> Text:
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append("localserve top", style="bold")
        text.append(f"  {self.label}", style="cyan")
        snap = self.snapshot
        if snap is not None:
            proc = snap.process
            text.append(f"  v{snap.version}  up {fmt_duration(snap.uptime_s)}", style="dim")
            text.append(f"  CPU {proc.cpu_percent:.0f}%")
            text.append(f"  RSS {fmt_bytes(proc.rss_bytes)}")
            if snap.devices:
                text.append(f"  devices {'  '.join(snap.devices)}", style="dim")
        if self.paused:
            text.append("  ⏸ PAUSED (p resumes)", style="bold reverse yellow")
        for line in self._model_lines():
            text.append("\n")
            text.append_text(line)
        return text

    def _model_lines(self) -> list[Text]:
        snap = self.snapshot
        if snap is None:
            return [Text("no data yet", style="dim")]
        lines = []
        for model in snap.models:
            marked = model.model_id == self.target_model
            line = Text(no_wrap=True, overflow="ellipsis")
            line.append("▶ " if marked else "  ", style="bold yellow")
            line.append(model.model_id, style="bold green")
            line.append(f"  {model.backend}/{model.device}", style="magenta")
            line.append(f"  {model.max_num_seqs} slots  ctx {model.n_ctx}", style="dim")
            line.append(f"  prefix hit {model.prefix_cache_hit_rate:.0%}  batch {model.mean_batch_size:.1f}")
            lines.append(line)
        for one_shot in snap.one_shot:
            line = Text(no_wrap=True, overflow="ellipsis")
            line.append("  " + one_shot.model_id, style="bold blue")
            line.append(f"  {one_shot.kind or 'one-shot'}", style="magenta")
            line.append(f"  queue {one_shot.queue_items}  running {one_shot.in_flight}", style="dim")
            line.append(f"  {one_shot.items_per_s:,.1f} items/s  batch {one_shot.mean_batch_size:.1f}")
            line.append(f"  padding {one_shot.padding_ratio:.0%}  busy {one_shot.busy_fraction:.0%}", style="dim")
            lines.append(line)
        lines += [Text(f"  ◌ {name} loading …", style="yellow") for name in snap.loading]
        lines += [Text(f"  ✖ {name}: {why}", style="red") for name, why in snap.load_errors.items()]
        return lines or [Text("  no model loaded", style="dim")]
