"""Headless Chromium for the UI tests: Debian's `chromium` package driven by
Playwright for Python (Playwright's own browser download is not used), and a
watch over each page for console errors, uncaught exceptions, dialogs and
requests that leave the server's origin."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from playwright.sync_api import ConsoleMessage, Page, Request

CHROMIUM = os.environ.get("LOCALSERVE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",  # the tests run as root in CI
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1280, "height": 800}
ROOT = Path(__file__).resolve().parents[2]
#: Where the screenshots go (a test artefact; `test-artifacts/` is not committed).
ARTIFACTS = Path(os.environ.get("LOCALSERVE_TEST_ARTIFACTS") or ROOT / "test-artifacts") / "webui"


def chromium_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not Path(CHROMIUM).is_file():
        return f"no Chromium at {CHROMIUM}: install Debian's chromium package (`make test` and .ci/run do)"
    return None


@dataclass
class PageWatch:
    """What a page did that it should not: console errors, uncaught
    exceptions, alert/confirm dialogs, requests to another origin."""

    origin: str
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    foreign_requests: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    accept_dialogs: bool = False

    def attach(self, page: Page) -> PageWatch:
        page.on("console", self._on_console)
        page.on("pageerror", lambda error: self.page_errors.append(str(error)))
        page.on("request", self._on_request)
        page.on("dialog", self._on_dialog)
        return self

    def _on_console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.console_errors.append(message.text)

    def _on_request(self, request: Request) -> None:
        self.requests.append(request.url)
        parts = urlsplit(request.url)
        if parts.scheme in ("data", "blob"):
            return
        if f"{parts.scheme}://{parts.netloc}" != self.origin:
            self.foreign_requests.append(request.url)

    def _on_dialog(self, dialog) -> None:  # type: ignore[no-untyped-def]
        self.dialogs.append(f"{dialog.type}: {dialog.message}")
        if self.accept_dialogs and dialog.type == "confirm":
            dialog.accept()
        else:
            dialog.dismiss()

    def assert_clean(self) -> None:
        assert not self.page_errors, self.page_errors
        assert not self.console_errors, self.console_errors
        assert not self.foreign_requests, self.foreign_requests
        assert not self.dialogs, self.dialogs


def screenshot(page: Page, name: str) -> Path:
    """A 1280x800 screenshot of the page as a test artefact."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path
