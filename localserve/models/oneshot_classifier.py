"""Which backend serves a sequence classifier (a cross-encoder or a text
classifier), and opening it.

A BERT `...ForSequenceClassification` folder (safetensors, config.json,
tokenizer.json: what `save_pretrained` writes, and what the Hugging Face
cache holds) is converted once, without torch, into the store
(`convert.bert_classifier`, the embeddings path's graph builder with the
classifier head): the fused float32 ONNX graph by default, the per-token
int8 one where the catalog entry's `variant` says `int8`; OpenVINO (the
plain graph as IR) where the entry's `backend` says `openvino`.
"""

from __future__ import annotations

import logging
from pathlib import Path

from localserve.backends.base import OneShotBackend
from localserve.config import ServerSettings
from localserve.models.kinds import ModelKind

log = logging.getLogger(__name__)

ONNX, OPENVINO = "onnx", "openvino"
DEFAULT_WINDOW = 512


def classifier_kind(path: Path) -> ModelKind | None:
    """RERANK for a one-label classifier folder (a cross-encoder), CLASSIFY
    for more labels, None for anything else."""
    from localserve.models.convert.bert_classifier import classifier_config, labels_of

    config = classifier_config(path)
    if config is None:
        return None
    return ModelKind.RERANK if len(labels_of(config)) == 1 else ModelKind.CLASSIFY


def open_classifier(model_id: str, path: Path, settings: ServerSettings) -> tuple[OneShotBackend, Path]:  # type: ignore[type-arg]
    """The backend and what it loaded (blocking: converts on first use)."""
    from localserve.models.catalog import catalog_backend

    if path.suffix.lower() == ".xml" or catalog_backend(model_id) == OPENVINO:
        return _open_openvino(model_id, path, settings)
    return _open_onnx(model_id, path, settings)


def _open_onnx(model_id: str, path: Path, settings: ServerSettings) -> tuple[OneShotBackend, Path]:  # type: ignore[type-arg]
    from localserve.backends.onnx.classifier import OnnxClassifierBackend, OnnxClassifierConfig
    from localserve.models.catalog import catalog_variant

    window = _window(path)
    if path.is_dir():
        from localserve.models.convert.bert_classifier import cached_classifier_onnx
        from localserve.models.convert.cache import log_progress

        variant = catalog_variant(model_id) or "fused"
        log.info("%s: a sequence classifier, on ONNX Runtime (%s)", model_id, variant)
        progress = log_progress(model_id, f"ONNX ({variant})")
        path = cached_classifier_onnx(path, model_id, variant=variant, progress=progress)
    config = OnnxClassifierConfig(str(path), settings.device or "auto", settings.threads, window)
    return OnnxClassifierBackend(config), path


def _open_openvino(model_id: str, path: Path, settings: ServerSettings) -> tuple[OneShotBackend, Path]:  # type: ignore[type-arg]
    from localserve.backends.openvino.classifier import OpenVinoClassifierBackend, OpenVinoClassifierConfig

    window = _window(path)
    if path.is_dir():
        from localserve.models.convert.bert_classifier import cached_classifier_openvino

        log.info("%s: a sequence classifier, on OpenVINO", model_id)
        path = cached_classifier_openvino(path, model_id)
    config = OpenVinoClassifierConfig(str(path), settings.device or "auto", settings.threads, window)
    return OpenVinoClassifierBackend(config), path


def _window(path: Path) -> int:
    """The most tokens an item may have: the folder's position table."""
    from localserve.models.convert.bert_classifier import classifier_config

    config = classifier_config(path) if path.is_dir() else None
    return int((config or {}).get("max_position_embeddings", DEFAULT_WINDOW))
