"""What a backend is to localserve: `BackendSpec` (name, kind, detect, open,
the modules it needs) and what `open` gets and returns. The registry that
finds them, built-in and from other packages, is models/backend_registry.py."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localserve.config import ServerSettings
from localserve.errors import InvalidRequestError
from localserve.models.catalog import ModelOptions
from localserve.models.kinds import ModelKind
from localserve.models.options import ResolvedOptions

#: The kinds a backend serves, under the names plugins import (models/backend_registry.py).
CHAT, EMBEDDINGS, TRANSCRIPTION = ModelKind.CHAT, ModelKind.EMBEDDINGS, ModelKind.TRANSCRIPTION
RERANK, CLASSIFY = ModelKind.RERANK, ModelKind.CLASSIFY
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
    batching: Any = None  # a one-shot model's OneShotQueueConfig, if not its kind's default
    source: Path | None = None  # what was loaded, if not the path itself (a converted copy)


def as_opened(value: Any) -> Opened:
    return value if isinstance(value, Opened) else Opened(value)


Opener = Callable[[Path, BackendContext], Any]


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """One backend: what it serves, how it finds and opens models, what it needs."""

    name: str
    kind: (
        ModelKind  # CHAT, EMBEDDINGS, TRANSCRIPTION, RERANK or CLASSIFY (a plugin's plain "embeddings" is read as one)
    )
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
