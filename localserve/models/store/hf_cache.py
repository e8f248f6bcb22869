"""Models in the Hugging Face cache, the folder every Hugging Face tool shares.

The cache is `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
`$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub` (read at
each call, as huggingface_hub reads them at import). A repository lives in
`models--ORG--REPO/`: `refs/main` holds the commit, `snapshots/COMMIT/`
symlinks each file to `blobs/ETAG`. Nothing here writes to the cache.

A GGUF repository gives one model per quantization, named `org/repo:QUANT`
(a split model by its first part); `org/repo` alone picks Q4_K_M, else the
first file (as llama-server's `-hf` does). Any other repository whose
snapshot a backend recognises (a Whisper or sentence-transformers folder,
an ONNX or OpenVINO export) is one model, `org/repo`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from localserve.models.names import GgufFile, gguf_models, pick_gguf, split_tag
from localserve.models.store.local import HUGGINGFACE, LocalModel, folder_files

_COMMIT = re.compile(r"[0-9a-f]{40}")


def hub_cache_dir() -> Path:
    """Where huggingface_hub keeps downloads, from the environment now."""
    explicit = os.environ.get("HF_HUB_CACHE", "").strip() or os.environ.get("HUGGINGFACE_HUB_CACHE", "").strip()
    if explicit:
        return Path(explicit).expanduser()
    home = os.environ.get("HF_HOME", "").strip()
    if home:
        return Path(home).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "huggingface" / "hub"


def repo_folder(repo_id: str, cache: Path | None = None) -> Path:
    return (cache or hub_cache_dir()) / ("models--" + repo_id.replace("/", "--"))


def snapshot_dir(repo_id: str, revision: str = "main", cache: Path | None = None) -> Path | None:
    """The snapshot of `revision` (a ref, else a commit); for `main` without a
    ref (a cache copied by hand), the newest snapshot."""
    folder = repo_folder(repo_id, cache)
    snapshots = folder / "snapshots"
    commit = revision if _COMMIT.fullmatch(revision) else _read_ref(folder, revision)
    if commit and (snapshots / commit).is_dir():
        return snapshots / commit
    if revision == "main" and snapshots.is_dir():
        newest = max(snapshots.iterdir(), key=lambda p: p.stat().st_mtime, default=None)
        return newest if newest is not None and newest.is_dir() else None
    return None


def _read_ref(folder: Path, revision: str) -> str:
    ref = folder / "refs" / revision
    try:
        text = ref.read_text(encoding="utf-8").strip()
    except OSError:
        return ""
    return text if _COMMIT.fullmatch(text) and ref.resolve().is_relative_to(folder.resolve()) else ""


def cached_file(repo_id: str, file_name: str, revision: str = "main") -> Path | None:
    """A complete file of the repository in the cache (its snapshot symlink), or None."""
    snapshot = snapshot_dir(repo_id, revision)
    if snapshot is None:
        return None
    path = snapshot / file_name
    return path if path.is_file() and path.resolve().is_relative_to(repo_folder(repo_id).resolve()) else None


def snapshot_files(snapshot: Path) -> list[str]:
    """Relative names of the files present in a snapshot (dangling links left out)."""
    return [p.relative_to(snapshot).as_posix() for p in folder_files(snapshot)]


def cached_repo_ids(cache: Path | None = None) -> list[str]:
    """Every model repository in the cache, as `org/repo`."""
    root = cache or hub_cache_dir()
    if not root.is_dir():
        return []
    ids = []
    for folder in sorted(root.iterdir()):
        parts = folder.name.split("--")
        if parts[0] == "models" and len(parts) == 3 and folder.is_dir():
            ids.append(f"{parts[1]}/{parts[2]}")
    return ids


def repo_models(repo_id: str) -> list[LocalModel]:
    """The servable models of one cached repository."""
    snapshot = snapshot_dir(repo_id)
    if snapshot is None:
        return []
    files = snapshot_files(snapshot)
    ggufs = gguf_models(files)
    if ggufs:
        return [gguf_model(repo_id, snapshot, g, HUGGINGFACE) for g in ggufs]
    from localserve.models.backend_registry import detect

    if files and detect(snapshot) is not None:
        return [LocalModel(repo_id, snapshot, HUGGINGFACE, tuple(snapshot / f for f in files))]
    return []


def gguf_model(repo_id: str, folder: Path, gguf: GgufFile, source: str) -> LocalModel:
    """`repo_id:TAG` for one GGUF model of a repository folder."""
    return LocalModel(f"{repo_id}:{gguf.tag}", folder / gguf.name, source, tuple(folder / p for p in gguf.parts))


def list_models() -> list[LocalModel]:
    """Every servable model in the cache."""
    return [model for repo_id in cached_repo_ids() for model in repo_models(repo_id)]


def find(name: str) -> LocalModel | None:
    """`org/repo` or `org/repo:QUANT` in the cache, or None."""
    repo_id, tag = split_tag(name)
    if repo_id.count("/") != 1 or not repo_folder(repo_id).is_dir():
        return None
    snapshot = snapshot_dir(repo_id)
    if snapshot is None:
        return None
    chosen = pick_gguf(gguf_models(snapshot_files(snapshot)), tag)
    if chosen is not None:
        return gguf_model(repo_id, snapshot, chosen, HUGGINGFACE)
    models = repo_models(repo_id)
    return models[0] if not tag and len(models) == 1 and models[0].name == repo_id else None
