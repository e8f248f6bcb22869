"""What a conversion cache keys a source file by: its content, not where it
sits. A model package installed again (a new venv, a clean clone, a
reinstall) has new paths and mtimes but the same bytes, and converting it
again cost up to a minute and a half (SmolLM2 to ONNX and OpenVINO).

Hashing a whole multi-gigabyte GGUF on every lookup would cost seconds, so
a file is named by its name, its size and a SHA-256 of its first and last
8 MiB (the whole file when smaller): a GGUF's header (architecture, names,
tensor layout) and its first and last tensors. Two different models of the
same name and size that agree there are not a case this cache guards."""

from __future__ import annotations

import hashlib
from pathlib import Path

EDGE = 8 << 20  # bytes hashed at each end


def content_fingerprint(path: Path) -> str:
    """`name|size|sha256` of `path` (see the module docstring)."""
    size = path.stat().st_size
    digest = hashlib.sha256()
    with path.open("rb") as file:
        if size <= 2 * EDGE:
            digest.update(file.read())
        else:
            digest.update(file.read(EDGE))
            file.seek(size - EDGE)
            digest.update(file.read(EDGE))
    return f"{path.name}|{size}|{digest.hexdigest()}"
