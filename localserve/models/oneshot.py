"""One-shot models (embeddings, speech recognition): what a path holds, and
how to open its backend and queue. The built-in backends
(models/builtin_backends.py) call `open_oneshot` off the event loop."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from localserve.config import ServerSettings
from localserve.engine.backend import OneShotBackend
from localserve.engine.oneshot.queue import OneShotQueueConfig
from localserve.errors import InvalidRequestError
from localserve.models.gguf_arch import EMBEDDING_ARCHS, gguf_architecture
from localserve.models.kinds import ModelKind, kind_of

#: Batching defaults per kind: many short texts; a few 30 s audio windows.
#: No `max_wait_ms`: an idle model answers at once, and what arrives while it
#: is busy leaves together in its next dispatch (engine/oneshot/queue.py).
BATCHING = {
    ModelKind.EMBEDDINGS: dict(max_batch_size=128, max_batch_tokens=4096),
    ModelKind.TRANSCRIPTION: dict(max_batch_size=8, max_batch_tokens=8 * 3000),
    # Query-document pairs. Small runs: a BERT cross-encoder's pairs of ~110 tokens ran
    # 0.88x as fast in runs of 32-73 pairs as one by one on a 2-core EPYC, and fastest
    # in runs of 4-16 (their activations stay in cache; on a slower EPYC with 8 MiB of
    # L3, 4-8). 1024 tokens (about 8 such pairs) took the queue from 0.81-0.84x to
    # 0.91-0.92x of the best batched run(); a request's pairs shortest first, 0.98 /
    # 0.94x; and 512 (about 4 pairs), 1.01 / 0.99x at 1 / 8 clients
    # (bench/oneshot_bench.py --rerank, bench/results/oneshot-rerank*.json).
    ModelKind.RERANK: dict(max_batch_size=128, max_batch_tokens=512),
    ModelKind.CLASSIFY: dict(max_batch_size=128, max_batch_tokens=512),
}


def oneshot_kind(labels: tuple[str, ...]) -> ModelKind | None:
    """The one-shot kind a model's labels name, or None for a generative model."""
    kind = kind_of(labels)
    return None if kind == ModelKind.CHAT else kind


def detect_labels(path: Path) -> tuple[str, ...]:
    """What a local model is for, from its files: a CTranslate2 Whisper
    folder transcribes, a sentence-transformers folder or a BERT-family GGUF
    embeds, anything else chats."""
    if path.is_dir():
        config = _read_json(path / "config.json")
        if (path / "model.bin").is_file() and "alignment_heads" in config:
            return (ModelKind.TRANSCRIPTION,)
        if (path / "openvino_encoder_model.xml").is_file():  # an OpenVINO Whisper export
            return (ModelKind.TRANSCRIPTION,)
        from localserve.models.oneshot_classifier import classifier_kind

        kind = classifier_kind(path)  # before embeddings: a classifier is a BERT folder too
        if kind is not None:
            return (kind,)
        if (path / "model.safetensors").is_file() and config.get("model_type") == "bert":
            return (ModelKind.EMBEDDINGS,)
        return ()
    if path.suffix.lower() == ".gguf" and gguf_architecture(path) in EMBEDDING_ARCHS:
        from localserve.models.oneshot_classifier import classifier_kind

        return (classifier_kind(path) or ModelKind.EMBEDDINGS,)  # a rank-pooled GGUF reranks
    if path.suffix.lower() == ".bin":
        from localserve.models.convert.whisper import is_ggml_whisper

        if is_ggml_whisper(path):  # a whisper.cpp model
            return (ModelKind.TRANSCRIPTION,)
    if path.suffix.lower() in (".onnx", ".xml") and path.with_name(path.stem + ".tokenizer.json").is_file():
        return (ModelKind.EMBEDDINGS,)  # what `localserve convert --format onnx|openvino` writes
    return (ModelKind.CHAT,)


@dataclass(frozen=True, slots=True)
class OneShotOpened:
    backend: OneShotBackend  # type: ignore[type-arg]
    batching: OneShotQueueConfig
    source: Path  # what was loaded (the converted graph or GGUF for a sentence-transformers folder)


def open_oneshot(kind: ModelKind, model_id: str, path: Path, settings: ServerSettings) -> OneShotOpened:
    """Open a one-shot backend (blocking: converts on first use, loads weights)."""
    batching = OneShotQueueConfig(max_queue=settings.max_queue, **BATCHING[kind])  # type: ignore[arg-type]
    if kind == ModelKind.EMBEDDINGS:  # ONNX Runtime, llama.cpp or OpenVINO (see oneshot_embeddings.py)
        from localserve.models.oneshot_embeddings import open_embeddings

        embeddings_backend, loaded_path = open_embeddings(model_id, path, settings)
        return OneShotOpened(embeddings_backend, batching, loaded_path)
    if kind == ModelKind.TRANSCRIPTION:  # faster-whisper, whisper.cpp or OpenVINO (see oneshot_speech.py)
        from localserve.models.oneshot_speech import open_speech

        speech_backend, loaded_path = open_speech(model_id, path, settings)
        return OneShotOpened(speech_backend, batching, loaded_path)
    if kind in (ModelKind.RERANK, ModelKind.CLASSIFY):  # ONNX Runtime or OpenVINO (see oneshot_classifier.py)
        from localserve.models.oneshot_classifier import open_classifier

        classifier_backend, loaded_path = open_classifier(model_id, path, settings)
        return OneShotOpened(classifier_backend, batching, loaded_path)
    raise InvalidRequestError(f"unknown one-shot model kind {kind!r}")


def _read_json(path: Path) -> dict:  # type: ignore[type-arg]
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
