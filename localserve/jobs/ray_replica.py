"""One replica of a `localserve batch run --ray` job: the callable class that
Ray Data's actor pool instantiates once per actor.

Each replica loads one engine with the chosen model (through the same
`ModelOpener` as the single-machine run, so lines go through the serving
layer and our continuous-batching scheduler) and answers a Ray batch by
submitting all of its lines at once: the scheduler batches them into shared
engine steps. The engine lives on an event loop in a thread of its own, so
two Ray batches may be in flight on one actor and the next one fills the
slots that the tail of the previous one leaves free.

This module imports no ray: Ray Data only calls it.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

from localserve.jobs.offline import AnsweredLine, ModelOpener, answer_line

T = TypeVar("T")

#: The columns a replica answers each line with (what the driver journals and counts).
RESULT_COLUMNS = ("custom_id", "line", "ok", "num_tokens", "replica", "working_since")


class EngineReplica:
    """A Ray Data UDF: `{"custom_id", "body"}` rows in, result lines out."""

    def __init__(self, open_model: ModelOpener, model: str, endpoint: str) -> None:
        self.endpoint = endpoint
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self.working_since = 0.0  # wall clock of its first batch: its rate leaves out start-up and model load
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="replica-engine-loop", daemon=True)
        self._thread.start()
        self._model = open_model(model)
        self._executor, self._model_id = self._wait(self._model.__aenter__())

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[Any]]:
        self.working_since = self.working_since or time.time()
        custom_ids = [str(c) for c in batch["custom_id"]]
        bodies = [json.loads(b) for b in batch["body"]]
        answers = self._wait(self._answer_all(custom_ids, bodies))
        return {
            "custom_id": custom_ids,
            "line": [a.line for a in answers],
            "ok": [a.ok for a in answers],
            "num_tokens": [a.num_tokens for a in answers],
            "replica": [self.name] * len(answers),
            "working_since": [self.working_since] * len(answers),
        }

    async def _answer_all(self, custom_ids: list[str], bodies: list[dict[str, Any]]) -> list[AnsweredLine]:
        return await asyncio.gather(
            *(
                answer_line(self._executor, self.endpoint, self._model_id, c, b)
                for c, b in zip(custom_ids, bodies, strict=True)
            )
        )

    def _wait(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()
