"""A one-line progress bar on stderr: requests done of total, tokens/s, ETA.

On a terminal the line is redrawn in place (at most every `interval_s`); in
a log (not a TTY) a line is printed every `log_interval_s` instead.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

BAR_WIDTH = 24


class Progress:
    def __init__(self, stream: TextIO | None = None, *, interval_s: float = 0.2, log_interval_s: float = 10.0) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.interval_s = interval_s if self.tty else log_interval_s
        self.num_total = self.num_done = self.num_failed = self.num_tokens = 0
        self._num_at_start = 0
        self._started = self._drawn = 0.0

    def start(self, num_total: int, num_done: int = 0) -> None:
        self.num_total, self.num_done, self._num_at_start = num_total, num_done, num_done
        self._started = time.monotonic()
        self._draw(force=True)

    def advance(self, *, ok: bool, num_tokens: int = 0) -> None:
        self.num_done += 1
        self.num_failed += not ok
        self.num_tokens += num_tokens
        self._draw()

    def finish(self) -> None:
        self._draw(force=True)
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()

    def line(self) -> str:
        elapsed = max(1e-9, time.monotonic() - self._started)
        fraction = self.num_done / self.num_total if self.num_total else 1.0
        filled = int(fraction * BAR_WIDTH)
        rate = (self.num_done - self._num_at_start) / elapsed
        eta = (self.num_total - self.num_done) / rate if rate > 0 else None
        failed = f", {self.num_failed} failed" if self.num_failed else ""
        return (
            f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {self.num_done}/{self.num_total} requests{failed} | "
            f"{self.num_tokens / elapsed:.1f} tok/s | ETA {_clock(eta)}"
        )

    def _draw(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._drawn < self.interval_s:
            return
        self._drawn = now
        self.stream.write(f"\r{self.line()}\033[K" if self.tty else f"{self.line()}\n")
        self.stream.flush()


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "--:--"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"
