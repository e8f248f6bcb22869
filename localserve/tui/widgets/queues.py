"""Left panel: running vs waiting per priority class, and KV cache gauges."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from localserve.tui.snapshot import PRIORITY_CLASSES, Snapshot

CLASS_STYLES = {"interactive": "cyan", "default": "white", "batch": "magenta"}
RUNNING, WAITING, FREE = "█", "▒", "░"


def bar(width: int, parts: list[tuple[float, str, str]]) -> Text:
    """A bar `width` cells wide: each part is (fraction, glyph, style), the rest is free."""
    text = Text()
    used = 0
    for fraction, glyph, style in parts:
        cells = min(width - used, round(max(0.0, fraction) * width))
        text.append(glyph * cells, style=style)
        used += cells
    text.append(FREE * (width - used), style="bright_black")
    return text


def truncate(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def kv_style(fraction: float) -> str:
    return "red" if fraction >= 0.9 else "yellow" if fraction >= 0.7 else "green"


class QueuePanel(Widget):
    """Queue bars (█ running, ▒ waiting) per priority class, summed over
    models and scaled to the slots of all models; one KV gauge per model."""

    DEFAULT_CSS = """
    QueuePanel {
        width: 1fr;
        height: 100%;
        border: round $primary;
        border-title-color: $text;
        padding: 0 1;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.snapshot: Snapshot | None = None
        self.border_title = "queues"

    def show(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.refresh()

    def render(self) -> Text:
        snap = self.snapshot
        if snap is None:
            return Text("waiting for the server …", style="dim")
        running, waiting = snap.by_class("running"), snap.by_class("waiting")
        capacity = max(1, sum(m.max_num_seqs for m in snap.models), sum(running.values()) + sum(waiting.values()))
        counts_width = 16
        label_width = 11
        width = max(4, self.content_size.width - label_width - counts_width - 1)
        lines = []
        for name in PRIORITY_CLASSES:
            line = Text(no_wrap=True, overflow="ellipsis")
            line.append(f"{name:<{label_width}} ", style=CLASS_STYLES[name])
            line.append_text(
                bar(
                    width, [(running[name] / capacity, RUNNING, "green"), (waiting[name] / capacity, WAITING, "yellow")]
                )
            )
            line.append(f" {running[name]:>2} run {waiting[name]:>3} wait")
            lines.append(line)
        for model in snap.models:
            fraction = model.kv_used / model.kv_total if model.kv_total else 0.0
            line = Text(no_wrap=True, overflow="ellipsis")
            name = "KV cache" if len(snap.models) == 1 else truncate(f"KV {model.model_id}", label_width)
            line.append(f"{name:<{label_width}} ", style="bold")
            line.append_text(bar(width, [(fraction, RUNNING, kv_style(fraction))]))
            line.append(f" {fraction:>4.0%} {_tokens(model.kv_used)}/{_tokens(model.kv_total)}")
            lines.append(line)
        return Text("\n").join(lines)


def _tokens(count: int) -> str:
    return f"{count / 1000:.1f}k" if count >= 1000 else str(count)
