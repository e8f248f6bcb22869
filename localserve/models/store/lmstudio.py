"""Models LM Studio downloaded, read in place (never written).

LM Studio keeps GGUF files at `~/.lmstudio/models/PUBLISHER/REPO/*.gguf`
(`$LOCALSERVE_LMSTUDIO_MODELS` points elsewhere, for a folder moved in LM
Studio's settings). Its repositories mirror the Hugging Face Hub's, so its
models are named as there: `publisher/repo:QUANT`, `publisher/repo` for the
default quantization.
"""

from __future__ import annotations

import os
from pathlib import Path

from localserve.models.names import gguf_models, pick_gguf, split_tag
from localserve.models.store.hf_cache import gguf_model
from localserve.models.store.local import LMSTUDIO, LocalModel

ENV = "LOCALSERVE_LMSTUDIO_MODELS"


def models_dir() -> Path:
    explicit = os.environ.get(ENV, "").strip()
    return Path(explicit).expanduser() if explicit else Path.home() / ".lmstudio" / "models"


def _repo_files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.gguf") if p.is_file())


def find(name: str) -> LocalModel | None:
    repo_id, tag = split_tag(name)
    if repo_id.count("/") != 1:
        return None
    folder = models_dir() / repo_id
    if not folder.is_dir():
        return None
    chosen = pick_gguf(gguf_models(_repo_files(folder)), tag)
    return gguf_model(repo_id, folder, chosen, LMSTUDIO) if chosen is not None else None


def list_models() -> list[LocalModel]:
    root = models_dir()
    if not root.is_dir():
        return []
    found = []
    for folder in sorted(p for p in root.glob("*/*") if p.is_dir()):
        repo_id = folder.relative_to(root).as_posix()
        found += [gguf_model(repo_id, folder, g, LMSTUDIO) for g in gguf_models(_repo_files(folder))]
    return found
