"""Middle: the sortable, filterable table of in-flight requests.

Rows are keyed by request id, so the selection follows its request when rows
come, go or change order. Columns come with the width (the model column
also when requests run on several models); the id and model columns take
what the fixed ones leave.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.widgets import DataTable, Input

from localserve.tui.fmt import fmt_duration, fmt_latency, fmt_rate
from localserve.tui.snapshot import RequestView
from localserve.tui.widgets.classes import CLASS_STYLES, RUNNING, bar

MAX_ID_WIDTH, MAX_MODEL_WIDTH = 44, 32
TIMES_WIDTH = 96  # from this table width: queue wait and TTFT per request
PROGRESS_WIDTH = 150  # and a bar of tokens generated out of max_tokens


@dataclass(frozen=True, slots=True)
class Column:
    key: str
    label: str
    width: int  # 0: shares the flexible width
    sort_key: Callable[[RequestView], Any]
    numeric: bool = False
    shows_from: int = 0  # table width from which it shows


def truncate(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def _none_last(value: float | None) -> float:
    return -1.0 if value is None else value


COLUMNS: tuple[Column, ...] = (
    Column("id", "ID", 0, lambda r: r.request_id),
    Column("model", "Model", 0, lambda r: r.model),
    Column("priority", "Class", 11, lambda r: r.priority),
    Column("state", "State", 7, lambda r: r.state),
    Column("prompt", "Prompt", 6, lambda r: r.prompt_tokens, numeric=True),
    Column("gen", "Gen", 5, lambda r: r.generated_tokens, numeric=True),
    Column("progress", "of max_tokens", 16, lambda r: r.generated_tokens / max(1, r.max_tokens), True, PROGRESS_WIDTH),
    Column("age", "Age", 6, lambda r: r.age_s, numeric=True),
    Column("wait", "Wait", 6, lambda r: _none_last(r.queue_wait_s), numeric=True, shows_from=TIMES_WIDTH),
    Column("ttft", "TTFT", 6, lambda r: _none_last(r.ttft_s), numeric=True, shows_from=TIMES_WIDTH),
    Column("tokens_per_s", "Tok/s", 6, lambda r: _none_last(r.tokens_per_s), numeric=True),
)
COLUMN_BY_KEY = {c.key: c for c in COLUMNS}
SORT_KEYS = [c.key for c in COLUMNS if c.key != "progress"]


class RequestTable(DataTable[Any]):
    """In-flight requests; `sort_by(key)` orders them (again: reverses),
    `filter_by(text)` keeps those whose id, model, class or state hold it."""

    DEFAULT_CSS = """
    RequestTable {
        height: 1fr;
        min-height: 5;
        overflow-x: hidden;
        border: round $primary;
        border-title-color: $text;
    }
    RequestTable:focus { border: round $accent; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.sort_key, self.sort_reverse = "age", True
        self.filter_text = ""
        self.all_requests: list[RequestView] = []
        self.requests: dict[str, RequestView] = {}  # shown, in order
        self._columns: tuple[Column, ...] = ()
        self._layout: tuple[int, tuple[str, ...]] = (-1, ())
        self._id_width, self._model_width, self._progress_width = 16, 12, COLUMN_BY_KEY["progress"].width
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
        self.show(self.all_requests)

    def cycle_sort(self, step: int = 1) -> None:
        """Sort by the next (`step=1`) or the previous (`-1`) column."""
        self.sort_by(SORT_KEYS[(SORT_KEYS.index(self.sort_key) + step) % len(SORT_KEYS)])

    def reverse_sort(self) -> None:
        self.sort_by(self.sort_key)

    def filter_by(self, text: str) -> None:
        self.filter_text = text.strip()
        self.show(self.all_requests)

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        event.stop()
        key = str(event.column_key.value)
        if key in SORT_KEYS:
            self.sort_by(key)

    def on_resize(self, event: events.Resize) -> None:
        self.show(self.all_requests)

    def show(self, requests: Sequence[RequestView]) -> None:
        """Show `requests` that pass the filter, in the sort order, keeping the selected one selected."""
        self.all_requests = list(requests)
        column = COLUMN_BY_KEY[self.sort_key]
        kept = [r for r in requests if r.matches(self.filter_text)] if self.filter_text else list(requests)
        ordered = sorted(kept, key=column.sort_key, reverse=self.sort_reverse)
        selected, selected_row = self.selected, self.cursor_row
        self.requests = {r.request_id: r for r in ordered}
        order = list(self.requests)
        layout = (self.scrollable_content_region.width, self._column_keys(requests))
        if tuple(order) != tuple(self._shown) or layout != self._layout:
            self._rebuild(ordered, layout)
            if selected is not None and selected.request_id in self.requests:
                self.move_cursor(row=order.index(selected.request_id), animate=False)
            elif order:  # the selected request ended: stay on the same line
                self.move_cursor(row=min(selected_row, len(order) - 1), animate=False)
        else:
            self._update_cells(ordered)
        self.border_title = self._title(len(ordered), len(requests))

    def _title(self, num_shown: int, num_all: int) -> str:
        column = COLUMN_BY_KEY[self.sort_key]
        arrow = "↓" if self.sort_reverse else "↑"
        count = f"{num_shown} of {num_all} (filter “{self.filter_text}”)" if self.filter_text else str(num_all)
        return f"requests in flight: {count} · sorted by {column.label} {arrow}"

    def _column_keys(self, requests: Sequence[RequestView]) -> tuple[str, ...]:
        width = self.scrollable_content_region.width
        several_models = len({r.model for r in requests}) > 1
        keys = []
        for col in COLUMNS:
            if col.key == "model" and not (several_models or width >= TIMES_WIDTH):
                continue
            if width >= col.shows_from:
                keys.append(col.key)
        return tuple(keys)

    def _update_cells(self, ordered: Sequence[RequestView]) -> None:
        for request in ordered:
            old_cells = self._shown[request.request_id]
            cells = self._cells(request)
            for col, old, new in zip(self._columns, old_cells, cells, strict=True):
                if new != old:  # a queue of hundreds: touch only what changed
                    self.update_cell(request.request_id, col.key, new)
            self._shown[request.request_id] = cells

    def _rebuild(self, ordered: Sequence[RequestView], layout: tuple[int, tuple[str, ...]]) -> None:
        self._layout = layout
        width, keys = layout
        self._columns = tuple(COLUMN_BY_KEY[k] for k in keys)
        self.clear(columns=True)
        fixed = sum(c.width for c in self._columns)
        flexible = max(12, width - fixed - 2 * self.cell_padding * len(self._columns) - 1)
        has_model = "model" in keys
        self._id_width = min(MAX_ID_WIDTH, max(8, flexible * 3 // 5 if has_model else flexible))
        self._model_width = min(MAX_MODEL_WIDTH, max(6, flexible - self._id_width))
        widths = {"id": self._id_width, "model": self._model_width}
        if "progress" in keys:  # a wide screen: the bar takes what the id and model leave
            leftover = flexible - self._id_width - (self._model_width if has_model else 0)
            widths["progress"] = self._progress_width = COLUMN_BY_KEY["progress"].width + max(0, leftover)
        for col in self._columns:
            label = Text(col.label, justify="right" if col.numeric and col.key != "progress" else "left")
            self.add_column(label, key=col.key, width=widths.get(col.key, col.width))
        self._shown = {r.request_id: self._cells(r) for r in ordered}
        for request_id, cells in self._shown.items():
            self.add_row(*cells, key=request_id)

    def _cells(self, r: RequestView) -> tuple[Text, ...]:
        return tuple(self._cell(col.key, r) for col in self._columns)

    def _cell(self, key: str, r: RequestView) -> Text:
        if key == "id":
            return Text(truncate(r.request_id, self._id_width))
        if key == "model":
            return Text(truncate(r.model, self._model_width), style="green")
        if key == "priority":
            return Text(r.priority_class, style=CLASS_STYLES.get(r.priority_class, ""))
        if key == "state":
            return Text(r.state, style="green" if r.state == "running" else "yellow")
        if key == "progress":
            done = r.generated_tokens / r.max_tokens if r.max_tokens else 0.0
            return bar(self._progress_width, [(done, RUNNING, "green")])
        text = {
            "prompt": str(r.prompt_tokens),
            "gen": str(r.generated_tokens),
            "age": fmt_duration(r.age_s),
            "wait": fmt_latency(r.queue_wait_s),
            "ttft": fmt_latency(r.ttft_s),
            "tokens_per_s": fmt_rate(r.tokens_per_s),
        }[key]
        return Text(text, justify="right")


class FilterInput(Input):
    """The `/` filter above the table: enter keeps it and goes back to the table, esc clears it."""

    BINDINGS = [Binding("escape", "clear_filter", "Clear filter", show=False)]

    def action_clear_filter(self) -> None:
        self.value = ""
        self.app.action_close_filter()  # type: ignore[attr-defined]
