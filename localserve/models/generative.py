"""Which generative backend serves a model path, and opening it.

A GGUF file goes to llama.cpp (ModelManager opens it); a folder with `openvino_model.xml` to
OpenVINO; a folder (or file) with `model.onnx` to ONNX Runtime. Every one of
them is driven by the same scheduler once loaded.
"""

from __future__ import annotations

from pathlib import Path

from localserve.backends.base import GenerativeBackend
from localserve.config import MODEL_DEFAULTS, ServerSettings
from localserve.models.options import ResolvedOptions

LLAMACPP, ONNX, OPENVINO = "llamacpp", "onnx", "openvino"


def backend_kind(path: Path) -> str | None:
    """The generative backend for `path`, or None if it holds no decoder we know."""
    if path.is_dir():
        if (path / "openvino_model.xml").is_file():
            return OPENVINO
        if (path / "model.onnx").is_file():
            return ONNX
        return None
    suffix = path.suffix.lower()
    if suffix == ".xml" and path.name == "openvino_model.xml":
        return OPENVINO
    if suffix == ".onnx" and (path.parent / "tokenizer.json").is_file() and path.name == "model.onnx":
        return ONNX
    return LLAMACPP if suffix == ".gguf" else None


def open_generative(kind: str, path: Path, settings: ServerSettings, options: ResolvedOptions) -> GenerativeBackend:
    """Load the model with its resolved per-model `options` (blocking: reads
    weights, compiles graphs). No GGUF header here, so ctx_size 0 (the
    model's training context) falls back to the default context."""
    s, o = settings, options
    n_ctx = o.ctx_size or int(MODEL_DEFAULTS["ctx_size"])
    if kind == ONNX:
        from localserve.backends.onnx import OnnxBackend, OnnxConfig

        return OnnxBackend(
            OnnxConfig(
                str(path),
                n_ctx=n_ctx,
                parallel=o.parallel,
                kv_tokens=o.kv_size,
                batch_tokens=s.batch_tokens,
                n_threads=s.threads,
                device=o.device,
            )
        )
    if kind == OPENVINO:
        from localserve.backends.openvino import OpenVinoBackend, OpenVinoConfig

        return OpenVinoBackend(
            OpenVinoConfig(
                str(path),
                n_ctx=n_ctx,
                parallel=o.parallel,
                kv_tokens=o.kv_size,
                batch_tokens=s.batch_tokens,
                n_threads=s.threads,
                device=o.device,
            )
        )
    raise ValueError(f"no generative backend {kind!r} here (llama.cpp models load through ModelManager)")
