"""Which speech backend serves a Whisper model, and opening it.

A CTranslate2 folder is served by faster-whisper, unless its catalog entry
names another backend (`whisper.cpp`, `openvino`): then it is converted once
into that backend's format, cached in the model store. A path that already
is a whisper.cpp ggml file or an OpenVINO Whisper IR folder is served by
that backend directly.
"""

from __future__ import annotations

from pathlib import Path

from localserve.config import ServerSettings
from localserve.engine.backend import OneShotBackend
from localserve.models.convert.cache import log_progress

FASTER_WHISPER, WHISPER_CPP, OPENVINO = "whisper", "whisper.cpp", "openvino"
SPEECH_BACKENDS = (FASTER_WHISPER, WHISPER_CPP, OPENVINO)


def speech_backend(model_id: str, path: Path) -> str:
    """The backend for `path`: by its format, else by the catalog entry."""
    from localserve.models.catalog import catalog_backend
    from localserve.models.convert.whisper import is_ggml_whisper
    from localserve.models.convert.whisper_openvino import is_openvino_whisper

    if path.is_file() and is_ggml_whisper(path):
        return WHISPER_CPP
    if is_openvino_whisper(path):
        return OPENVINO
    backend = catalog_backend(model_id)
    return backend if backend in SPEECH_BACKENDS else FASTER_WHISPER


def open_speech(model_id: str, path: Path, settings: ServerSettings) -> tuple[OneShotBackend, Path]:  # type: ignore[type-arg]
    """The backend and what it loaded (blocking: converts on first use)."""
    backend = speech_backend(model_id, path)
    device = settings.device or "auto"  # None: nobody asked for one
    if backend == WHISPER_CPP:
        from localserve.backends.speech.whisper_cpp import WhisperCppBackend, WhisperCppConfig
        from localserve.models.convert.whisper import cached_ggml

        if path.is_dir():
            path = cached_ggml(path, model_id, progress=log_progress(model_id, "whisper.cpp ggml"))
        return WhisperCppBackend(WhisperCppConfig(str(path), device, settings.cpu_threads)), path
    if backend == OPENVINO:
        from localserve.backends.openvino.whisper import OpenVinoWhisperBackend, OpenVinoWhisperConfig
        from localserve.models.convert.whisper_openvino import cached_openvino, is_openvino_whisper

        if not is_openvino_whisper(path):
            path = cached_openvino(path, model_id, progress=log_progress(model_id, "OpenVINO IR"))
        return OpenVinoWhisperBackend(OpenVinoWhisperConfig(str(path), device, settings.cpu_threads)), path
    from localserve.backends.speech.faster_whisper import FasterWhisperBackend, WhisperConfig

    return FasterWhisperBackend(WhisperConfig(str(path), device=device, n_threads=settings.cpu_threads)), path
