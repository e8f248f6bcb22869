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
backend's `open` returns a `GenerativeBackend` (engine/backend.py), the
others a `OneShotBackend` whose items are what the route hands it (see
`backends/llamacpp/embeddings.py` and `backends/speech/faster_whisper.py`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from importlib.metadata import entry_points
from pathlib import Path

from localserve.errors import InvalidRequestError
from localserve.models.backend_spec import (
    CHAT,
    EMBEDDINGS,
    LLAMACPP,
    TRANSCRIPTION,
    BackendContext,
    BackendSpec,
    Opened,
    as_opened,
)
from localserve.models.builtin_backends import BUILTIN_BACKENDS
from localserve.models.kinds import ModelKind

# What a plugin imports from here.
__all__ = [
    "CHAT",
    "EMBEDDINGS",
    "LLAMACPP",
    "TRANSCRIPTION",
    "BackendContext",
    "BackendSpec",
    "Opened",
    "as_opened",
    "backends",
    "detect",
    "named",
    "plugin_backends",
]

log = logging.getLogger(__name__)

GROUP = "localserve.backends"


# ---- lookup ----------------------------------------------------------------------------


def backends() -> list[BackendSpec]:
    """The built-in backends, in detection order, then the plugins'."""
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


def named(name: str, kind: ModelKind) -> BackendSpec:
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
            if not isinstance(spec, BackendSpec) or spec.kind not in tuple(ModelKind):
                kinds = ", ".join(ModelKind)
                log.error("ignoring %r from the entry point %r: not a BackendSpec of kind %s", spec, entry.name, kinds)
                continue
            package = entry.dist.name if entry.dist is not None else entry.module
            found.append(_as_plugin(spec, package))
    return tuple(found)


def _as_plugin(spec: BackendSpec, package: str) -> BackendSpec:
    """`spec` with its kind a `ModelKind` and, unless it says, the package that provides it."""
    return dataclasses.replace(
        spec, kind=ModelKind(spec.kind), package=package if spec.package == "localserve" else spec.package
    )
