"""Progress of a huggingface_hub download, as our own reports.

huggingface_hub reports bytes through a tqdm class. `bound_progress(meter)`
makes one that draws nothing and hands every update to a `Meter` (rate over
the last seconds, ETA, at most one report per PROGRESS_INTERVAL_S), which
also stops the download when the caller cancels (an exception from
`update` ends huggingface_hub's transfer; its `.incomplete` file stays and
the next pull resumes it).

`hf_hub_download` takes `tqdm_class` from huggingface_hub 1.0 on. Older
versions (0.x, which `transformers<5` still requires) create their bar
through `huggingface_hub.utils.tqdm.tqdm`; `thread_progress` swaps that
class, for the calling thread only, for the bound one.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

PROGRESS_INTERVAL_S = 0.1


class PullCancelled(Exception):
    """The caller stopped the pull; huggingface_hub's `.incomplete` file stays for a resume."""


@dataclass(frozen=True, slots=True)
class PullProgress:
    """One progress report: `status` is "resolving", "downloading",
    "verifying", "exists" (nothing to do) or "success"."""

    model_id: str
    status: str
    file: str = ""
    completed: int = 0  # bytes of `file` on disk
    total: int = 0  # bytes of `file` (0: unknown)
    rate_bytes_per_s: float = 0.0
    eta_s: float | None = None
    file_index: int = 0
    num_files: int = 0
    digest: str = ""  # sha256 of `file` when the hub gave one (Ollama's progress names it)


ProgressCallback = Callable[[PullProgress], None]


class Meter:
    """Rate (over the last few seconds) and ETA of one file's download."""

    WINDOW_S = 5.0

    def __init__(self, report: ProgressCallback, base: PullProgress, cancel: threading.Event | None = None) -> None:
        self.report, self.base, self.cancel = report, base, cancel
        self.samples: deque[tuple[float, int]] = deque()
        self.last_report = 0.0
        self.completed = 0

    def start(self, completed: int) -> None:
        self.samples.clear()
        self.samples.append((time.monotonic(), completed))
        self.completed = completed
        self._emit("downloading", 0.0)

    def update(self, completed: int) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise PullCancelled(self.base.file)
        now = time.monotonic()
        self.completed = completed
        self.samples.append((now, completed))
        while len(self.samples) > 2 and now - self.samples[0][0] > self.WINDOW_S:
            self.samples.popleft()
        if now - self.last_report >= PROGRESS_INTERVAL_S or completed == self.base.total:
            then, then_bytes = self.samples[0]
            self._emit("downloading", (completed - then_bytes) / (now - then) if now > then else 0.0)

    def status(self, status: str) -> None:
        self._emit(status, 0.0)

    def _emit(self, status: str, rate: float) -> None:
        self.last_report = time.monotonic()
        total = self.base.total
        eta = (total - self.completed) / rate if rate > 0 and total else None
        fields = {"status": status, "completed": self.completed, "rate_bytes_per_s": rate, "eta_s": eta}
        self.report(PullProgress(**{**_fields(self.base), **fields}))


def _fields(progress: PullProgress) -> dict[str, Any]:
    return {name: getattr(progress, name) for name in PullProgress.__dataclass_fields__}


def bound_progress(meter: Meter) -> type:
    """A tqdm class for huggingface_hub that feeds `meter` and draws nothing."""
    from huggingface_hub.utils import tqdm as hf_tqdm

    class HubProgress(hf_tqdm):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True  # our own bar draws; tqdm only brings the numbers
            super().__init__(*args, **kwargs)
            self.done = int(kwargs.get("initial") or 0)
            if kwargs.get("unit", "B") == "B":
                meter.start(self.done)

        def update(self, n: float | None = 1) -> bool | None:
            self.done += int(n or 0)
            meter.update(self.done)
            return None

    return HubProgress


def takes_tqdm_class() -> bool:
    """Whether this huggingface_hub's `hf_hub_download` reports through `tqdm_class` (1.0 and later)."""
    from huggingface_hub import hf_hub_download

    return "tqdm_class" in inspect.signature(hf_hub_download).parameters


_LOCAL = threading.local()
_SWAP_LOCK = threading.Lock()


@contextlib.contextmanager
def thread_progress(bar_class: type) -> Iterator[None]:
    """While the block runs in this thread, huggingface_hub 0.x's download bars are `bar_class`."""
    _install_dispatch()
    _LOCAL.bar_class = bar_class
    try:
        yield
    finally:
        _LOCAL.bar_class = None


def _install_dispatch() -> None:
    import importlib

    tqdm_module = importlib.import_module(
        "huggingface_hub.utils.tqdm"
    )  # the module (the package's `tqdm` is the class)

    with _SWAP_LOCK:
        original = tqdm_module.tqdm
        if getattr(original, "_localserve_dispatch", False):
            return

        class Dispatch(original):  # type: ignore[misc, valid-type]
            """huggingface_hub's own bar, unless this thread bound another."""

            _localserve_dispatch = True

            def __new__(cls, *args: Any, **kwargs: Any) -> Any:
                bound = getattr(_LOCAL, "bar_class", None)
                if bound is not None:
                    return bound(*args, **kwargs)  # not a Dispatch: type() runs no second __init__
                return super().__new__(cls, *args, **kwargs)

        setattr(tqdm_module, "tqdm", Dispatch)  # noqa: B010 - a module attribute typing does not know
