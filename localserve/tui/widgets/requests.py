"""Middle: the sortable table of in-flight requests.

Rows are keyed by request id, so the selection follows its request when rows
come, go or change order. Columns are sized to the table's width: the id and
model columns take what the fixed ones leave.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual import events
from textual.widgets import DataTable

from localserve.tui.snapshot import RequestView, fmt_duration
from localserve.tui.widgets.queues import CLASS_STYLES, truncate

NARROW_WIDTH = 100  # below this many cells, short priority names
MAX_ID_WIDTH, MAX_MODEL_WIDTH = 44, 32


@dataclass(frozen=True, slots=True)
class Column:
    key: str
    label: str
    width: int  # 0: shares the flexible width
    sort_key: Callable[[RequestView], Any]
    numeric: bool = False


COLUMNS: tuple[Column, ...] = (
    Column("id", "ID", 0, lambda r: r.request_id),
    Column("model", "Model", 0, lambda r: r.model),
    Column("priority", "Prio", 11, lambda r: r.priority),
    Column("state", "State", 7, lambda r: r.state),
    Column("prompt", "Prompt", 6, lambda r: r.prompt_tokens, numeric=True),
    Column("gen", "Gen", 5, lambda r: r.generated_tokens, numeric=True),
    Column("age", "Age", 5, lambda r: r.age_s, numeric=True),
    Column("tokens_per_s", "Tok/s", 5, lambda r: r.tokens_per_s, numeric=True),
)
COLUMN_BY_KEY = {c.key: c for c in COLUMNS}


class RequestTable(DataTable[Any]):
    """In-flight requests; `sort_by(key)` orders them (again: reverses)."""

    DEFAULT_CSS = """
    RequestTable {
        height: 1fr;
        border: round $primary;
        border-title-color: $text;
    }
    RequestTable:focus { border: round $accent; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.sort_key, self.sort_reverse = "age", True
        self.requests: dict[str, RequestView] = {}
        self._order: list[str] = []
        self._layout_width = -1
        self._id_width, self._model_width = 16, 12
        self._shown: dict[str, tuple[Text, ...]] = {}  # the cells on screen, by request id

    @property
    def selected(self) -> RequestView | None:
        """The request under the cursor, if any."""
        if not self.row_count:
            return None
        row_key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key
        return self.requests.get(str(row_key.value))

    def sort_by(self, key: str) -> None:
        if key == self.sort_key:
            self.sort_reverse = not self.sort_reverse
        else:
            self.sort_key, self.sort_reverse = key, COLUMN_BY_KEY[key].numeric
        self.show(list(self.requests.values()))

    def cycle_sort(self) -> None:
        keys = [c.key for c in COLUMNS]
        self.sort_by(keys[(keys.index(self.sort_key) + 1) % len(keys)])

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        event.stop()
        self.sort_by(str(event.column_key.value))

    def on_resize(self, event: events.Resize) -> None:
        self.show(list(self.requests.values()))

    def show(self, requests: Sequence[RequestView]) -> None:
        """Show `requests`, in the sort order, keeping the selected one selected."""
        column = COLUMN_BY_KEY[self.sort_key]
        ordered = sorted(requests, key=column.sort_key, reverse=self.sort_reverse)
        selected, selected_row = self.selected, self.cursor_row
        self.requests = {r.request_id: r for r in ordered}
        order = list(self.requests)
        width = self.scrollable_content_region.width
        if order != self._order or width != self._layout_width:
            self._rebuild(ordered, width)
            if selected is not None and selected.request_id in self.requests:
                self.move_cursor(row=order.index(selected.request_id), animate=False)
            elif order:  # the selected request ended: stay on the same line
                self.move_cursor(row=min(selected_row, len(order) - 1), animate=False)
        else:
            for request in ordered:
                old_cells = self._shown[request.request_id]
                cells = self._cells(request)
                for col, old, new in zip(COLUMNS, old_cells, cells, strict=True):
                    if new != old:  # a queue of hundreds: touch only what changed
                        self.update_cell(request.request_id, col.key, new)
                self._shown[request.request_id] = cells
        self._order = order
        arrow = "↓" if self.sort_reverse else "↑"
        self.border_title = f"requests in flight: {len(ordered)} · sorted by {column.label} {arrow}"

    def _rebuild(self, ordered: Sequence[RequestView], width: int) -> None:
        self._layout_width = width
        self.clear(columns=True)
        narrow = self.app.size.width < NARROW_WIDTH
        fixed = {c.key: c.width for c in COLUMNS if c.width}
        if narrow:
            fixed["priority"] = 4
        flexible = max(16, width - sum(fixed.values()) - 2 * self.cell_padding * len(COLUMNS) - 2)
        self._id_width = min(MAX_ID_WIDTH, max(8, flexible * 3 // 5))
        self._model_width = min(MAX_MODEL_WIDTH, max(6, flexible - self._id_width))
        widths = {"id": self._id_width, "model": self._model_width, **fixed}
        for col in COLUMNS:
            label = Text(col.label, justify="right" if col.numeric else "left")
            self.add_column(label, key=col.key, width=widths[col.key])
        self._shown = {r.request_id: self._cells(r) for r in ordered}
        for request_id, cells in self._shown.items():
            self.add_row(*cells, key=request_id)

    def _cells(self, r: RequestView) -> tuple[Text, ...]:
        narrow = self.app.size.width < NARROW_WIDTH
        priority = r.priority_class[:3] if narrow else r.priority_class
        state_style = "green" if r.state == "running" else "yellow"
        return (
            Text(truncate(r.request_id, self._id_width)),
            Text(truncate(r.model, self._model_width), style="green"),
            Text(priority, style=CLASS_STYLES.get(r.priority_class, "")),
            Text(r.state, style=state_style),
            Text(str(r.prompt_tokens), justify="right"),
            Text(str(r.generated_tokens), justify="right"),
            Text(fmt_duration(r.age_s), justify="right"),
            Text(f"{r.tokens_per_s:.1f}", justify="right"),
        )
