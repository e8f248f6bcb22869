"""The backends that ship with localserve, in the order they claim a path.

Speech first (a Whisper folder also holds a `config.json`), then embeddings
(a BERT-family GGUF is a GGUF too), then chat. Each names the modules it
needs and the extra that installs them: llama.cpp is in the base install;
speech (`[speech]`: faster-whisper, whisper.cpp, PyAV), ONNX Runtime
(`[onnx]`) and OpenVINO (`[openvino]`) are extras.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from localserve.config import MODEL_DEFAULTS
from localserve.models.backend_spec import (
    CHAT,
    CLASSIFY,
    EMBEDDINGS,
    LLAMACPP,
    RERANK,
    TRANSCRIPTION,
    BackendContext,
    BackendSpec,
    Opened,
)
from localserve.models.kinds import ModelKind

ONNX, OPENVINO, FASTER_WHISPER, WHISPER_CPP, AUTO = "onnx", "openvino", "whisper", "whisper.cpp", "auto"
GGUF_MAGIC = b"GGUF"


# ---- what a path holds -------------------------------------------------------------------


def is_gguf(path: Path) -> bool:
    """A GGUF file, by its magic (Ollama's blobs have no `.gguf` suffix)."""
    if not path.is_file():
        return False
    with path.open("rb") as f:
        return f.read(4) == GGUF_MAGIC


def is_embedding_gguf(path: Path) -> bool:
    from localserve.models.gguf_arch import EMBEDDING_ARCHS, gguf_architecture

    try:
        return is_gguf(path) and gguf_architecture(path) in EMBEDDING_ARCHS
    except (MemoryError, OverflowError, ValueError):  # a corrupt header
        return False


def is_sentence_transformers(path: Path) -> bool:
    return path.is_dir() and (path / "model.safetensors").is_file() and _config(path).get("model_type") == "bert"


def is_rank_gguf(kind: ModelKind) -> Any:
    return is_sequence_classifier(kind, folder=False)


def is_sequence_classifier(kind: ModelKind, *, folder: bool) -> Any:
    """A BERT `...ForSequenceClassification` folder, or an encoder GGUF with
    rank pooling: one label is a rerank model (a cross-encoder), more a
    classify model."""

    def detect(path: Path) -> bool:
        from localserve.models.oneshot_classifier import classifier_kind

        if path.is_dir() != folder or (not folder and not is_gguf(path)):
            return False
        return classifier_kind(path) == kind

    return detect


def is_ct2_whisper(path: Path) -> bool:
    return path.is_dir() and (path / "model.bin").is_file() and "alignment_heads" in _config(path)


def is_ggml_whisper_file(path: Path) -> bool:
    from localserve.models.convert.whisper import is_ggml_whisper

    return path.is_file() and path.suffix.lower() == ".bin" and is_ggml_whisper(path)


def is_openvino_whisper_folder(path: Path) -> bool:
    return path.is_dir() and (path / "openvino_encoder_model.xml").is_file()


def is_converted_embeddings(suffix: str) -> Any:
    """What `localserve convert --format onnx|openvino` writes: NAME.onnx|.xml beside NAME.tokenizer.json."""

    def detect(path: Path) -> bool:
        return (
            path.is_file() and path.suffix.lower() == suffix and path.with_name(path.stem + ".tokenizer.json").is_file()
        )

    return detect


def is_onnx_decoder(path: Path) -> bool:
    """A folder of `localserve export --to onnx` (or its model.onnx beside tokenizer.json)."""
    if path.is_dir():
        return (path / "model.onnx").is_file()
    return path.name == "model.onnx" and (path.parent / "tokenizer.json").is_file()


def is_openvino_decoder(path: Path) -> bool:
    if path.is_dir():
        return (path / "openvino_model.xml").is_file()
    return path.name == "openvino_model.xml"


def _config(folder: Path) -> dict[str, Any]:
    try:
        data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


# ---- opening -----------------------------------------------------------------------------


def open_llamacpp(path: Path, ctx: BackendContext) -> Opened:
    """A GGUF fitted to memory (GPU layers, context per slot) with its load report."""
    from localserve.backends.llamacpp.backend import LlamaCppBackend
    from localserve.models.plan import plan_llamacpp

    plan = plan_llamacpp(ctx.model_id, path, ctx.settings, ctx.request)
    backend = LlamaCppBackend(plan.config)
    return Opened(backend, report=plan.report(backend.capacity(), backend.info().device))


def open_onnx(path: Path, ctx: BackendContext) -> Opened:
    from localserve.backends.onnx.backend import OnnxBackend, OnnxConfig

    return _plain(OnnxBackend(OnnxConfig(str(path), **_decoder_options(ctx))), ctx)


def open_openvino(path: Path, ctx: BackendContext) -> Opened:
    from localserve.backends.openvino.backend import OpenVinoBackend, OpenVinoConfig

    return _plain(OpenVinoBackend(OpenVinoConfig(str(path), **_decoder_options(ctx))), ctx)


def _decoder_options(ctx: BackendContext) -> dict[str, Any]:
    """The sizes ONNX Runtime's and OpenVINO's decoders take alike. No GGUF
    header here, so ctx_size 0 (the training context) falls back to the default."""
    s, o = ctx.settings, ctx.options
    return {
        "n_ctx": o.ctx_size or int(MODEL_DEFAULTS["ctx_size"]),
        "num_slots": o.parallel,
        "kv_size": o.kv_size,
        "step_tokens": s.batch_tokens,
        "n_threads": s.cpu_threads,
        "device": o.device,
    }


def _plain(backend: Any, ctx: BackendContext) -> Opened:
    from localserve.models.plan import plain_report

    return Opened(backend, report=plain_report(ctx.options, backend.capacity(), backend.info().device))


def open_oneshot_builtin(kind: ModelKind) -> Any:
    """The built-in embeddings and speech models open through models/oneshot.py,
    which picks the runtime from the files and the catalog entry."""

    def open_(path: Path, ctx: BackendContext) -> Opened:
        from localserve.models.oneshot import open_oneshot

        opened = open_oneshot(kind, ctx.model_id, path, ctx.options.settings_for(ctx.settings))
        return Opened(opened.backend, batching=opened.batching, source=opened.source)

    return open_


_SPEECH = open_oneshot_builtin(TRANSCRIPTION)
_EMBED = open_oneshot_builtin(EMBEDDINGS)
_RERANK = open_oneshot_builtin(RERANK)
_CLASSIFY = open_oneshot_builtin(CLASSIFY)
_ONNX_MODULES = ("onnxruntime", "onnx", "tokenizers")

BUILTIN_BACKENDS: tuple[BackendSpec, ...] = (
    BackendSpec(FASTER_WHISPER, TRANSCRIPTION, _SPEECH, is_ct2_whisper, ("faster_whisper", "av"), "speech"),
    BackendSpec(WHISPER_CPP, TRANSCRIPTION, _SPEECH, is_ggml_whisper_file, ("_pywhispercpp", "av"), "speech"),
    BackendSpec(
        OPENVINO, TRANSCRIPTION, _SPEECH, is_openvino_whisper_folder, ("openvino_genai", "av"), "openvino,speech"
    ),
    # A sequence classifier (before embeddings: it is a BERT folder too), on
    # ONNX Runtime, or on OpenVINO where its catalog entry names it (models/oneshot_classifier.py).
    BackendSpec(ONNX, RERANK, _RERANK, is_sequence_classifier(RERANK, folder=True), _ONNX_MODULES, "onnx"),
    BackendSpec(ONNX, CLASSIFY, _CLASSIFY, is_sequence_classifier(CLASSIFY, folder=True), _ONNX_MODULES, "onnx"),
    BackendSpec(LLAMACPP, RERANK, _RERANK, is_rank_gguf(RERANK), ("llama_cpp",)),
    BackendSpec(LLAMACPP, CLASSIFY, _CLASSIFY, is_rank_gguf(CLASSIFY), ("llama_cpp",)),
    BackendSpec(OPENVINO, RERANK, _RERANK, None, ("openvino", "onnx", "tokenizers"), "openvino"),
    BackendSpec(OPENVINO, CLASSIFY, _CLASSIFY, None, ("openvino", "onnx", "tokenizers"), "openvino"),
    # A sentence-transformers folder: ONNX Runtime when installed, else llama.cpp (models/oneshot_embeddings.py).
    BackendSpec(AUTO, EMBEDDINGS, _EMBED, is_sentence_transformers, ("llama_cpp",)),
    BackendSpec(LLAMACPP, EMBEDDINGS, _EMBED, is_embedding_gguf, ("llama_cpp",)),
    BackendSpec(
        ONNX, EMBEDDINGS, _EMBED, is_converted_embeddings(".onnx"), ("onnxruntime", "onnx", "tokenizers"), "onnx"
    ),
    BackendSpec(OPENVINO, EMBEDDINGS, _EMBED, is_converted_embeddings(".xml"), ("openvino", "tokenizers"), "openvino"),
    BackendSpec(ONNX, CHAT, open_onnx, is_onnx_decoder, ("onnxruntime", "tokenizers"), "onnx"),
    BackendSpec(OPENVINO, CHAT, open_openvino, is_openvino_decoder, ("openvino", "tokenizers"), "openvino"),
    BackendSpec(LLAMACPP, CHAT, open_llamacpp, is_gguf, ("llama_cpp",)),
)
