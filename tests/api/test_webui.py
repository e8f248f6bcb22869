"""The browser UI's routes without a browser: who gets the page and who
Ollama's text, the security headers, the API key, `--no-ui`, and what the
files may and may not contain. (tests/webui/ drives the page in Chromium.)"""

from __future__ import annotations

import re
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest

from localserve.api.webui import WEBUI_DIR
from localserve.cli.options import settings_from_args
from tests.tui.live import empty_app, serve

BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
ROOT = Path(__file__).resolve().parents[2]


async def test_a_browser_gets_the_page_and_everyone_else_ollamas_answer() -> None:
    async with serve(empty_app()) as client:
        for accept in (None, "*/*", "application/json", "text/plain"):
            response = await client.get("/", headers={"Accept": accept} if accept else {})
            assert response.status == 200 and await response.text() == "Ollama is running", accept
            assert "Content-Security-Policy" not in response.headers
        page = await client.get("/", headers={"Accept": BROWSER_ACCEPT})
        assert page.status == 200 and page.content_type == "text/html"
        html = await page.text()
        assert '<script type="module" src="ui/app.js"></script>' in html
        csp = page.headers["Content-Security-Policy"]
        for directive in ("default-src 'self'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"):
            assert directive in csp
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
        assert page.headers["X-Content-Type-Options"] == "nosniff"
        assert page.headers["X-Frame-Options"] == "DENY"


async def test_every_file_the_page_loads_is_served_with_its_type_and_headers() -> None:
    async with serve(empty_app()) as client:
        for path in sorted(WEBUI_DIR.glob("*")):
            if path.suffix not in (".js", ".css", ".svg"):
                continue
            response = await client.get(f"/ui/{path.name}")
            assert response.status == 200, path.name
            assert (
                response.content_type
                == {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}[path.suffix]
            )
            assert response.headers["X-Content-Type-Options"] == "nosniff"
            assert await response.read() == path.read_bytes()


@pytest.mark.parametrize(
    "path",
    ["/ui/README.md", "/ui/index.html", "/ui/../api/webui.py", "/ui/%2e%2e/config.py", "/ui/nope.js", "/ui/App.js"],
)
async def test_nothing_else_is_served_under_ui(path: str) -> None:
    async with serve(empty_app()) as client:
        response = await client.get(path)
        assert response.status == 404, path
        assert "error" in await response.json()


async def test_with_an_api_key_the_page_and_its_files_need_none_and_everything_else_does() -> None:
    async with serve(empty_app(api_key="k")) as client:
        assert (await client.get("/", headers={"Accept": BROWSER_ACCEPT})).status == 200
        assert (await client.get("/ui/app.js")).status == 200
        assert (await client.get("/")).status == 401  # Ollama's probe, as before
        assert (await client.get("/v1/models")).status == 401
        assert (await client.get("/api/v1/stats")).status == 401
        assert (await client.get("/v1/models", headers={"Authorization": "Bearer k"})).status == 200


async def test_no_ui_turns_the_page_off() -> None:
    async with serve(empty_app(no_ui=True)) as client:
        response = await client.get("/", headers={"Accept": BROWSER_ACCEPT})
        assert await response.text() == "Ollama is running"
        assert (await client.get("/ui/app.js")).status == 404


def test_no_ui_flag_and_its_environment_variable() -> None:
    assert settings_from_args([], {}).no_ui is False
    assert settings_from_args(["--no-ui"], {}).no_ui is True
    assert settings_from_args([], {"LOCALSERVE_NO_UI": "1"}).no_ui is True
    assert settings_from_args([], {"LOCALSERVE_NO_UI": "false"}).no_ui is False


def test_the_scripts_write_no_html_and_reach_no_other_origin() -> None:
    """Model output and user text go in as text nodes only; nothing is
    loaded from another origin (the page works offline)."""
    for path in WEBUI_DIR.iterdir():
        if path.suffix not in (".js", ".html", ".css"):
            continue
        text = path.read_text()
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
            assert sink not in text, (path.name, sink)
        assert not re.search(r"https?://", text), path.name
        assert not re.search(r"\bstyle=", text), path.name  # the CSP allows no inline style


def test_the_ui_files_ship_in_the_package() -> None:
    """Every file of localserve/webui/ matches the package-data globs, so a wheel carries them."""
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["localserve"]
    files = [p.relative_to(ROOT / "localserve").as_posix() for p in WEBUI_DIR.rglob("*") if p.is_file()]
    assert "webui/index.html" in files and "webui/app.js" in files
    for name in files:
        assert any(fnmatch(name, pattern) for pattern in globs), name
