"""Loaded models as Ollama describes them (`/api/tags`, `/api/ps`,
`/api/show`), and Ollama model names resolved to loaded models.

Names are the server's model ids; `NAME:latest` is accepted for `NAME`, as
Ollama's clients add the tag. The chat models and the embeddings models are
listed; speech models have no place in Ollama's API. `digest` is a hash of
the model file's path, size and modification time, not of its content
(hashing gigabytes on every listing would be slow).
"""

from __future__ import annotations

import datetime
import hashlib
import re
from pathlib import Path
from typing import Any

from aiohttp import web

from localserve.api.infill_prompt import fim_tokens
from localserve.api.state import MANAGER, STATE
from localserve.backends.base import BackendInfo
from localserve.errors import ModelLoadingError, ModelNotFoundError
from localserve.models.oneshot import EMBEDDINGS

GENERATE = "generate"


def resolve_model(request: web.Request, name: str) -> tuple[str, str]:
    """(model id, kind: "generate" or "embeddings") of an Ollama model name;
    404 as Ollama words it, 503 while it may still be loading."""
    manager = request.app[MANAGER]
    for candidate in dict.fromkeys((name, name.removesuffix(":latest"))):
        if candidate in manager.loaded:
            return candidate, GENERATE
        oneshot = manager.oneshot.get(candidate)
        if oneshot is not None and oneshot.kind == EMBEDDINGS:
            return candidate, EMBEDDINGS
        if candidate in manager.loading or request.app[STATE].loading:
            raise ModelLoadingError(f'model "{name}" is not ready yet: models are still loading; retry in a moment')
    raise ModelNotFoundError(f'model "{name}" not found, try pulling it first', param="model")


def listed_models(request: web.Request) -> list[tuple[str, str, Path, BackendInfo]]:
    """(id, kind, path, info) of every model Ollama's API shows."""
    manager = request.app[MANAGER]
    out = [(model_id, GENERATE, m.spec.path, m.backend.info()) for model_id, m in list(manager.loaded.items())]
    out += [
        (model_id, EMBEDDINGS, m.spec.path, m.backend.info())
        for model_id, m in list(manager.oneshot.items())
        if m.kind == EMBEDDINGS
    ]
    return out


def details(info: BackendInfo) -> dict[str, Any]:
    """Ollama's `details` from llama.cpp's model description ("llama 135M Q4_1")."""
    parts = info.architecture.split(" ", 2)
    family = parts[0] if parts and parts[0] else info.backend
    quantization = re.sub(r" - (\w)\w*", r"_\1", parts[2]) if len(parts) == 3 else ""
    return {
        "parent_model": "",
        "format": "gguf" if info.backend == "llamacpp" else info.backend,
        "family": family,
        "families": [family],
        "parameter_size": _parameter_size(info.num_params),
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


def model_entry(model_id: str, path: Path, info: BackendInfo) -> dict[str, Any]:
    """One model of `/api/tags`."""
    size, digest, modified = file_facts(path)
    return {"name": model_id, "model": model_id, "modified_at": modified, "size": size, "digest": digest, "details": details(info)}


def capabilities(request: web.Request, model_id: str, kind: str) -> list[str]:
    """What Ollama's `/api/show` lists: completion and tools for chat models
    (tools work with any model here), insert with FIM tokens, embedding."""
    if kind == EMBEDDINGS:
        return ["embedding"]
    found = ["completion", "tools"]
    if fim_tokens(request.app[MANAGER].engine.tokenizer(model_id)) is not None:
        found.append("insert")
    return found
