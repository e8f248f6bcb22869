"""One real server (SmolLM2 on llama.cpp, an API key) and one headless
Chromium, shared by the UI tests of this package; each test gets a fresh
browser context (its own localStorage) that already holds the key."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.api.harness import API_KEY, ServerThread, make_settings
from tests.webui.browser import CHROMIUM, CHROMIUM_ARGS, VIEWPORT, PageWatch, chromium_missing
from tests.webui.session import UiSession

#: Sets the key the way the page's dialog does, before the page's scripts run.
KEY_SCRIPT = f"sessionStorage.setItem('localserve.apiKey', {API_KEY!r});"


@pytest.fixture(scope="package")
def ui_server() -> Iterator[ServerThread]:
    """SmolLM2-135M-Instruct, 4 slots, API key required; one llama.cpp
    thread, so that Chromium keeps the other core."""
    settings = make_settings(api_key=API_KEY, parallel=4, ctx_size=1024, kv_size=4096, batch_tokens=256, threads=1)
    server = ServerThread(settings).start()
    try:
        server.wait_healthy(120)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="package")
def browser():  # type: ignore[no-untyped-def]
    missing = chromium_missing()
    if missing:
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def context(browser):  # type: ignore[no-untyped-def]
    """A fresh browser profile (empty localStorage), the API key already in sessionStorage."""
    ctx = browser.new_context(viewport=VIEWPORT, accept_downloads=True)
    ctx.add_init_script(KEY_SCRIPT)
    ctx.set_default_timeout(30_000)
    try:
        yield ctx
    finally:
        ctx.close()


@pytest.fixture
def ui(context, ui_server: ServerThread) -> UiSession:  # type: ignore[no-untyped-def]
    """A new tab on the server, watched (see `PageWatch`)."""
    tab = context.new_page()
    return UiSession(tab, PageWatch(ui_server.base_url).attach(tab), ui_server)
