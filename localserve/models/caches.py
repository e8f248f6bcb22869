"""What localserve keeps on disk besides the user's models, and pruning it
(`localserve cache`, `localserve cache prune`).

* conversions - `<model store>/<name>/<name>-<key>-<format>`: a file converted
  once (GGUF, ONNX, OpenVINO IR, whisper.cpp), keyed by its source's weights
  and the converter; a new key for the same name and format supersedes the
  older ones (the source changed, or the converter did);
* exports - the same layout, a folder per export (`localserve export`),
  complete once it holds `.complete`;
* partial - a conversion or export that stopped half-way (its temporary
  `.<name>...` file or folder): removed by `prune` once it is an hour old;
* prefix - the prefix cache's files, a folder per model (engine/step/prefix_disk.py);
* wheels - llama.cpp wheels built and checked for this machine (`make install`);
* pulls - models pulled into the Hugging Face cache. That cache is shared with
  other tools: it is listed, never pruned here (`localserve rm` removes a model).

A conversion that succeeds removes what it superseded at once
(`remove_superseded`); `prune` does the same for everything, removes
partial leftovers, and with `older_than_s` anything of localserve's own not
used for that long.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from localserve.config import data_home
from localserve.models.convert.supersede import KEYED, children, remove, remove_superseded
from localserve.models.store import hf_cache

__all__ = ["CacheEntry", "CacheReport", "cache_roots", "prunable", "prune", "remove_superseded", "survey"]

KINDS = ("conversions", "exports", "partial", "prefix", "wheels", "pulls")
PRUNABLE_WHEN_OLD = frozenset({"conversions", "exports", "prefix", "wheels"})
PARTIAL_AGE_S = 3600.0  # a temporary file younger than this may belong to a conversion running now
_EXPORT_SUFFIX = re.compile(r"^(onnx|openvino)-fp(32|16)$")


@dataclass(slots=True)
class CacheEntry:
    """One file or folder of a cache."""

    kind: str
    path: Path
    num_bytes: int
    mtime: float  # last written or used
    group: str = ""  # name and format: entries of one group supersede each other
    superseded: bool = False


@dataclass(slots=True)
class CacheReport:
    """Every cache's entries, and where each cache lives."""

    roots: dict[str, Path]
    entries: list[CacheEntry] = field(default_factory=list)

    def of(self, kind: str) -> list[CacheEntry]:
        return [e for e in self.entries if e.kind == kind]


def model_store() -> Path:
    from localserve.models.convert.cache import model_store as store

    return store()


def cache_roots() -> dict[str, Path]:
    store = model_store()
    return {
        "conversions": store,
        "exports": store,
        "partial": store,
        "prefix": data_home() / "prefix-cache",
        "wheels": Path.home() / ".cache" / "localserve" / "wheels",  # scripts/llama_wheel.py's wheelhouse
        "pulls": hf_cache.hub_cache_dir(),
    }


def survey(roots: dict[str, Path] | None = None) -> CacheReport:
    """What every cache holds now."""
    roots = roots or cache_roots()
    report = CacheReport(roots)
    report.entries += _store_entries(roots["conversions"])
    report.entries += [_entry("prefix", p) for p in children(roots["prefix"]) if p.is_dir()]
    report.entries += [_entry("wheels", p) for p in children(roots["wheels"]) if not p.name.startswith(".")]
    report.entries += [_entry("pulls", p) for p in children(roots["pulls"]) if p.name.startswith("models--")]
    return report


def prunable(report: CacheReport, *, older_than_s: float | None = None, now: float | None = None) -> list[CacheEntry]:
    """Superseded conversions and exports, partial leftovers older than an
    hour, and (with `older_than_s`) whatever of localserve's own was not used
    for that long."""
    now = time.time() if now is None else now
    doomed = []
    for entry in report.entries:
        old = older_than_s is not None and entry.kind in PRUNABLE_WHEN_OLD and now - entry.mtime > older_than_s
        partial_old = entry.kind == "partial" and now - entry.mtime > PARTIAL_AGE_S
        if entry.superseded or old or partial_old:
            doomed.append(entry)
    return doomed


def prune(report: CacheReport, *, older_than_s: float | None = None, now: float | None = None) -> list[CacheEntry]:
    """Remove what `prunable` names; the entries removed."""
    return [entry for entry in prunable(report, older_than_s=older_than_s, now=now) if remove(entry.path)]


# ---- the model store ------------------------------------------------------------------------


def _store_entries(store: Path) -> list[CacheEntry]:
    entries = []
    for folder in children(store):
        if not folder.is_dir():
            continue
        for child in children(folder):
            entries.append(_classify(folder.name, child))
    groups: dict[str, list[CacheEntry]] = {}
    for entry in entries:
        if entry.group:
            groups.setdefault(entry.group, []).append(entry)
    for members in groups.values():
        for older in sorted(members, key=lambda e: e.mtime, reverse=True)[1:]:
            older.superseded = True
    return entries


def _classify(folder: str, path: Path) -> CacheEntry:
    if path.name.startswith("."):
        return _entry("partial", path)
    match = KEYED.match(path.name)
    if match is None or match["folder"] != folder:
        return _entry("conversions", path)  # ours by place, not by name: listed, never superseded
    export = path.is_dir() and (_EXPORT_SUFFIX.match(match["suffix"]) or (path / ".complete").exists())
    if export and not (path / ".complete").exists():
        return _entry("partial", path)
    entry = _entry("exports" if export else "conversions", path)
    entry.group = f"{folder}/{match['suffix']}"
    return entry


# ---- files --------------------------------------------------------------------------------


def _entry(kind: str, path: Path) -> CacheEntry:
    num_bytes, mtime = _size_and_mtime(path)
    return CacheEntry(kind, path, num_bytes, mtime)


def _size_and_mtime(path: Path) -> tuple[int, float]:
    """Bytes of the files (links followed, each file counted once) and the
    newest mtime of the files and folders (what was written or used last)."""
    seen: set[tuple[int, int]] = set()
    total, newest = 0, 0.0
    for item, is_file in _walk(path):
        try:
            st = item.stat()
        except OSError:
            continue
        newest = max(newest, st.st_mtime)
        if is_file and (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_size
    return total, newest


def _walk(path: Path) -> Iterator[tuple[Path, bool]]:
    """`path` and everything under it, each with whether it is a file."""
    if not path.is_dir() or path.is_symlink():
        yield path, True
        return
    for root, _folders, files in os.walk(path):
        yield Path(root), False
        yield from ((Path(root) / name, True) for name in files)


def total_bytes(entries: Iterable[CacheEntry]) -> int:
    return sum(e.num_bytes for e in entries)
