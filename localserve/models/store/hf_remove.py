"""Delete a pulled model's files from the Hugging Face cache.

Only what `localserve pull` (or another Hugging Face tool) put in the cache
is deleted: the model's snapshot links and the blobs no other snapshot
links to; a repository left without files goes whole. Models in Ollama's
store, LM Studio's folder or a PyPI package belong to those tools: asking
to delete one is a 400 that names the tool's own command.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from localserve.errors import InvalidRequestError, ModelNotFoundError
from localserve.models.catalog import hub_files, load_catalog
from localserve.models.store import hf_cache
from localserve.models.store.discovery import find
from localserve.models.store.local import LMSTUDIO, OLLAMA
from localserve.models.store.sources import locate_entry


def remove(name: str) -> int:
    """Delete model `name` from the Hugging Face cache; the bytes freed."""
    found = find(name)
    if found is None:
        raise ModelNotFoundError(f"model {name!r} not found", param="model")
    if found.source == OLLAMA:
        raise InvalidRequestError(
            f"model {name!r} is in Ollama's store: remove it with `ollama rm {name}`", param="model"
        )
    if found.source == LMSTUDIO:
        raise InvalidRequestError(
            f"model {name!r} is in LM Studio's folder ({found.path}): remove it in LM Studio", param="model"
        )
    if found.source != hf_cache.HUGGINGFACE:
        raise InvalidRequestError(
            f"model {name!r} is not in the Hugging Face cache (it comes from {found.source}: {found.path}); "
            "nothing to delete here",
            param="model",
        )
    entry = load_catalog().get(found.name)
    if entry is not None and (hub := entry.hub_source()) is not None:
        path, _ = locate_entry(entry)
        snapshot = path if path.is_dir() else path.parent
        files = [snapshot / f for f in hub_files(hub)]
        repo = hub.repo
    else:
        local = hf_cache.find(found.name)
        if local is None:
            raise ModelNotFoundError(f"model {name!r} not found in {hf_cache.hub_cache_dir()}", param="model")
        files, repo = list(local.files), found.name.split(":")[0]
    return delete_links(hf_cache.repo_folder(repo), files)


def delete_links(repo_folder: Path, links: list[Path]) -> int:
    """Delete snapshot links and the blobs no other link uses; the repository
    folder too once no file is left in it. The bytes freed."""
    blobs = {Path(os.path.realpath(link)) for link in links}
    for link in links:
        link.unlink(missing_ok=True)
    still_linked = {Path(os.path.realpath(p)) for p in (repo_folder / "snapshots").rglob("*") if p.is_symlink()}
    freed = 0
    for blob in blobs - still_linked:
        if blob.is_file() and blob.is_relative_to(repo_folder.resolve()):
            freed += blob.stat().st_size
            blob.unlink()
    for folder in sorted((repo_folder / "snapshots").rglob("*"), reverse=True):
        if folder.is_dir():
            with contextlib.suppress(OSError):
                folder.rmdir()
    if not any(p.is_file() for p in (repo_folder / "snapshots").rglob("*")):
        shutil.rmtree(repo_folder, ignore_errors=True)
    return freed
