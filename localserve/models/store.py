"""The model store: models pulled from a hub, one folder per model id under
`$LOCALSERVE_HOME/models` (else the platform's user data directory).

A model counts as downloaded only once its manifest is written, after every
file was verified and moved into place; a `.partial` file is never served.
Every model id and file name is validated before it becomes a path: no path
traversal, no absolute paths, no NUL bytes, no Windows device names.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from localserve.errors import InvalidRequestError, ModelNotFoundError
from localserve.models.convert import model_store, write_atomically

MANIFEST = ".localserve-manifest.json"  # a leading dot: no valid model file name can collide
PARTIAL_SUFFIX = ".partial"

MAX_MODEL_ID_CHARS = 128
MAX_FILE_NAME_CHARS = 512
MAX_FILE_DEPTH = 8
_MODEL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")
_FILE_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]*")
_WINDOWS_DEVICES = frozenset(
    ["con", "prn", "aux", "nul"] + [f"com{i}" for i in range(10)] + [f"lpt{i}" for i in range(10)]
)


def validate_model_id(model_id: object, *, param: str = "model") -> str:
    """`model_id` if it is safe as a folder name; else a 400 that says why."""
    if (
        not isinstance(model_id, str)
        or len(model_id) > MAX_MODEL_ID_CHARS
        or not _MODEL_ID.fullmatch(model_id)
        or ".." in model_id
        or model_id.endswith(".")
        or model_id.split(".")[0].split(":")[0].lower() in _WINDOWS_DEVICES
    ):
        shown = model_id[:80] + "..." if isinstance(model_id, str) and len(model_id) > 80 else model_id
        raise InvalidRequestError(
            f"invalid model id {shown!r}: use at most {MAX_MODEL_ID_CHARS} letters, digits, '.', '_', ':' "
            "and '-', starting with a letter or digit (no path separators, no '..')",
            param=param,
        )
    return model_id


def is_model_id(text: str) -> bool:
    try:
        validate_model_id(text)
    except InvalidRequestError:
        return False
    return True


def validate_file_name(name: object, *, param: str = "file") -> str:
    """A relative POSIX path of plain segments (`model.gguf`, `1_Pooling/config.json`)."""
    parts = name.split("/") if isinstance(name, str) else []
    if (
        not isinstance(name, str)
        or not parts
        or len(name) > MAX_FILE_NAME_CHARS
        or len(parts) > MAX_FILE_DEPTH
        or any(not _FILE_PART.fullmatch(part) or ".." in part or part.endswith(".") for part in parts)
        or any(part.split(".")[0].lower() in _WINDOWS_DEVICES for part in parts)
        or name.endswith(PARTIAL_SUFFIX)
    ):
        raise InvalidRequestError(
            f"invalid model file name {name!r}: relative path of letters, digits, '.', '_', '+' and '-' "
            "(no '..', no absolute path, no backslash)",
            param=param,
        )
    return name


def _inside(path: Path, root: Path) -> Path:
    """`path` if it stays under `root` once symlinks and '..' are resolved."""
    if not path.resolve().is_relative_to(root.resolve()):
        raise InvalidRequestError(f"refusing a path outside the model store: {path}")
    return path


@dataclass(frozen=True, slots=True)
class StoredFile:
    name: str  # relative to the model's folder
    size: int
    sha256: str


@dataclass(frozen=True, slots=True)
class Manifest:
    """What a pull wrote: the files, their digests, where they came from."""

    model_id: str
    source: str  # e.g. "hf://owner/repo"
    revision: str
    files: tuple[StoredFile, ...]
    main: str = ""  # the file to load; "" = the folder itself
    labels: tuple[str, ...] = ()
    commit: str = ""
    pulled_at: float = field(default_factory=time.time)

    @property
    def size_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        data = json.loads(text)
        files = tuple(
            StoredFile(validate_file_name(f["name"]), int(f["size"]), str(f["sha256"])) for f in data["files"]
        )
        main = validate_file_name(data["main"]) if data.get("main") else ""
        return cls(
            model_id=validate_model_id(data["model_id"]),
            source=str(data["source"]),
            revision=str(data.get("revision", "")),
            files=files,
            main=main,
            labels=tuple(str(label) for label in data.get("labels", ())),
            commit=str(data.get("commit", "")),
            pulled_at=float(data.get("pulled_at", 0.0)),
        )


class ModelStore:
    """Pulled models on disk. Cheap to create: reads `LOCALSERVE_HOME` now."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root if root is not None else model_store()

    def model_dir(self, model_id: str) -> Path:
        # ':' (Ollama-style tags) is not allowed in Windows file names; '@' is not allowed in ids.
        return _inside(self.root / validate_model_id(model_id).replace(":", "@"), self.root)

    def file_path(self, model_id: str, name: str) -> Path:
        folder = self.model_dir(model_id)
        return _inside(folder / validate_file_name(name), folder)

    def manifest(self, model_id: str) -> Manifest | None:
        """The manifest of a complete download (every file present at its size), else None."""
        path = self.model_dir(model_id) / MANIFEST
        try:
            manifest = Manifest.from_json(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, KeyError, TypeError, InvalidRequestError):
            return None
        for stored in manifest.files:
            file = self.file_path(model_id, stored.name)
            if not file.is_file() or file.stat().st_size != stored.size:
                return None
        return manifest if manifest.model_id == model_id else None

    def model_path(self, model_id: str) -> Path | None:
        """What a backend loads (the main file, or the folder), if downloaded."""
        manifest = self.manifest(model_id)
        if manifest is None:
            return None
        return self.file_path(model_id, manifest.main) if manifest.main else self.model_dir(model_id)

    def write_manifest(self, manifest: Manifest) -> Path:
        def write(tmp: Path) -> None:
            tmp.write_text(manifest.to_json(), encoding="utf-8")

        return write_atomically(self.model_dir(manifest.model_id) / MANIFEST, write)

    def model_ids(self) -> list[str]:
        """Ids of every complete download."""
        if not self.root.is_dir():
            return []
        ids = []
        for folder in sorted(self.root.iterdir()):
            model_id = folder.name.replace("@", ":")
            try:
                if (folder / MANIFEST).is_file() and self.manifest(model_id) is not None:
                    ids.append(model_id)
            except InvalidRequestError:
                continue  # a folder we did not write
        return ids

    def disk_bytes(self, model_id: str) -> int:
        """Bytes under the model's folder (downloads, partials, converted copies)."""
        folder = self.model_dir(model_id)
        if not folder.is_dir():
            return 0
        return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())

    def remove(self, model_id: str) -> int:
        """Delete the model's folder; the bytes freed. 404 if the store has nothing for it."""
        folder = self.model_dir(model_id)
        if not folder.is_dir() or folder.is_symlink():
            raise ModelNotFoundError(f"model {model_id!r} is not in the model store ({self.root})", param="model")
        freed = self.disk_bytes(model_id)
        # Drop the manifest first: a crash half-way leaves an incomplete model, never a "downloaded" one.
        (folder / MANIFEST).unlink(missing_ok=True)
        shutil.rmtree(folder)
        return freed

    def discard_if_empty(self, model_id: str) -> None:
        """Remove the model's folder if nothing is left in it (after a refused download)."""
        folder = self.model_dir(model_id)
        for path in sorted(folder.rglob("*"), reverse=True) if folder.is_dir() else []:
            if path.is_dir() and not path.is_symlink():
                _rmdir_if_empty(path)
        _rmdir_if_empty(folder)


def _rmdir_if_empty(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.rmdir(path)
