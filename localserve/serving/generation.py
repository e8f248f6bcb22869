"""Submit the requests of one answer (n choices, several prompts) to the
engine, and read their token events back as one stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from localserve.engine.engine import SHUTDOWN_MESSAGE, SWAPPED_OUT_MESSAGE, Engine, RequestStream
from localserve.engine.types import GenerateRequest, SamplingParams, TokenEvent
from localserve.errors import BackendError, ContextLengthError, EngineStoppedError, LocalServeError


def event_error(event: TokenEvent) -> LocalServeError:
    """The client's error for an event that ended with `FinishReason.ERROR`:
    a 503 `engine_stopped` when a graceful shutdown or a model swap whose
    wait ran out ended the request (it was fine; retrying it works), else a
    500 `backend_error` (the step failed)."""
    if event.error in (SHUTDOWN_MESSAGE, SWAPPED_OUT_MESSAGE):
        return EngineStoppedError(event.error)
    return BackendError(event.error or "generation failed")


def request_ids(answer_id: str, num_choices: int) -> list[str]:
    """Engine request ids of an answer's choices: the answer's id for one
    choice, `ID-0`, `ID-1`, ... for several (what the cancel route accepts)."""
    return [answer_id] if num_choices == 1 else [f"{answer_id}-{i}" for i in range(num_choices)]


def submit_all(
    engine: Engine,
    model_id: str,
    answer_id: str,
    choices: Sequence[tuple[list[int], SamplingParams]],
    *,
    priority: float,
    prompt_param: str,
) -> list[RequestStream]:
    """Queue one request per choice; all or none (a refusal aborts the rest)."""
    streams: list[RequestStream] = []
    try:
        for request_id, (prompt_ids, params) in zip(request_ids(answer_id, len(choices)), choices, strict=True):
            request = GenerateRequest(request_id, prompt_ids, params, priority)
            streams.append(engine.submit(model_id, request))
    except ContextLengthError as exc:
        _abort(streams)
        exc.param = prompt_param  # the engine cannot know which field held the prompt
        raise
    except BaseException:
        _abort(streams)
        raise
    return streams


def _abort(streams: Sequence[RequestStream]) -> None:
    for stream in streams:
        stream.abort()


class MergedStreams:
    """The events of an answer's requests as one stream of `(index, event)`,
    in arrival order. `abort()` ends every request still running; call it in
    a `finally` so that a client who leaves stops the generation."""

    def __init__(self, streams: Sequence[RequestStream]) -> None:
        self.streams = list(streams)
        self._tasks: list[asyncio.Task[None]] = []
        self._ended: set[int] = set()  # requests stopped early by `end`

    def __aiter__(self) -> AsyncIterator[tuple[int, TokenEvent]]:
        return self._events()

    async def _events(self) -> AsyncIterator[tuple[int, TokenEvent]]:
        if len(self.streams) == 1:
            async for event in self.streams[0]:
                yield 0, event
            return
        queue: asyncio.Queue[tuple[int, TokenEvent]] = asyncio.Queue()
        self._tasks = [asyncio.create_task(_pump(i, s, queue)) for i, s in enumerate(self.streams)]
        open_ids = set(range(len(self.streams)))
        while open_ids - self._ended:
            index, event = await queue.get()
            if index in self._ended:
                continue
            if event.finished:
                open_ids.discard(index)
            yield index, event

    def end(self, index: int) -> None:
        """Stop request `index` now (its answer is complete): none of its
        later events is yielded; the others go on."""
        self._ended.add(index)
        self.streams[index].abort()
        if self._tasks:
            self._tasks[index].cancel()

    def abort(self) -> None:
        for task in self._tasks:
            task.cancel()
        _abort(self.streams)


async def _pump(index: int, stream: RequestStream, queue: asyncio.Queue[tuple[int, TokenEvent]]) -> None:
    async for event in stream:
        queue.put_nowait((index, event))
