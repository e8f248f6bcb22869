"""Models Ollama downloaded, read in place (never written).

The store is `$OLLAMA_MODELS`, else `~/.ollama/models`. Each model is a JSON
manifest at `manifests/REGISTRY/NAMESPACE/NAME/TAG` whose layer of media type
`application/vnd.ollama.image.model` names its weights, a plain GGUF at
`blobs/sha256-HEX`. Names as Ollama shows them: `NAME:TAG` for the default
registry's `library` namespace, `NAMESPACE/NAME:TAG` for another namespace,
`REGISTRY/NAMESPACE/NAME:TAG` (e.g. `hf.co/org/repo:Q4_K_M`) for another
registry; `NAME` alone means `NAME:latest`.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from localserve.models.store.local import OLLAMA, LocalModel

DEFAULT_REGISTRY, DEFAULT_NAMESPACE, DEFAULT_TAG = "registry.ollama.ai", "library", "latest"
MODEL_LAYER = "application/vnd.ollama.image.model"
_DIGEST = re.compile(r"sha256[:-]([0-9a-f]{64})")
MAX_MANIFEST_BYTES = 1 << 20


def store_dir() -> Path:
    explicit = os.environ.get("OLLAMA_MODELS", "").strip()
    return Path(explicit).expanduser() if explicit else Path.home() / ".ollama" / "models"


def display_name(registry: str, namespace: str, name: str, tag: str) -> str:
    if registry == DEFAULT_REGISTRY:
        return f"{name}:{tag}" if namespace == DEFAULT_NAMESPACE else f"{namespace}/{name}:{tag}"
    return f"{registry}/{namespace}/{name}:{tag}"


def manifest_path(name: str, root: Path | None = None) -> Path | None:
    """Where the manifest of an Ollama name would be (None: not an Ollama-shaped name)."""
    base, _, tag = name.partition(":")
    parts = base.split("/")
    if len(parts) == 1:
        parts = [DEFAULT_REGISTRY, DEFAULT_NAMESPACE, *parts]
    elif len(parts) == 2:
        parts = [DEFAULT_REGISTRY, *parts]
    if len(parts) != 3:
        return None
    return (root or store_dir()) / "manifests" / Path(*parts) / (tag or DEFAULT_TAG)


def read_model(manifest: Path, root: Path, name: str) -> LocalModel | None:
    """The model a manifest describes, if its weights blob is present."""
    try:
        if manifest.stat().st_size > MAX_MANIFEST_BYTES:
            return None
        data = json.loads(manifest.read_text(encoding="utf-8"))
        layers = data.get("layers", []) if isinstance(data, dict) else []
        digest = next(str(layer.get("digest", "")) for layer in layers if layer.get("mediaType") == MODEL_LAYER)
    except (OSError, ValueError, StopIteration, AttributeError):
        return None
    match = _DIGEST.fullmatch(digest)
    if match is None:
        return None
    blob = root / "blobs" / f"sha256-{match[1]}"
    return LocalModel(name, blob, OLLAMA, (blob,)) if blob.is_file() else None


def find(name: str) -> LocalModel | None:
    """An Ollama name (`llama3.2`, `llama3.2:1b`, `user/m:tag`, `hf.co/o/r:Q4_K_M`), or None."""
    root = store_dir()
    path = manifest_path(name, root)
    if path is None or not path.is_file():
        return None
    base, _, tag = name.partition(":")
    registry, namespace, model, tag = (*path.relative_to(root / "manifests").parts[:3], tag or DEFAULT_TAG)
    return read_model(path, root, display_name(registry, namespace, model, tag))


def list_models() -> list[LocalModel]:
    root = store_dir()
    manifests = root / "manifests"
    if not manifests.is_dir():
        return []
    found = []
    for path in sorted(manifests.glob("*/*/*/*")):
        if path.is_file():
            registry, namespace, name, tag = path.relative_to(manifests).parts
            model = read_model(path, root, display_name(registry, namespace, name, tag))
            if model is not None:
                found.append(model)
    return found
