"""`localserve top`: flags, environment and defaults reach the dashboard."""

from __future__ import annotations

import pytest

from localserve.cli import main as cli


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str | None]]:
    seen: list[tuple[str, str | None]] = []
    monkeypatch.setattr("localserve.tui.app.run", lambda url, api_key=None: seen.append((url, api_key)))
    monkeypatch.delenv("LOCALSERVE_URL", raising=False)
    monkeypatch.delenv("LOCALSERVE_API_KEY", raising=False)
    return seen


def test_defaults(calls: list[tuple[str, str | None]]) -> None:
    assert cli.main(["top"]) == 0
    assert calls == [("http://127.0.0.1:8400", None)]


def test_flags_win_over_the_environment(calls: list[tuple[str, str | None]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALSERVE_URL", "http://10.0.0.2:9000")
    monkeypatch.setenv("LOCALSERVE_API_KEY", "from-env")
    assert cli.main(["top"]) == 0
    assert cli.main(["top", "--url", "http://localhost:8401/", "--api-key", "k"]) == 0
    assert calls == [("http://10.0.0.2:9000", "from-env"), ("http://localhost:8401", "k")]
