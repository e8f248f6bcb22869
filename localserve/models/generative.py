"""Which generative backend serves a model path, and opening it.

A GGUF file goes to llama.cpp (ModelManager opens it); a folder with `openvino_model.xml` to
OpenVINO; a folder (or file) with `model.onnx` to ONNX Runtime. Every one of
them is driven by the same scheduler once loaded.
"""

from __future__ import annotations

from pathlib import Path

from localserve.backends.base import GenerativeBackend
from localserve.config import ServerSettings

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


def open_generative(kind: str, path: Path, settings: ServerSettings) -> GenerativeBackend:
    """Load the model (blocking: reads weights, compiles graphs)."""
    s = settings
    if kind == ONNX:
        from localserve.backends.onnx import OnnxBackend, OnnxConfig

        return OnnxBackend(
            OnnxConfig(
                str(path),
                n_ctx=s.ctx_size,
                parallel=s.parallel,
                kv_tokens=s.kv_size,
                batch_tokens=s.batch_tokens,
                n_threads=s.threads,
                device=s.device,
            )
        )
    if kind == OPENVINO:
        from localserve.backends.openvino import OpenVinoBackend, OpenVinoConfig

        return OpenVinoBackend(
            OpenVinoConfig(
                str(path),
                n_ctx=s.ctx_size,
                parallel=s.parallel,
                kv_tokens=s.kv_size,
                batch_tokens=s.batch_tokens,
                n_threads=s.threads,
                device=s.device,
            )
        )
    raise ValueError(f"no generative backend {kind!r} here (llama.cpp models load through ModelManager)")
