"""Helpers shared by the dashboard tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from textual.pilot import Pilot


async def wait_for(pilot: Pilot, predicate: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    """Let the app run until `predicate()` holds (generous timeouts: CI machines are slow)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what or predicate}")
        await pilot.pause(0.05)
    await asyncio.sleep(0)
