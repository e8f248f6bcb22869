"""The server's line executor without a model: priority of batch lines, and
how many lines it lets run while other requests use the model."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from localserve.engine.types import Capacity
from localserve.serving.models import LocalModels
from localserve.serving.openai.batch_lines import ServingLineExecutor, batch_priority


class StubEngine:
    def __init__(self) -> None:
        self.running: dict[str, int] = {"batch": 8}
        self.waiting: dict[str, int] = {}

    def has_model(self, model_id: str) -> bool:
        return model_id == "m"

    def capacity(self, model_id: str) -> Capacity:
        return Capacity(num_slots=8, step_tokens=512, kv_size=4096, n_ctx=512)

    def stats(self) -> dict[str, Any]:
        return {"m": {"running": self.running, "waiting": self.waiting}}


def executor(engine: StubEngine, concurrency: int = 0) -> ServingLineExecutor:
    registry = SimpleNamespace(engine=engine)
    return ServingLineExecutor(LocalModels(registry), concurrency)  # type: ignore[arg-type]


def test_batch_lines_are_never_more_urgent_than_batch() -> None:
    assert batch_priority(None) == 2.0
    assert batch_priority("interactive") == 2.0
    assert batch_priority(0) == 2.0
    assert batch_priority(5) == 5.0
    assert batch_priority("nonsense") == "nonsense"  # left for the validation's own 400


def test_lines_in_flight_are_the_model_slots() -> None:
    engine = StubEngine()
    lines = executor(engine)
    assert lines.max_in_flight("/v1/chat/completions", "m") == 8
    engine.waiting = {"interactive": 1}  # the scheduler narrows batch work per step, not the runner
    assert lines.max_in_flight("/v1/chat/completions", "m") == 8
    assert lines.max_in_flight("/v1/chat/completions", "not-loaded") == 1
    assert executor(engine, concurrency=3).max_in_flight("/v1/chat/completions", "m") == 3
