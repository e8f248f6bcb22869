"""The one progress line of the commands (`pull`, `convert`, `export`): on a
terminal one line redrawn in place, elsewhere (a log, a pipe) a line at each
quarter of the way, so long work always shows where it is."""

from __future__ import annotations

from typing import TextIO

BAR_WIDTH = 24


def bar(fraction: float) -> str:
    """`[#####-------]` for `fraction` of the way (0..1)."""
    filled = int(max(0.0, min(1.0, fraction)) * BAR_WIDTH)
    return f"[{'#' * filled}{'-' * (BAR_WIDTH - filled)}]"


class ProgressLine:
    """One line of `out`: `show` redraws it on a terminal, or prints it once per
    quarter of the way (per `key`: a file, a stage) elsewhere; `line` prints a
    line of its own; `finish` ends a redrawn line."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self.open_line = False
        self._quarters: dict[str, int] = {}

    def show(self, key: str, fraction: float, text: str) -> None:
        if self.tty:
            self.out.write("\r\x1b[K" + text)
            self.out.flush()
            self.open_line = True
            return
        quarter = int(max(0.0, min(1.0, fraction)) * 4)
        if self._quarters.get(key) != quarter:
            self._quarters[key] = quarter
            self.line(text)

    def line(self, text: str) -> None:
        self.finish()
        print(text, file=self.out, flush=True)

    def finish(self) -> None:
        if self.open_line:
            self.out.write("\n")
            self.out.flush()
            self.open_line = False
