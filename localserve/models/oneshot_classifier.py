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

from localserve.config import ServerSettings
from localserve.engine.backend import OneShotBackend
from localserve.models.kinds import ModelKind

log = logging.getLogger(__name__)

ONNX, OPENVINO, LLAMACPP = "onnx", "openvino", "llamacpp"
DEFAULT_WINDOW = 512


def classifier_kind(path: Path) -> ModelKind | None:
    """RERANK for a one-label classifier (a cross-encoder: a folder, or a GGUF
    with rank pooling), CLASSIFY for more labels, None for anything else."""
    from localserve.models.convert.bert_classifier import classifier_config, labels_of

    if path.is_file():
        labels = gguf_rank_labels(path)
    else:
        config = classifier_config(path)
        labels = labels_of(config) if config is not None else None
    if labels is None:
        return None
    return ModelKind.RERANK if len(labels) == 1 else ModelKind.CLASSIFY


def gguf_rank_labels(path: Path) -> tuple[str, ...] | None:
    """The labels of an encoder GGUF whose pooling is `rank` (one if it names
    none), else None."""
    from localserve.models.gguf_arch import EMBEDDING_ARCHS, gguf_architecture

    arch = gguf_architecture(path)
    if arch not in EMBEDDING_ARCHS:
        return None
    try:
        import gguf

        fields = gguf.GGUFReader(str(path)).fields
        pooling = fields.get(f"{arch}.pooling_type")
        if pooling is None or int(pooling.contents()) != int(gguf.PoolingType.RANK):
            return None
        labels = fields.get(f"{arch}.classifier.output_labels")
        return tuple(str(x) for x in labels.contents()) if labels is not None else ("LABEL_0",)
    except (OSError, ValueError, KeyError, IndexError):
        return None


def open_classifier(model_id: str, path: Path, settings: ServerSettings) -> tuple[OneShotBackend, Path]:  # type: ignore[type-arg]
    """The backend and what it loaded (blocking: converts on first use)."""
    from localserve.models.catalog import catalog_backend

    declared = catalog_backend(model_id)
    if path.suffix.lower() == ".xml" or declared == OPENVINO:
        return _open_openvino(model_id, path, settings)
    if (path.is_file() and path.suffix.lower() != ".onnx") or declared == LLAMACPP:
        return _open_llamacpp(model_id, path, settings)
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
    config = OnnxClassifierConfig(str(path), settings.device or "auto", settings.cpu_threads, window)
    return OnnxClassifierBackend(config), path


def _open_openvino(model_id: str, path: Path, settings: ServerSettings) -> tuple[OneShotBackend, Path]:  # type: ignore[type-arg]
    from localserve.backends.openvino.classifier import OpenVinoClassifierBackend, OpenVinoClassifierConfig

    window = _window(path)
    if path.is_dir():
        from localserve.models.convert.bert_classifier import cached_classifier_openvino

        log.info("%s: a sequence classifier, on OpenVINO", model_id)
        path = cached_classifier_openvino(path, model_id)
    config = OpenVinoClassifierConfig(str(path), settings.device or "auto", settings.cpu_threads, window)
    return OpenVinoClassifierBackend(config), path


def _open_llamacpp(model_id: str, path: Path, settings: ServerSettings) -> tuple[OneShotBackend, Path]:  # type: ignore[type-arg]
    from localserve.backends.llamacpp.classifier import LlamaClassifierBackend
    from localserve.backends.llamacpp.embeddings import LlamaEmbeddingConfig

    if path.is_dir():
        from localserve.models.convert.bert_classifier import cached_classifier_gguf
        from localserve.models.convert.cache import log_progress

        log.info("%s: a sequence classifier, on llama.cpp (rank pooling)", model_id)
        path = cached_classifier_gguf(path, model_id, progress=log_progress(model_id))
    config = LlamaEmbeddingConfig(str(path), n_threads=settings.cpu_threads, device=settings.device or "auto")
    return LlamaClassifierBackend(config), path


def _window(path: Path) -> int:
    """The most tokens an item may have: the folder's position table."""
    from localserve.models.convert.bert_classifier import classifier_config

    config = classifier_config(path) if path.is_dir() else None
    return int((config or {}).get("max_position_embeddings", DEFAULT_WINDOW))
