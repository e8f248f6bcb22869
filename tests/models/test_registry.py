"""ModelRegistry with scripted backends and a fake engine: shared loads, LRU
eviction (idle models at once, busy ones after a bounded drain), keep_alive and the reaper, start-up loads and
their errors and limits. The registry's own code runs; only the backends' opening and
the engine's step threads are replaced (a real queue runs the one-shot
models)."""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from localserve.config import ServerSettings
from localserve.engine.backend import BackendInfo, GenerativeBackend, OneShotBackend
from localserve.engine.engine import SWAPPED_OUT_MESSAGE
from localserve.engine.oneshot.queue import OneShotQueueConfig
from localserve.engine.types import Capacity, FinishReason, TokenEvent
from localserve.errors import (
    EngineStoppedError,
    InvalidRequestError,
    ModelLoadingError,
    ModelNotFoundError,
    QueueFullError,
)
from localserve.models.catalog import ModelOptions
from localserve.models.plan import LoadReport
from localserve.models.registry import ModelRegistry, ModelSpec
from localserve.models.registry import core as core_module
from localserve.models.registry import keeping as keeping_module
from localserve.serving.generation import event_error

LABELS = {"emb": ("embeddings",), "asr": ("transcription",)}


@dataclass
class FakeEngine:
    """The engine calls the registry makes, without step threads."""

    in_flight: Counter[str] = field(default_factory=Counter)
    models: set[str] = field(default_factory=set)
    ended: list[tuple[str, int, str]] = field(default_factory=list)

    def add_model(self, model_id: str, backend: Any, config: Any = None) -> None:
        assert model_id not in self.models
        self.models.add(model_id)

    async def warmed_up(self, model_id: str) -> None:
        assert model_id in self.models

    async def unload_model(self, model_id: str, *, close_backend: bool = True) -> None:
        self.models.remove(model_id)
        await asyncio.sleep(0)

    def end_requests(self, model_id: str, message: str) -> int:
        num_ended, self.in_flight[model_id] = self.in_flight[model_id], 0
        self.ended.append((model_id, num_ended, message))
        return num_ended

    def has_model(self, model_id: str) -> bool:
        return model_id in self.models

    def num_in_flight(self, model_id: str) -> int:
        return self.in_flight[model_id]

    async def close(self) -> None:
        self.models.clear()


class Echo(OneShotBackend[str, str]):
    def run(self, items: Sequence[str]) -> list[str]:
        return list(items)

    def info(self) -> BackendInfo:
        return BackendInfo("echo", "CPU", "/models/echo")


class Idle:
    """A generative backend the fake engine never steps: the registry only reads its capacity."""

    def capacity(self) -> Capacity:
        return Capacity(1, 512, 512, 512)

    def close(self) -> None:
        pass


class ScriptedRegistry(ModelRegistry):
    """Records opens and unloads; an open takes `load_s` and may be told to fail."""

    def __init__(self, settings: ServerSettings, load_s: float, find: Any = None) -> None:
        super().__init__(FakeEngine(), settings, find=find or find_spec)  # type: ignore[arg-type]
        self.load_s = load_s
        self.loads: list[str] = []
        self.unloads: list[str] = []
        self.fail: set[str] = set()

    def _open(self, spec: ModelSpec) -> None:
        self.loads.append(spec.model_id)
        time.sleep(self.load_s)
        if spec.model_id in self.fail:
            raise ModelLoadingError(f"cannot load {spec.model_id}")

    def open_model(self, spec: ModelSpec) -> tuple[GenerativeBackend, LoadReport]:
        self._open(spec)
        return Idle(), LoadReport(512, 1, 512, 0, 0, 0, "CPU")  # type: ignore[return-value]

    def open_oneshot(self, spec: ModelSpec, kind: str) -> tuple[OneShotBackend, OneShotQueueConfig]:  # type: ignore[type-arg]
        self._open(spec)
        return Echo(), OneShotQueueConfig()

    async def unload_record(self, record: Any) -> None:
        self.unloads.append(record.model_id)
        await super().unload_record(record)

    @property
    def engine_fake(self) -> FakeEngine:
        return self.engine  # type: ignore[return-value]

    def loaded_ids(self) -> set[str]:
        return {model_id for model_id in self.records if self.is_loaded(model_id)}


def find_spec(model_id: str) -> ModelSpec | None:
    if model_id.startswith("unknown"):
        return None
    return ModelSpec(model_id, Path(f"/models/{model_id}.gguf"), LABELS.get(model_id.split("-")[0], ("chat",)))


def make(max_loaded: str = "chat=2", keep_alive: str = "", load_s: float = 0.02, **settings: Any) -> ScriptedRegistry:
    return ScriptedRegistry(ServerSettings(max_loaded_models=max_loaded, keep_alive=keep_alive, **settings), load_s)


async def use(registry: ModelRegistry, model_id: str, keep_alive: object = None) -> None:
    registry.release(await registry.hold(model_id, keep_alive=keep_alive))


async def test_concurrent_requests_share_one_load() -> None:
    registry = make(load_s=0.1)
    holds = await asyncio.gather(*(registry.hold("a") for _ in range(8)))
    assert registry.loads == ["a"] and {hold.record.state for hold in holds} == {"loaded"}
    assert registry.records["a"].num_users == 8 and "a" in registry.loaded
    for hold in holds:
        registry.release(hold)
    assert registry.records["a"].num_users == 0


async def test_lru_eviction_order() -> None:
    registry = make("chat=2,embeddings=1")
    for model_id in ("a", "b", "a"):  # b is now the least recently used
        await use(registry, model_id)
    await use(registry, "c")
    assert registry.unloads == ["b"] and registry.loaded_ids() == {"a", "c"}
    await use(registry, "d")  # a was used before c
    assert registry.unloads == ["b", "a"] and registry.loaded_ids() == {"c", "d"}
    await use(registry, "emb-1")  # other kinds have their own limit
    await use(registry, "emb-2")
    assert registry.unloads == ["b", "a", "emb-1"] and registry.loaded_ids() == {"c", "d", "emb-2"}
    assert set(registry.oneshot) == {"emb-2"} and set(registry.loaded) == {"c", "d"}
    assert registry.engine_fake.models == {"c", "d"}  # generative models in the engine, one-shot ones not
    await registry.close()


async def test_a_busy_model_drains_before_it_is_swapped_out() -> None:
    """chat=1 and a is busy: a load for b drains a (no new requests for it,
    the one held and the engine's work finish), then swaps; a request for a
    that came meanwhile waits and loads it again. Nothing is ended."""
    registry = make("chat=1")
    held = await registry.hold("a")  # a request holds a
    loading_b = asyncio.create_task(use(registry, "b"))
    await asyncio.sleep(0.1)
    assert registry.records["a"].state == "draining" and "a" in registry.loaded  # still answers what it holds
    late_a = asyncio.create_task(registry.hold("a"))
    await asyncio.sleep(0.3)
    assert not loading_b.done() and not late_a.done() and registry.unloads == []
    registry.release(held)
    registry.engine_fake.in_flight["a"] = 1  # ... and a's engine still has work
    await asyncio.sleep(0.3)
    assert not loading_b.done() and registry.unloads == []
    registry.engine_fake.in_flight["a"] = 0
    await asyncio.wait_for(loading_b, 2)
    registry.release(await asyncio.wait_for(late_a, 2))  # b is idle by then: it goes at once
    assert registry.loads == ["a", "b", "a"] and registry.unloads == ["a", "b"] and registry.loaded_ids() == {"a"}
    assert registry.engine_fake.ended == []


async def test_a_drain_past_its_bound_ends_the_answers_and_swaps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Answers longer than DRAIN_WAIT_S end with the swap's 503 and the swap proceeds."""
    monkeypatch.setattr(keeping_module, "DRAIN_WAIT_S", 0.3)
    registry = make("chat=1")
    held = await registry.hold("a")
    registry.engine_fake.in_flight["a"] = 2
    started = time.monotonic()
    await asyncio.wait_for(use(registry, "b"), 2)
    assert 0.3 <= time.monotonic() - started < 1.5
    assert registry.engine_fake.ended == [("a", 2, SWAPPED_OUT_MESSAGE)]
    assert registry.unloads == ["a"] and registry.loaded_ids() == {"b"}
    registry.release(held)  # the hold of a gone model: changes nothing
    assert registry.loaded_ids() == {"b"} and "a" not in registry.records
    error = event_error(TokenEvent("r", (), "", finish_reason=FinishReason.ERROR, error=SWAPPED_OUT_MESSAGE))
    assert isinstance(error, EngineStoppedError) and error.status == 503


async def test_a_load_waits_a_bounded_time_for_models_still_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keeping_module, "EVICT_WAIT_S", 0.2)
    registry = make("chat=1", load_s=0.6)
    loading_a = asyncio.create_task(use(registry, "a"))
    await asyncio.sleep(0.05)
    with pytest.raises(QueueFullError, match="still loading"):
        await registry.hold("b")
    await loading_a
    assert "b" not in registry.records and registry.loaded_ids() == {"a"}


async def test_start_up_loads_at_most_the_limit_of_each_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first models named of each kind load; the others are left to their
    first request, said once each, and kept like start-up models once loaded."""
    monkeypatch.setattr(core_module, "resolve", find_spec)
    registry = make("chat=1,embeddings=1", models=["a", "b", "emb-1", "c", "emb-2"])
    registry.start()
    assert registry.startup is not None
    await registry.startup
    assert registry.loads == ["a", "emb-1"] and registry.loaded_ids() == {"a", "emb-1"}
    later = "not loaded at start (--max-loaded-models {}); loads on first request"
    assert registry.not_loaded == {
        "b": later.format("chat=1"),
        "c": later.format("chat=1"),
        "emb-2": later.format("embeddings=1"),
    }
    assert registry.load_errors == {}
    await use(registry, "b")
    assert registry.unloads == ["a"] and registry.loaded_ids() == {"b", "emb-1"}
    assert registry.records["b"].keep_alive_s == math.inf
    await registry.close()


async def test_keep_alive_zero_unloads_after_the_request() -> None:
    registry = make()
    registry.start()
    try:
        hold = await registry.hold("a", keep_alive=0)
        await asyncio.sleep(0.2)
        assert "a" in registry.loaded  # held: never unloaded mid-request
        registry.release(hold)
        for _ in range(50):
            if "a" not in registry.loaded:
                break
            await asyncio.sleep(0.02)
        assert registry.unloads == ["a"]
    finally:
        await registry.close()


async def test_keep_alive_durations_and_defaults() -> None:
    registry = make("0")  # no limit: only keep_alive unloads here
    await use(registry, "on-demand")
    assert registry.records["on-demand"].keep_alive_s == 300.0  # Ollama's 5m default
    await use(registry, "short", keep_alive="250ms")
    await use(registry, "forever", keep_alive=-1)
    await registry.load(find_spec("startup"))  # type: ignore[arg-type]
    assert registry.records["startup"].keep_alive_s == math.inf  # --model ones stay
    for record in registry.records.values():
        record.last_used -= 100.0  # as if idle for 100 s
    await registry.keeper.reap()
    assert registry.loaded_ids() == {"on-demand", "forever", "startup"}
    await use(registry, "on-demand")  # a request without keep_alive goes back to the default
    assert registry.records["on-demand"].keep_alive_s == 300.0

    explicit = make(keep_alive="1s")
    await explicit.load(find_spec("startup"))  # type: ignore[arg-type]
    assert explicit.records["startup"].keep_alive_s == 1.0  # an explicit --keep-alive applies to all


async def test_errors_reach_every_waiter_and_leave_nothing_behind() -> None:
    registry = make(load_s=0.05)
    registry.fail.add("broken")
    results = await asyncio.gather(*(registry.hold("broken") for _ in range(3)), return_exceptions=True)
    assert all(isinstance(r, ModelLoadingError) for r in results) and registry.loads == ["broken"]
    assert "broken" not in registry.records
    with pytest.raises(ModelNotFoundError):
        await registry.hold("unknown-model")
    with pytest.raises(InvalidRequestError, match="embeddings model"):
        await registry.hold("emb-x", kind="chat")
    with pytest.raises(InvalidRequestError, match="invalid model id"):
        await registry.hold("../x")
    with pytest.raises(InvalidRequestError, match="keep_alive"):
        await registry.hold("a", keep_alive="soon")
    assert registry.loads == ["broken"]


async def test_a_cancelled_request_does_not_cancel_the_shared_load() -> None:
    registry = make(load_s=0.2)
    first = asyncio.create_task(registry.hold("a"))
    await asyncio.sleep(0.05)
    first.cancel()
    hold = await registry.hold("a")
    assert registry.loads == ["a"] and registry.records["a"].num_users == 1
    registry.release(hold)


async def test_unload_get_and_describe() -> None:
    registry = make()
    await use(registry, "a", keep_alive="10m")
    [row] = registry.describe()
    assert row["id"] == "a" and row["keep_alive"] == "10m" and 590 < row["expires_in_s"] <= 600  # type: ignore[operator]
    assert row["options"]["ctx_per_slot"] == 512  # type: ignore[index]  # the load report
    assert registry.get("a").spec.model_id == "a"
    await use(registry, "emb-1")
    with pytest.raises(InvalidRequestError, match="/v1/embeddings"):
        registry.get("emb-1")
    with pytest.raises(InvalidRequestError, match="not a transcription model"):
        registry.get_oneshot("emb-1", "transcription")
    await registry.unload("a")
    assert registry.unloads == ["a"] and [r["id"] for r in registry.describe()] == ["emb-1"]
    with pytest.raises(ModelNotFoundError):
        await registry.unload("a")
    with pytest.raises(ModelNotFoundError):
        registry.get("a")
    await registry.close()


async def test_load_options_go_to_the_load_and_other_options_need_an_unload() -> None:
    registry = make()
    wanted = ModelOptions(ctx_size=1024, parallel=2)
    registry.release(await registry.hold("a", options=wanted))
    assert registry.records["a"].spec.options == wanted
    registry.release(await registry.hold("a"))  # plain requests use it as loaded
    registry.release(await registry.hold("a", options=ModelOptions(ctx_size=1024, parallel=2)))
    with pytest.raises(InvalidRequestError, match="unload it first") as exc:
        await registry.hold("a", options=ModelOptions(ctx_size=2048))
    assert exc.value.param == "options"
    await registry.unload("a")
    registry.release(await registry.hold("a"))  # loaded again on demand: its own options, not the request's
    assert registry.records["a"].spec.options == ModelOptions() and registry.loads == ["a", "a"]


async def test_a_hold_outlives_keep_alive_zero_and_lru() -> None:
    """What the batch runner relies on: while it holds a model, neither the
    reaper nor a load that needs room unloads it."""
    registry = make("chat=1", keep_alive="0")
    held = await registry.hold("a")
    await use(registry, "a", keep_alive=0)  # a line of the batch, asking to unload right after it
    assert await registry.keeper.reap() > 0 and registry.unloads == []
    other = asyncio.create_task(use(registry, "b"))
    await asyncio.sleep(0.3)
    assert not other.done() and registry.unloads == [] and "a" in registry.loaded
    registry.release(held)
    await asyncio.wait_for(other, 2)
    assert registry.unloads == ["a"]


async def test_start_up_loads_are_one_owner_with_requests_and_unloads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The start-up models go through the same records as on-demand loads: a
    request during the load is a 503, one after it shares the loaded model,
    an unload forgets it, a failure is remembered by the name it was given."""
    monkeypatch.setattr(core_module, "resolve", lambda name: find_spec(name.removeprefix("path:")))
    registry = make("chat=2", load_s=0.2, models=["a", "path:broken", "b"])
    registry.fail.add("broken")
    registry.start()
    await asyncio.sleep(0.05)
    assert registry.starting and registry.loading == ["a"]
    with pytest.raises(ModelLoadingError, match="not ready yet"):
        registry.check_ready("a")
    assert registry.startup is not None
    await registry.startup
    assert not registry.starting and registry.load_errors == {"path:broken": "cannot load broken"}
    assert registry.loaded_ids() == {"a", "b"}  # a model that failed leaves its place to the next one
    assert {r["keep_alive"] for r in registry.describe()} == {"forever"}
    registry.check_ready("c")  # start-up is over: other models load on demand
    await use(registry, "a")
    assert registry.loads == ["a", "broken", "b"]  # the request used the start-up load
    await registry.unload("b")  # POST /api/v1/unload
    assert registry.loaded_ids() == {"a"} and [r["id"] for r in registry.describe()] == ["a"]
    await use(registry, "c")
    await use(registry, "d")  # chat=2: the idle start-up model makes room
    assert registry.unloads == ["b", "a"] and registry.loaded_ids() == {"c", "d"}
    await registry.close()
    assert registry.records == {} and registry.engine_fake.models == set()


async def test_names_served_under_another_id_resolve_once() -> None:
    """`llama3.2` is served as `llama3.2:latest`: one lookup, then the same model."""
    lookups: list[str] = []

    def find(name: str) -> ModelSpec | None:
        lookups.append(name)
        return ModelSpec(f"{name}:latest" if ":" not in name else name, Path("/models/x.gguf"))

    registry = ScriptedRegistry(ServerSettings(), 0.0, find)
    first = await registry.hold("llama3.2")
    second = await registry.hold("llama3.2")
    assert first.model_id == second.model_id == "llama3.2:latest" and first.record is second.record
    assert lookups == ["llama3.2"] and registry.loads == ["llama3.2:latest"]
    registry.release(first)
    registry.release(second)
    await registry.unload("llama3.2")  # by the name the client knows
    assert registry.records == {}
