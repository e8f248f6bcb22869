"""The real server the dashboard's live tests watch (loaded once per session)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.tui.live import LiveServer, make_settings


@pytest.fixture(scope="session")
def live() -> Iterator[LiveServer]:
    """SmolLM2-135M-Instruct, 4 slots, 1024-token context, no API key."""
    server = LiveServer(make_settings()).start()
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()
