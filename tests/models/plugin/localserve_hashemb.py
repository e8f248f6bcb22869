"""A localserve embeddings backend in its own package: feature hashing of
words (the "hashing trick"), for `*.hashemb` model files that hold
`{"dim": N}`. Small, deterministic and real: equal texts give equal vectors,
texts sharing words are closer than texts that share none."""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from localserve.engine.backend import BackendInfo, OneShotBackend
from localserve.errors import InvalidRequestError
from localserve.models.backend_registry import EMBEDDINGS, BackendContext, BackendSpec

MAX_TOKENS = 512


class HashingEmbeddings(OneShotBackend[tuple[int, ...], np.ndarray]):
    def __init__(self, path: Path) -> None:
        self.path = path
        self.n_embd = int(json.loads(path.read_text())["dim"])

    def tokenize(self, text: str) -> tuple[int, ...]:
        return tuple(zlib.crc32(word.encode()) for word in text.lower().split())

    def check(self, token_ids: Sequence[int], param: str) -> tuple[int, ...]:
        if not token_ids or len(token_ids) > MAX_TOKENS:
            raise InvalidRequestError(f"'{param}' needs 1 to {MAX_TOKENS} words", param=param)
        return tuple(int(t) for t in token_ids)

    def item_size(self, item: tuple[int, ...]) -> int:
        return len(item)

    def run(self, items: Sequence[tuple[int, ...]]) -> list[np.ndarray]:
        out = []
        for item in items:
            vector = np.zeros(self.n_embd, dtype=np.float32)
            for token in item:
                digest = hashlib.sha256(token.to_bytes(8, "little")).digest()
                vector[int.from_bytes(digest[:4], "little") % self.n_embd] += 1.0 if digest[4] & 1 else -1.0
            out.append(vector / max(float(np.linalg.norm(vector)), 1e-9))
        return out

    def info(self) -> BackendInfo:
        return BackendInfo("hashemb", "CPU", str(self.path), "feature hashing")


def _detect(path: Path) -> bool:
    return path.is_file() and path.suffix == ".hashemb"


def _open(path: Path, ctx: BackendContext) -> HashingEmbeddings:
    return HashingEmbeddings(path)


def backends() -> list[BackendSpec]:
    return [BackendSpec("hashemb", EMBEDDINGS, _open, _detect, ("numpy",))]
