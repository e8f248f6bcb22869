"""Which backend serves an embeddings model, and opening it.

A sentence-transformers BERT folder runs on any of three backends, each from
a one-time conversion cached in the model store (no torch):

* `onnx` - ONNX Runtime, on a graph built from the safetensors (`convert.bert_onnx`):
  ONNX Runtime's fused operators in float32, or their int8 form (per-token
  activation scales, `convert.bert_onnx_int8`) where the catalog entry says
  `"variant": "int8"`, as all-minilm-l6-v2's does;
* `llamacpp` - llama.cpp, on a converted GGUF (`convert`);
* `openvino` - OpenVINO, on an IR (`convert_openvino`).

A catalog entry names one of them, or `auto`: the first of `AUTO_PREFERENCE`
that is installed. ONNX Runtime comes first because it served
all-MiniLM-L6-v2 at about twice the items/s of llama.cpp's GGUF path on CPU,
at 1 and at 32 clients (`bench/oneshot_bench.py`); llama.cpp is always
installed, so `auto` falls back to it where onnxruntime (or `onnx`, which
builds the graph the first time) is missing, or where a GPU is asked for
and onnxruntime has none. A folder served under an id the catalog does not
know is `auto` too. A path that already is a GGUF, an `.onnx` graph or an
OpenVINO `.xml` is served by that backend. The backend registry
(models/builtin_backends.py) opens every built-in embeddings backend,
`auto` included, through `open_embeddings`; `localserve list` shows what
`auto` picks here (`listed_backend`), `/api/v1/stats` what was loaded.

`--pooling` (llama-server's: mean, cls, last or none) loads every
embeddings model on llama.cpp with that pooling, whatever it would run on
otherwise: the ONNX Runtime and OpenVINO graphs pool inside the graph. A
model that is an ONNX or OpenVINO graph itself cannot take it.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path

from localserve.config import ServerSettings
from localserve.engine.backend import OneShotBackend
from localserve.errors import DeviceNotFoundError, InvalidRequestError, LocalServeError

log = logging.getLogger(__name__)

ONNX, LLAMACPP, OPENVINO, AUTO = "onnx", "llamacpp", "openvino", "auto"
EMBEDDINGS_BACKENDS = (ONNX, LLAMACPP, OPENVINO)
#: What `auto` tries, fastest first (measured; see the module docstring).
AUTO_PREFERENCE = (ONNX, LLAMACPP)


@dataclass(frozen=True, slots=True)
class EmbeddingsChoice:
    """The backend for one model, and why (for logs, `localserve list`)."""

    backend: str  # onnx | llamacpp | openvino
    reason: str  # "catalog", "file format", or what `auto` saw

    @property
    def auto(self) -> bool:
        return self.reason.startswith(AUTO)


def missing_for_onnx(path: Path | None = None) -> str:
    """What ONNX Runtime embeddings lack here ("" when nothing): onnxruntime
    and tokenizers to run, and `onnx` to build the graph unless `path` is one."""
    needed = ["onnxruntime", "tokenizers"]
    if path is None or path.suffix.lower() != ".onnx":
        needed.append("onnx")
    missing = [name for name in needed if not _importable(name)]
    return " and ".join(missing) + " not installed" if missing else ""


def choose_embeddings_backend(path: Path | None, declared: str) -> EmbeddingsChoice:
    """The backend for `path` (None: not on this machine yet): by its format,
    else the catalog's `declared` backend, else (`auto`, "" or unknown) the
    first installed backend of `AUTO_PREFERENCE`."""
    if path is not None and path.is_file():
        suffix = path.suffix.lower()
        backend = {".onnx": ONNX, ".xml": OPENVINO}.get(suffix, LLAMACPP)
        return EmbeddingsChoice(backend, "file format")
    if declared in EMBEDDINGS_BACKENDS:
        return EmbeddingsChoice(declared, "catalog")
    missing = missing_for_onnx()
    if not missing:
        return EmbeddingsChoice(ONNX, f"{AUTO}: the fastest installed")
    return EmbeddingsChoice(LLAMACPP, f"{AUTO}: {missing}")


def listed_backend(declared: str, path: Path | None) -> str:
    """The backend `localserve list` shows for an embeddings model: the one
    it would load on here, `auto: onnx` when `auto` chose it."""
    choice = choose_embeddings_backend(path, declared)
    return f"{AUTO}: {choice.backend}" if choice.auto else choice.backend


def open_embeddings(model_id: str, path: Path, settings: ServerSettings) -> tuple[OneShotBackend, Path]:  # type: ignore[type-arg]
    """The backend and what it loaded (blocking: converts on first use)."""
    from localserve.models.catalog import catalog_backend

    choice = choose_embeddings_backend(path, catalog_backend(model_id))
    if settings.pooling:  # only llama.cpp pools as asked (the graphs pool inside)
        if choice.reason == "file format" and choice.backend != LLAMACPP:
            raise InvalidRequestError(
                f"model {model_id!r} is an {choice.backend} graph, which pools inside the graph: "
                f"--pooling {settings.pooling} needs its GGUF or sentence-transformers folder"
            )
        choice = EmbeddingsChoice(LLAMACPP, f"--pooling {settings.pooling}")
    log.info("%s: embeddings on %s (%s)", model_id, choice.backend, choice.reason)
    if choice.backend == OPENVINO:
        return _open_openvino(model_id, path, settings)
    if choice.backend == ONNX:
        try:
            return _open_onnx(model_id, path, settings)
        except (ImportError, DeviceNotFoundError) as exc:
            if not choice.auto:
                if isinstance(exc, DeviceNotFoundError):
                    raise
                raise LocalServeError(
                    f"model {model_id!r} runs on ONNX Runtime, which is not installed here ({exc}): "
                    f"install it with `{onnx_install_hint()}`, or serve the GGUF variant on llama.cpp"
                ) from exc
            log.warning("%s: ONNX Runtime cannot serve it (%s); using llama.cpp", model_id, exc)
    return _open_llamacpp(model_id, path, settings)


def onnx_install_hint() -> str:
    """How to install ONNX Runtime embeddings: the `onnx` extra (the extra the
    backend registry names for it, models/builtin_backends.py; not imported
    from there, which imports this module)."""
    return "pip install 'localserve[onnx]'"


def _open_onnx(model_id: str, path: Path, settings: ServerSettings) -> tuple[OneShotBackend, Path]:  # type: ignore[type-arg]
    from localserve.backends.onnx.embeddings import OnnxEmbeddingBackend, OnnxEmbeddingConfig

    missing = missing_for_onnx(path)
    if missing:  # before a conversion that would need `onnx`
        raise ModuleNotFoundError(missing)
    if path.is_dir():
        from localserve.models.convert.bert_onnx import cached_onnx
        from localserve.models.convert.cache import log_progress

        variant = onnx_variant(model_id, settings.device or "auto")
        path = cached_onnx(path, model_id, variant=variant, progress=log_progress(model_id, f"ONNX ({variant})"))
    config = OnnxEmbeddingConfig(str(path), device=settings.device or "auto", n_threads=settings.cpu_threads)
    return OnnxEmbeddingBackend(config), path


def onnx_variant(model_id: str, device: str) -> str:
    """The graph an ONNX Runtime embeddings id runs: its catalog variant, else
    `fused`. The int8 graph was chosen for `auto` ids by measurement on CPU
    only; where ONNX Runtime would run on a GPU provider, an `auto` id takes
    float32 `fused` (an id that names int8 keeps it)."""
    from localserve.models.catalog import catalog_backend, catalog_variant

    variant = catalog_variant(model_id) or "fused"
    if variant == "int8" and catalog_backend(model_id) == "auto":
        import onnxruntime as ort

        from localserve.backends.onnx.providers import CPU_PROVIDER, session_providers

        if session_providers(device, ort.get_available_providers())[0] != CPU_PROVIDER:
            return "fused"
    return variant


def _open_llamacpp(model_id: str, path: Path, settings: ServerSettings) -> tuple[OneShotBackend, Path]:  # type: ignore[type-arg]
    from localserve.backends.llamacpp.embeddings import LlamaEmbeddingBackend, LlamaEmbeddingConfig

    if path.is_dir():
        from localserve.models.convert.cache import cached_gguf, log_progress

        path = cached_gguf(path, model_id, progress=log_progress(model_id))
    config = LlamaEmbeddingConfig(
        str(path), n_threads=settings.cpu_threads, device=settings.device or "auto", pooling=settings.pooling or "model"
    )
    return LlamaEmbeddingBackend(config), path


def _open_openvino(model_id: str, path: Path, settings: ServerSettings) -> tuple[OneShotBackend, Path]:  # type: ignore[type-arg]
    """OpenVINO embeddings (a folder is converted to IR on first use, without torch)."""
    from localserve.backends.openvino.embeddings import OpenVinoEmbeddingBackend, OpenVinoEmbeddingConfig

    if path.is_dir():
        from localserve.models.convert.bert_openvino import cached_openvino_embeddings

        path = cached_openvino_embeddings(path, model_id)
    config = OpenVinoEmbeddingConfig(str(path), device=settings.device or "auto", n_threads=settings.cpu_threads)
    return OpenVinoEmbeddingBackend(config), path


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
