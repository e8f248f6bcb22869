"""What a GGUF file is, read from its header without loading it."""

from __future__ import annotations

import struct
from pathlib import Path

#: llama.cpp architectures that only make embeddings.
EMBEDDING_ARCHS = frozenset(
    {"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3", "modern-bert", "neo-bert"}
)


def gguf_architecture(path: Path) -> str | None:
    """`general.architecture` of a GGUF, read from its first key (where every
    GGUF writer puts it) without loading the file."""
    try:
        with path.open("rb") as f:
            magic, _version, _n_tensors, n_kv = struct.unpack("<4sIQQ", f.read(24))
            if magic != b"GGUF" or n_kv == 0:
                return None
            (key_len,) = struct.unpack("<Q", f.read(8))
            if key_len != len(b"general.architecture"):  # also: never read a damaged file's huge length
                return None
            key = f.read(key_len)
            (value_type,) = struct.unpack("<I", f.read(4))
            if key != b"general.architecture" or value_type != 8:  # 8: string
                return None
            (value_len,) = struct.unpack("<Q", f.read(8))
            return f.read(min(value_len, 128)).decode("utf-8", errors="replace")
    except (OSError, struct.error):
        return None
