"""Model folders laid out exactly as the real tools lay them out, built from
one GGUF (hard links, else symlinks: the 98 MB SmolLM2 file is never copied).

* `hf_cache(root, repo, files)` - huggingface_hub's cache: `models--ORG--REPO/`
  with `refs/main` (the commit), `blobs/SHA256` and `snapshots/COMMIT/NAME`
  symlinks to `../../blobs/SHA256`, as `hf_hub_download` writes them.
* `ollama_store(root, name, tag, gguf)` - Ollama's: `manifests/registry.ollama.ai/
  library/NAME/TAG` (a Docker v2 manifest whose `application/vnd.ollama.image.model`
  layer names the weights), `blobs/sha256-HEX` (the GGUF), and the template and
  params layers Ollama writes beside it.
* `lmstudio_folder(root, publisher, repo, gguf, name)` - LM Studio's `PUBLISHER/REPO/FILE.gguf`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

COMMIT = "a5f0e2d8c1b3947e6f2a0b1c9d8e7f6a5b4c3d2e"


@functools.cache
def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def link(source: Path, target: Path) -> Path:
    """`target` as a hard link to `source` (same bytes, no copy), else a symlink."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        target.symlink_to(source)
    return target


def hf_cache(root: Path, repo: str, files: dict[str, Path], commit: str = COMMIT) -> Path:
    """`files` (name in the repo -> content) cached as huggingface_hub caches them; the snapshot folder."""
    folder = root / ("models--" + repo.replace("/", "--"))
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(commit)
    snapshot = folder / "snapshots" / commit
    for name, source in files.items():
        blob = folder / "blobs" / sha256_of(source)
        if not blob.exists():
            link(source, blob)
        target = snapshot / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(os.path.relpath(blob, target.parent))
    return snapshot


def _blob(root: Path, data_or_path: bytes | Path) -> dict[str, object]:
    if isinstance(data_or_path, Path):
        digest, size = sha256_of(data_or_path), data_or_path.stat().st_size
        blob = root / "blobs" / f"sha256-{digest}"
        if not blob.exists():
            link(data_or_path, blob)
    else:
        digest, size = hashlib.sha256(data_or_path).hexdigest(), len(data_or_path)
        blob = root / "blobs" / f"sha256-{digest}"
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data_or_path)
    return {"digest": f"sha256:{digest}", "size": size}


def ollama_store(root: Path, name: str, tag: str, gguf: Path, namespace: str = "library") -> Path:
    """One model in Ollama's store; its manifest."""
    layers = [
        {"mediaType": "application/vnd.ollama.image.model", **_blob(root, gguf)},
        {"mediaType": "application/vnd.ollama.image.template", **_blob(root, b"{{ .Prompt }}")},
        {"mediaType": "application/vnd.ollama.image.params", **_blob(root, b'{"stop": ["<|im_end|>"]}')},
    ]
    config = _blob(root, json.dumps({"model_format": "gguf", "model_family": "llama"}).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", **config},
        "layers": layers,
    }
    path = root / "manifests" / "registry.ollama.ai" / namespace / name / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return path


def lmstudio_folder(root: Path, publisher: str, repo: str, gguf: Path, name: str) -> Path:
    return link(gguf, root / publisher / repo / name)


def snapshot_of_tree(root: Path) -> dict[str, tuple[int, int, str]]:
    """(size, mtime_ns, link target) of every path under `root`: to show nothing was changed."""
    out = {}
    for path in sorted(root.rglob("*")):
        stat = path.lstat()
        out[str(path.relative_to(root))] = (
            stat.st_size,
            stat.st_mtime_ns,
            os.readlink(path) if path.is_symlink() else "",
        )
    return out
