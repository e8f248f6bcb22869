"""Decode tokens/s and the interactive class's TTFT p95 over the last
minutes, as sparklines (hidden on a short screen)."""

from __future__ import annotations

from collections import deque

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label, Sparkline

from localserve.tui.fmt import fmt_latency, fmt_rate
from localserve.tui.snapshot import Snapshot

HISTORY_LEN = 240  # samples: 2 minutes at one snapshot per 500 ms


class History:
    """The last `maxlen` values of the two charted series (summed decode rate
    over models, the worst interactive TTFT p95 of any model, 0 when none
    was measured). Starts full of zeros, so the time axis is fixed and the
    charts' scale starts at zero."""

    def __init__(self, maxlen: int = HISTORY_LEN) -> None:
        self.decode_tokens_per_s: deque[float] = deque([0.0] * maxlen, maxlen=maxlen)
        self.ttft_p95_s: deque[float] = deque([0.0] * maxlen, maxlen=maxlen)

    def add(self, snapshot: Snapshot) -> None:
        self.decode_tokens_per_s.append(snapshot.decode_tokens_per_s)
        self.ttft_p95_s.append(snapshot.worst("interactive", "ttft_p95_s") or 0.0)


class ThroughputPanel(Vertical):
    """Two labelled sparklines; the newest sample is at the right edge."""

    DEFAULT_CSS = """
    ThroughputPanel {
        width: 1fr;
        height: 100%;
        border: round $primary;
        border-title-color: $text;
        padding: 0 1;
    }
    ThroughputPanel Label { width: 100%; height: 1; }
    ThroughputPanel Sparkline { height: 1; margin-bottom: 0; }
    ThroughputPanel #decode-chart > .sparkline--max-color { color: $success; }
    ThroughputPanel #decode-chart > .sparkline--min-color { color: $success 40%; }
    ThroughputPanel #ttft-chart > .sparkline--max-color { color: $error; }
    ThroughputPanel #ttft-chart > .sparkline--min-color { color: $warning 50%; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.history = History()
        self.border_title = "throughput · last 2 min"

    def compose(self) -> ComposeResult:
        yield Label("decode -", id="decode-label")
        yield Sparkline([], summary_function=max, id="decode-chart")
        yield Label("interactive TTFT p95 -", id="ttft-label")
        yield Sparkline([], summary_function=max, id="ttft-chart")

    def record(self, snapshot: Snapshot) -> None:
        """Add a sample (also while the view is paused, so charts have no gap)."""
        self.history.add(snapshot)

    def show(self, snapshot: Snapshot) -> None:
        prefill = sum(m.prefill_tokens_per_s for m in snapshot.models)
        ttft_p95 = snapshot.worst("interactive", "ttft_p95_s")
        self.query_one("#decode-label", Label).update(
            f"[b]decode {fmt_rate(snapshot.decode_tokens_per_s)} tok/s[/b]  [dim]prefill {fmt_rate(prefill)}/s[/dim]"
        )
        self.query_one("#ttft-label", Label).update(f"[b]interactive TTFT p95 {fmt_latency(ttft_p95)}[/b]")
        self.query_one("#decode-chart", Sparkline).data = list(self.history.decode_tokens_per_s)
        self.query_one("#ttft-chart", Sparkline).data = list(self.history.ttft_p95_s)
