"""Fixtures of the model-management tests: a private LOCALSERVE_HOME, a user
catalog, and a fake hub that HF_ENDPOINT points at."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.models.hub import FakeHub


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty LOCALSERVE_HOME; no hub token, online."""
    monkeypatch.setenv("LOCALSERVE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LOCALSERVE_CATALOG", str(tmp_path / "catalog.json"))
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "home"


@pytest.fixture
def hub(home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    fake = FakeHub().start()
    monkeypatch.setenv("HF_ENDPOINT", fake.url)
    try:
        yield fake
    finally:
        fake.stop()


def write_catalog(path: Path, entries: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps({"models": entries}), encoding="utf-8")
    return path
