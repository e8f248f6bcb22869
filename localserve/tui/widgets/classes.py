"""The priority story of one model: per class (interactive first), what runs
and waits, and its time to first token, queue wait and inter-token latency."""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text
from textual.widget import Widget

from localserve.tui.fmt import fmt_latency
from localserve.tui.models_view import ModelView
from localserve.tui.snapshot import PRIORITY_CLASSES
from localserve.tui.widgets.tables import Col, make_table

CLASS_STYLES = {"interactive": "cyan", "default": "white", "batch": "magenta"}
RUNNING, WAITING, FREE = "█", "▒", "░"
BAR_WIDTH = 16

COLUMNS = (
    Col("class"),
    Col("run", numeric=True),
    Col("queued", numeric=True),
    Col("slots", shows_from=90),
    Col("TTFT p50", numeric=True),
    Col("p95", numeric=True),
    Col("wait p50", numeric=True),
    Col("p95", numeric=True),
    Col("ITL p50", numeric=True),
    Col("p95", numeric=True),
    Col("n/min", numeric=True, shows_from=100),
)


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


class ClassPanel(Widget):
    """Rows interactive, default, batch of the focused model. TTFT: time to
    first token; wait: time until its first engine step; ITL: between
    tokens; p50/p95 over the last minute, a dash where nothing was measured."""

    DEFAULT_CSS = """
    ClassPanel {
        height: auto;
        border: round $primary;
        border-title-color: $text;
        padding: 0 1;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.model: ModelView | None = None
        self.has_data = False
        self.border_title = "priority classes"

    def show(self, model: ModelView | None, *, extra_title: str = "") -> None:
        self.model, self.has_data = model, True
        title = f"priority classes · {model.model_id}" if model else "priority classes"
        self.border_title = f"{title} · last min{extra_title}"
        # What the scheduler did with batch work (on the bottom edge; gone on a short screen).
        self.border_subtitle = model.batch_policy.describe() if model else ""
        self.refresh(layout=True)

    def render(self) -> RenderableType:
        model = self.model
        if model is None:
            return Text("no generative model" if self.has_data else "waiting for the server …", style="dim")
        slots = max(1, model.num_slots, model.num_running + model.num_waiting)
        rows: list[list[Text | str]] = []
        for name in PRIORITY_CLASSES:
            figures = model.of_class(name)
            running, waiting = model.running.get(name, 0), model.waiting.get(name, 0)
            rows.append(
                [
                    Text(name, style=f"bold {CLASS_STYLES[name]}" if name == "interactive" else CLASS_STYLES[name]),
                    str(running),
                    str(waiting),
                    bar(BAR_WIDTH, [(running / slots, RUNNING, "green"), (waiting / slots, WAITING, "yellow")]),
                    fmt_latency(figures.ttft_p50_s),
                    Text(fmt_latency(figures.ttft_p95_s), style="bold" if name == "interactive" else ""),
                    fmt_latency(figures.queue_wait_p50_s),
                    fmt_latency(figures.queue_wait_p95_s),
                    fmt_latency(figures.itl_p50_s),
                    fmt_latency(figures.itl_p95_s),
                    str(figures.num_requests),
                ]
            )
        return make_table(COLUMNS, rows, self.content_size.width)
