"""Bottom: Batch API jobs, one progress bar each."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Label, ProgressBar

from localserve.tui.snapshot import BatchView

STATUS_STYLES = {"in_progress": "green", "validating": "yellow", "finalizing": "cyan", "failed": "red"}


class BatchRow(Horizontal):
    """`id  status  [━━━━━━      ] 42%  21/50 (1 failed)`."""

    DEFAULT_CSS = """
    BatchRow { height: 1; }
    BatchRow .batch-name { width: 2fr; min-width: 12; margin-right: 1; text-wrap: nowrap; text-overflow: ellipsis; }
    BatchRow ProgressBar { width: 3fr; }
    BatchRow ProgressBar Bar { width: 1fr; }
    BatchRow .batch-counts { width: 18; text-align: right; }
    """

    def __init__(self, batch: BatchView) -> None:
        super().__init__()
        self.job = batch

    def compose(self) -> ComposeResult:
        yield Label(classes="batch-name")
        yield ProgressBar(show_eta=False)
        yield Label(classes="batch-counts")

    def on_mount(self) -> None:
        self.show(self.job)

    def show(self, batch: BatchView) -> None:
        self.job = batch
        style = STATUS_STYLES.get(batch.status, "dim")
        name = Text.assemble(batch.batch_id, " ", (batch.status, style), no_wrap=True, overflow="ellipsis")
        self.query_one(".batch-name", Label).update(name)
        self.query_one(ProgressBar).update(total=max(1, batch.total), progress=batch.num_done)
        counts = Text(f"{batch.num_done}/{batch.total}")
        if batch.failed:
            counts.append(f" {batch.failed} failed", style="red")
        self.query_one(".batch-counts", Label).update(counts)


class BatchPanel(VerticalScroll):
    """The server's batch jobs (empty until the Batch API is there)."""

    DEFAULT_CSS = """
    BatchPanel {
        height: auto;
        max-height: 7;
        border: round $primary;
        border-title-color: $text;
        padding: 0 1;
    }
    BatchPanel .empty { color: $text-muted; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.rows: dict[str, BatchRow] = {}
        self.border_title = "batch jobs"

    def compose(self) -> ComposeResult:
        yield Label("no batch jobs", classes="empty")

    def show(self, batches: Sequence[BatchView]) -> None:
        self.border_title = f"batch jobs: {len(batches)}"
        self.query_one(".empty", Label).display = not batches
        current = {b.batch_id: b for b in batches}
        for batch_id in list(self.rows):
            if batch_id not in current:
                self.rows.pop(batch_id).remove()
        for batch in batches:
            row = self.rows.get(batch.batch_id)
            if row is None:
                self.rows[batch.batch_id] = row = BatchRow(batch)
                self.mount(row)
            elif row.is_mounted:
                row.show(batch)
            else:
                row.job = batch  # shown once mounted
