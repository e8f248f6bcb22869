"""The asyncio facade over the step threads: submit, stream, abort, stats.

Everything here runs on the event loop and never blocks it: requests go to a
model's `StepWorker` inbox and come back as `TokenEvent`s through one
`asyncio.Queue` per request.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

from localserve.engine.backend import GenerativeBackend, Tokenizer
from localserve.engine.step.prefix_disk import DiskPrefixStore
from localserve.engine.step.scheduler import SchedulerConfig
from localserve.engine.step.stats import Histogram, ModelSnapshot, ModelStats
from localserve.engine.step.worker import StepWorker
from localserve.engine.types import Capacity, FinishReason, GenerateRequest, TokenEvent
from localserve.errors import (
    ContextLengthError,
    EngineStoppedError,
    InvalidRequestError,
    ModelNotFoundError,
    QueueFullError,
)

#: The error of requests still running when a graceful shutdown's time is up,
#: and of those refused while it drains. The API answers it with a 503
#: (`engine_stopped`, `Retry-After`): the request was fine, the server is going.
SHUTDOWN_MESSAGE = "the server is shutting down; retry the request shortly"
#: The error of requests still running on a model being swapped out
#: (`--max-loaded-models`) when its wait for them ran out; a 503 as well.
SWAPPED_OUT_MESSAGE = (
    "the model was unloaded to make room for another (--max-loaded-models) before this answer finished; "
    "retry the request"
)
DRAIN_POLL_S = 0.05


@dataclass(frozen=True, slots=True)
class EngineConfig:
    max_queue: int = 256  # waiting requests per model before 503
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    prefix_disk: Path | None = None  # the prefix cache's disk tier (engine/step/prefix_disk.py); None: off
    prefix_disk_bytes: int = 0  # its size bound, for every model and process on that folder
    adaptive_threads: bool = False  # choose each step's CPU threads (engine/threads.py); False: the count at load


class RequestStream:
    """Token events of one request. Iterate it; leaving early (break, error,
    cancellation) aborts the request at the next step boundary."""

    def __init__(self, model: _Model, request: GenerateRequest) -> None:
        self.request = request
        self._model = model
        self._queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
        self._done = False

    def __aiter__(self) -> AsyncIterator[TokenEvent]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[TokenEvent]:
        try:
            while not self._done:
                event = await self._queue.get()
                if event.finished:
                    self._done = True
                yield event
        finally:
            self.abort()

    def abort(self) -> None:
        """Stop generating (no-op once finished)."""
        if not self._done:
            self._done = True
            self._model.forget(self.request.request_id)
            self._model.worker.abort(self.request.request_id)

    def _deliver(self, event: TokenEvent) -> None:
        self._queue.put_nowait(event)


class _Model:
    """A loaded generative model: its worker and its in-flight requests."""

    def __init__(self, model_id: str, backend: GenerativeBackend, config: EngineConfig) -> None:
        self.model_id = model_id
        self.backend = backend
        self.config = config
        self.stats = ModelStats()
        self.streams: dict[str, RequestStream] = {}
        identity = backend.kv_state_identity() if config.prefix_disk is not None else None
        disk = None
        if identity is not None and config.prefix_disk is not None and config.prefix_disk_bytes > 0:
            disk = DiskPrefixStore(config.prefix_disk, identity, config.prefix_disk_bytes)
        self.worker = StepWorker(
            model_id,
            backend,
            self.dispatch,
            asyncio.get_running_loop(),
            scheduler_config=config.scheduler,
            stats=self.stats,
            disk=disk,
            adaptive_threads=config.adaptive_threads,
        )
        self.capacity = backend.capacity()
        self.vocab_size = backend.tokenizer().vocab_size

    def dispatch(self, events: list[TokenEvent]) -> None:
        for event in events:
            stream = self.streams.get(event.request_id)
            if stream is None:
                continue
            if event.finished:
                del self.streams[event.request_id]
            stream._deliver(event)

    def forget(self, request_id: str) -> None:
        self.streams.pop(request_id, None)


class Engine:
    """All loaded generative models of the process."""

    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig()
        self._models: dict[str, _Model] = {}
        self._request_ids = itertools.count()
        self._draining = False
        self._wrap: Callable[[GenerativeBackend], GenerativeBackend] | None = None

    # ---- models --------------------------------------------------------------

    def add_model(self, model_id: str, backend: GenerativeBackend, config: EngineConfig | None = None) -> None:
        """Start serving `backend` as `model_id` (call from the event loop)."""
        if model_id in self._models:
            raise ValueError(f"model {model_id!r} is already loaded")
        if self._wrap is not None:
            backend = self._wrap(backend)
        model = _Model(model_id, backend, config or self.config)
        model.worker.start()
        self._models[model_id] = model

    async def warmed_up(self, model_id: str, timeout_s: float = 120.0) -> None:
        """Wait until `model_id`'s step thread has warmed its backend up, so
        that "loaded" means the first request runs at full speed."""
        model = self._models.get(model_id)
        if model is not None:
            await asyncio.to_thread(model.worker.warmed_up.wait, timeout_s)

    def wrap_backends(self, wrap: Callable[[GenerativeBackend], GenerativeBackend]) -> None:
        """Serve every model added from now on through `wrap(backend)`, which
        must delegate to it: the debug fault route wraps them in
        `engine.step.faults.FaultInjectingBackend`. `backend()` returns the wrapper."""
        self._wrap = wrap

    async def unload_model(self, model_id: str, *, close_backend: bool = True) -> None:
        """Stop a model's worker (in-flight requests end with an error) and
        close its backend (unless the caller keeps it for another engine)."""
        model = self._models.pop(model_id, None)
        if model is None:
            raise ModelNotFoundError(f"model {model_id!r} is not loaded")
        await asyncio.to_thread(model.worker.stop)
        if close_backend:
            await asyncio.to_thread(model.backend.close)

    async def close(self) -> None:
        for model_id in list(self._models):
            await self.unload_model(model_id)

    async def drain(self, timeout: float) -> int:
        """Graceful shutdown: refuse new requests (503), let those in flight
        finish for up to `timeout` seconds, then end the rest with
        `FinishReason.ERROR` and `SHUTDOWN_MESSAGE`. Returns how many were ended."""
        self._draining = True
        deadline = time.monotonic() + timeout
        while any(m.streams for m in self._models.values()) and time.monotonic() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        return sum(self.end_requests(model_id, SHUTDOWN_MESSAGE) for model_id in list(self._models))

    def end_requests(self, model_id: str, message: str) -> int:
        """End every request in flight on `model_id` now, with
        `FinishReason.ERROR` and `message`; how many were ended."""
        model = self._model(model_id)
        streams = list(model.streams.items())
        for request_id, stream in streams:
            model.forget(request_id)
            model.worker.abort(request_id)
            stream._deliver(_ended(stream, request_id, FinishReason.ERROR, message))
        return len(streams)

    def has_model(self, model_id: str) -> bool:
        return model_id in self._models

    def _model(self, model_id: str) -> _Model:
        model = self._models.get(model_id)
        if model is None:
            raise ModelNotFoundError(f"model {model_id!r} is not loaded", param="model")
        return model

    def tokenizer(self, model_id: str) -> Tokenizer:
        return self._model(model_id).backend.tokenizer()

    def capacity(self, model_id: str) -> Capacity:
        return self._model(model_id).capacity

    def backend(self, model_id: str) -> GenerativeBackend:
        return self._model(model_id).backend

    def num_in_flight(self, model_id: str) -> int:
        return len(self._model(model_id).streams)

    # ---- requests ------------------------------------------------------------

    def new_request_id(self, prefix: str = "req") -> str:
        return f"{prefix}-{next(self._request_ids)}-{time.monotonic_ns() % 1_000_000_000:09d}"

    def submit(self, model_id: str, request: GenerateRequest) -> RequestStream:
        """Queue a request; raises at once if it can never run or the queue is full."""
        model = self._model(model_id)
        if self._draining:
            raise EngineStoppedError(SHUTDOWN_MESSAGE)
        if not model.worker.alive:
            raise EngineStoppedError(f"model {model_id!r} is not running; reload it")
        n_ctx = model.capacity.n_ctx
        num_prompt = len(request.prompt_token_ids)
        if num_prompt >= n_ctx:
            raise ContextLengthError(
                f"This model's maximum context length is {n_ctx} tokens; the prompt has {num_prompt} tokens. "
                "Shorten the prompt or restart with a larger --ctx-size.",
                param="messages",
            )
        ids = request.prompt_token_ids
        if ids and (min(ids) < 0 or max(ids) >= model.vocab_size):
            # the API checks first; out of range, llama.cpp would refuse the whole step, batchmates included
            bad = next(t for t in ids if not 0 <= t < model.vocab_size)
            raise InvalidRequestError(
                f"token id {bad} is outside the vocabulary (size {model.vocab_size})", param="prompt"
            )
        num_waiting = model.worker.num_waiting  # as the scheduler counts them
        if num_waiting >= model.config.max_queue:
            raise QueueFullError(
                f"model {model_id!r} has {num_waiting} requests waiting (limit {model.config.max_queue}); retry shortly",
                retry_after_s=1,
            )
        if request.request_id in model.streams:
            raise ValueError(f"request id {request.request_id!r} is in use")
        stream = RequestStream(model, request)
        model.streams[request.request_id] = stream
        model.worker.add(request)
        return stream

    def abort(self, request_id: str) -> bool:
        """Cancel a request by id on whichever model runs it."""
        for model in self._models.values():
            stream = model.streams.get(request_id)
            if stream is not None:
                model.forget(request_id)
                model.worker.abort(request_id)
                stream._deliver(_ended(stream, request_id, FinishReason.ABORT))
                return True
        return False

    # ---- stats ---------------------------------------------------------------

    def stats(self) -> dict[str, ModelSnapshot]:
        """A snapshot per model (cheap; safe to call often): the scheduler's
        last published state, the rates and latencies of `ModelStats.snapshot`
        and the batch policy's last step (JSON only at the API edge)."""
        out: dict[str, ModelSnapshot] = {}
        for model_id, model in self._models.items():
            info = model.backend.info()
            out[model_id] = ModelSnapshot(
                backend=info.backend,
                device=info.device,
                in_flight=len(model.streams),
                kv_size=model.capacity.kv_size,
                num_slots=model.capacity.num_slots,
                n_ctx=model.capacity.n_ctx,
                scheduler=model.worker.snapshot,
                recent_batch_sizes=tuple(model.stats.recent_batch_sizes()),
                total_prompt_tokens=model.stats.total_prompt_tokens,
                total_output_tokens=model.stats.total_output_tokens,
                batch_policy=model.worker.batch_policy,  # batch admission by step time (engine/step/batch_policy.py)
                rates=model.stats.snapshot(),
                threads=model.worker.thread_state,
            )
        return out

    def latency_histograms(self) -> dict[str, dict[str, dict[str, Histogram]]]:
        """Model -> priority class -> `ttft` / `queue_wait` / `itl` -> cumulative histogram."""
        return {model_id: model.stats.histograms() for model_id, model in self._models.items()}


def _ended(stream: RequestStream, request_id: str, reason: FinishReason, error: str | None = None) -> TokenEvent:
    return TokenEvent(
        request_id=request_id,
        token_ids=(),
        text="",
        finish_reason=reason,
        error=error,
        num_prompt_tokens=len(stream.request.prompt_token_ids),
    )
