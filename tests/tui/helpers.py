"""Helpers shared by the dashboard tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from textual.app import App
from textual.pilot import Pilot
from textual.widget import Widget


async def wait_for(pilot: Pilot, predicate: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    """Let the app run until `predicate()` holds (generous timeouts: CI machines are slow)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what or predicate}")
        await pilot.pause(0.05)
    await asyncio.sleep(0)


def screen_text(app: App[None], widget: type[Widget] | None = None) -> str:
    """What the screen shows as plain text (inside `widget`, if given)."""
    lines = [strip.text for strip in app.screen._compositor.render_strips()]
    if widget is None:
        return "\n".join(lines)
    region = app.query_one(widget).content_region  # inside the border and padding
    return "\n".join(line[region.x : region.right] for line in lines[region.y : region.bottom])
