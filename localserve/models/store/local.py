"""A model found on this machine: where it is, what it is, who put it there."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

HUGGINGFACE, OLLAMA, LMSTUDIO, CATALOG, PATH = "huggingface", "ollama", "lmstudio", "catalog", "path"


@dataclass(frozen=True, slots=True)
class LocalModel:
    """A servable model in another tool's folder (read in place, never changed)."""

    name: str  # as that tool names it: org/repo:Q4_K_M, llama3.2:latest
    path: Path  # what a backend loads: a file (part 1 of a split GGUF) or a folder
    source: str  # HUGGINGFACE, OLLAMA or LMSTUDIO
    files: tuple[Path, ...]  # every file of the model (for its size)

    @property
    def size_bytes(self) -> int:
        return disk_size(self.files)


def disk_size(paths: tuple[Path, ...] | list[Path]) -> int:
    """Bytes of the files (symlinks followed; missing ones count 0)."""
    total = 0
    for path in paths:
        try:
            total += path.stat().st_size
        except OSError:
            continue
    return total


def folder_files(folder: Path) -> list[Path]:
    """Every file under `folder` (symlinks followed; dangling ones left out)."""
    return sorted(p for p in folder.rglob("*") if p.is_file())
