"""Fixtures of the model-management tests: a private LOCALSERVE_HOME, Hugging
Face cache, Ollama store and LM Studio folder, a user catalog, a fake hub that
HF_ENDPOINT points at, and real servers over a catalog of tiny GGUF models."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.api.harness import ServerThread, make_settings
from tests.fixtures.tiny_gguf import write_tiny_llama
from tests.models.hub import FakeHub


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty LOCALSERVE_HOME, Hugging Face cache (HF_HOME), Ollama store and
    LM Studio folder; no hub token, online."""
    monkeypatch.setenv("LOCALSERVE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LOCALSERVE_CATALOG", str(tmp_path / "catalog.json"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    monkeypatch.setenv("LOCALSERVE_LMSTUDIO_MODELS", str(tmp_path / "lmstudio"))
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "home"


@pytest.fixture
def hub(home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    import huggingface_hub.constants

    fake = FakeHub().start()
    monkeypatch.setenv("HF_ENDPOINT", fake.url)
    # Reads of 64 KiB (huggingface_hub's are 10 MB): a connection cut mid-file leaves the bytes before the cut.
    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)
    try:
        yield fake
    finally:
        fake.stop()


def write_catalog(path: Path, entries: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps({"models": entries}), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("tiny-models")
    return {name: write_tiny_llama(folder / f"{name}.gguf", seed=seed) for seed, name in enumerate("abcd")}


@pytest.fixture
def catalog(home: Path, tmp_path: Path, tiny_models: dict[str, Path]) -> Path:
    entries: list[dict[str, Any]] = [
        {"id": f"tiny-{name}", "labels": ["chat"], "sources": [{"uri": str(path)}]}
        for name, path in tiny_models.items()
    ]
    entries.append({"id": "hub-tiny", "labels": ["chat"], "sources": [{"uri": "hf://test/tiny-gguf/tiny.gguf"}]})
    return write_catalog(tmp_path / "catalog.json", entries)


@pytest.fixture
def start_server(catalog: Path) -> Iterator[Callable[..., ServerThread]]:
    servers: list[ServerThread] = []

    def start(**overrides: Any) -> ServerThread:
        settings = make_settings(models=[], parallel=2, ctx_size=512, kv_size=1024, threads=1, **overrides)
        server = ServerThread(settings).start()
        servers.append(server)
        server.wait_healthy(30)
        return server

    yield start
    for server in servers:
        server.stop()
