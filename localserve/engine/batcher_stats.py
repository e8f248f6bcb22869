"""Counters and sliding-window figures of one batcher: batch sizes, padding,
throughput. Written by the batcher's thread, read by the stats endpoints."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

WINDOW_S = 60.0  # how far back the recent-batch figures look


class BatcherStats:
    """Thread-safe totals plus the runs of the last `WINDOW_S` seconds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.num_requests = 0
        self.num_dispatches = 0
        self.num_rejected = 0  # QueueFullError
        self._num_items = 0
        self._num_runs = 0
        self._num_errors = 0  # requests failed by a backend error
        self._num_real = 0  # summed item sizes that went through run()
        self._num_padded = 0  # padding slots a padded backend computed on top
        self._busy_s = 0.0
        self._recent: deque[tuple[float, int, int, int, float]] = deque()  # t, items, real, padded, seconds

    def record_run(self, num_items: int, real: int, padded: int, seconds: float, num_failed_requests: int) -> None:
        now = time.monotonic()
        with self._lock:
            self._num_runs += 1
            self._num_items += num_items
            self._num_real += real
            self._num_padded += padded
            self._busy_s += seconds
            self._num_errors += num_failed_requests
            self._recent.append((now, num_items, real, padded, seconds))
            while self._recent and self._recent[0][0] < now - WINDOW_S:
                self._recent.popleft()

    def snapshot(self, recent_s: float = 10.0) -> dict[str, Any]:
        """Totals, padding ratios, batch sizes and rates (items/s over `recent_s`)."""
        now = time.monotonic()
        with self._lock:
            window = list(self._recent)
            totals = {
                "requests": self.num_requests,
                "items": self._num_items,
                "dispatches": self.num_dispatches,
                "batches": self._num_runs,
                "errors": self._num_errors,
                "rejected": self.num_rejected,
                "real_size": self._num_real,
                "padded_size": self._num_padded,
                "busy_s": round(self._busy_s, 4),
            }
        recent = [r for r in window if r[0] >= now - recent_s]
        span = max(1e-3, min(recent_s, now - recent[0][0] + recent[0][4])) if recent else max(recent_s, 1e-3)
        sizes = [r[1] for r in window]
        real = totals["real_size"]
        return {
            **totals,
            "padding_ratio": totals["padded_size"] / real if real else 0.0,
            "recent_padding_ratio": (sum(r[3] for r in window) / sum(r[2] for r in window)) if window else 0.0,
            "mean_batch_size": totals["items"] / totals["batches"] if totals["batches"] else 0.0,
            "max_batch_size_seen": max(sizes, default=0),
            "recent_batch_sizes": sizes[-60:],
            "items_per_s": sum(r[1] for r in recent) / span,
            "busy_fraction": min(1.0, sum(r[4] for r in recent) / span),
        }
