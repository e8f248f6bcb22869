"""Which backend serves a model: the built-in ones and those other packages add.

Every backend is a `BackendSpec`: a name, the kind of model it serves
(`chat`, `embeddings`, `transcription`), how it recognises a model on disk
(`detect`), how it opens one (`open`, blocking), and the modules it needs
(`modules`; when one is missing, `missing()` names the extra to install).

A package adds backends through the entry-point group `localserve.backends`;
each entry point loads to a `BackendSpec`, a list of them, or a callable
returning either. In its `pyproject.toml`:

    [project.entry-points."localserve.backends"]
    mybackend = "mypackage.localserve_plugin:BACKENDS"

A path is served by the first built-in backend that detects it, else by the
first plugin that does; a catalog entry's `backend` picks one by name. A chat
backend's `open` returns a `GenerativeBackend` (backends/base.py), the
others a `OneShotBackend` whose items are what the route hands it (see
`backends/embeddings_llamacpp.py` and `backends/whisper.py`).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from localserve.config import ServerSettings
from localserve.errors import InvalidRequestError
from localserve.models.catalog import ModelOptions
from localserve.models.options import ResolvedOptions

log = logging.getLogger(__name__)

GROUP = "localserve.backends"
CHAT, EMBEDDINGS, TRANSCRIPTION = "chat", "embeddings", "transcription"
KINDS = (CHAT, EMBEDDINGS, TRANSCRIPTION)
LLAMACPP = "llamacpp"


@dataclass(frozen=True, slots=True)
class BackendContext:
    """What `open` gets besides the path."""

    model_id: str
    settings: ServerSettings  # the server's (threads, batch_tokens, max_queue, ...)
    options: ResolvedOptions  # the model's effective options (ctx_size, parallel, kv_size, device, ...)
    request: ModelOptions = ModelOptions()  # what the load request asked for (above every other level)


@dataclass(frozen=True, slots=True)
class Opened:
    """What a built-in `open` returns (a plugin may return the bare backend)."""

    backend: Any  # GenerativeBackend or OneShotBackend
    report: Any = None  # a generative model's LoadReport (effective options), if the backend made one
    batching: Any = None  # a one-shot model's BatcherConfig, if not its kind's default
    source: Path | None = None  # what was loaded, if not the path itself (a converted copy)


def as_opened(value: Any) -> Opened:
    return value if isinstance(value, Opened) else Opened(value)


Opener = Callable[[Path, BackendContext], Any]


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """One backend: what it serves, how it finds and opens models, what it needs."""

    name: str
    kind: str  # CHAT, EMBEDDINGS or TRANSCRIPTION
    open: Opener
    detect: Callable[[Path], bool] | None = None  # None: only when named (a catalog entry's `backend`)
    modules: tuple[str, ...] = ()  # importable modules it needs
    extra: str = ""  # localserve's extra that installs them ("speech", "onnx", "openvino")
    package: str = "localserve"  # the distribution that provides it

    def missing(self) -> str:
        """ "" when every module it needs is installed; else what to install."""
        absent = [m for m in self.modules if not _importable(m)]
        if not absent:
            return ""
        if self.extra and self.package == "localserve":
            return f"pip install 'localserve[{self.extra}]'"
        return f"install the modules {', '.join(absent)} (needed by {self.package})"

    def require(self, model_id: str) -> None:
        """A 400 naming what to install when the backend's modules are missing."""
        hint = self.missing()
        if hint:
            raise InvalidRequestError(
                f"model {model_id!r} needs the {self.name} {self.kind} backend, which is not installed: {hint}",
                param="model",
                code="backend_not_installed",
            )


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


# ---- lookup ----------------------------------------------------------------------------


def backends() -> list[BackendSpec]:
    """The built-in backends, in detection order, then the plugins'."""
    from localserve.models.builtin_backends import BUILTIN_BACKENDS

    return [*BUILTIN_BACKENDS, *plugin_backends()]


def detect(path: Path) -> BackendSpec | None:
    """The first backend that recognises `path`, or None."""
    for spec in backends():
        try:
            if spec.detect is not None and spec.detect(path):
                return spec
        except OSError:
            continue
        except Exception:  # a plugin's bug must not hide every other model
            log.exception("backend %s (%s) failed to inspect %s", spec.name, spec.package, path)
    return None


def named(name: str, kind: str) -> BackendSpec:
    """The backend `name` of `kind` (a catalog entry's `backend`); 400 if none."""
    for spec in backends():
        if spec.name == name and spec.kind == kind:
            return spec
    known = ", ".join(sorted({s.name for s in backends() if s.kind == kind}))
    raise InvalidRequestError(f"no {kind} backend named {name!r} (known: {known})", param="model")


@functools.cache
def plugin_backends() -> tuple[BackendSpec, ...]:
    """What the installed packages add through `localserve.backends` (read once)."""
    found: list[BackendSpec] = []
    for entry in entry_points(group=GROUP):
        try:
            value = entry.load()
            value = value() if callable(value) and not isinstance(value, BackendSpec) else value
            specs = [value] if isinstance(value, BackendSpec) else list(value)
        except Exception:
            log.exception("could not load the localserve backend %r (%s)", entry.name, entry.value)
            continue
        for spec in specs:
            if not isinstance(spec, BackendSpec) or spec.kind not in KINDS:
                log.error("ignoring %r from the entry point %r: not a BackendSpec of kind %s", spec, entry.name, KINDS)
                continue
            package = entry.dist.name if entry.dist is not None else entry.module
            found.append(spec if spec.package != "localserve" else _with_package(spec, package))
    return tuple(found)


def _with_package(spec: BackendSpec, package: str) -> BackendSpec:
    import dataclasses

    return dataclasses.replace(spec, package=package)
