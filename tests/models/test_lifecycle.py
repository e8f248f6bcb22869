"""ModelLifecycle with a scripted manager: shared loads, LRU eviction of idle
models only, keep_alive and the reaper. No model files, no threads."""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from localserve.config import ServerSettings
from localserve.errors import InvalidRequestError, ModelLoadingError, ModelNotFoundError, QueueFullError
from localserve.models import lifecycle as lifecycle_module
from localserve.models.catalog import ModelOptions
from localserve.models.lifecycle import ModelLifecycle
from localserve.models.registry import ModelSpec

LABELS = {"emb": ("embeddings",), "asr": ("transcription",)}


@dataclass
class FakeEngine:
    in_flight: Counter[str] = field(default_factory=Counter)
    models: set[str] = field(default_factory=set)

    def has_model(self, model_id: str) -> bool:
        return model_id in self.models

    def num_in_flight(self, model_id: str) -> int:
        return self.in_flight[model_id]


@dataclass
class Loaded:
    spec: ModelSpec
    load_seconds: float = 0.0


class FakeManager:
    """Records loads and unloads; a load takes `load_s` and may be told to fail."""

    def __init__(self, load_s: float = 0.02) -> None:
        self.engine = FakeEngine()
        self.loaded: dict[str, Loaded] = {}
        self.oneshot: dict[str, Any] = {}
        self.load_s = load_s
        self.loads: list[str] = []
        self.unloads: list[str] = []
        self.fail: set[str] = set()

    async def load(self, spec: ModelSpec) -> Loaded:
        self.loads.append(spec.model_id)
        await asyncio.sleep(self.load_s)
        if spec.model_id in self.fail:
            raise ModelLoadingError(f"cannot load {spec.model_id}")
        self.loaded[spec.model_id] = Loaded(spec)
        self.engine.models.add(spec.model_id)
        return self.loaded[spec.model_id]

    def load_report(self, model_id: str) -> dict[str, Any]:
        return {"ctx_per_slot": 512} if model_id in self.loaded else {}

    async def unload(self, model_id: str) -> None:
        self.unloads.append(model_id)
        del self.loaded[model_id]
        self.engine.models.discard(model_id)
        await asyncio.sleep(0)


def find_spec(model_id: str) -> ModelSpec | None:
    if model_id.startswith("unknown"):
        return None
    return ModelSpec(model_id, Path(f"/models/{model_id}.gguf"), LABELS.get(model_id.split("-")[0], ("chat",)))


def make(max_loaded: str = "chat=2", keep_alive: str = "", load_s: float = 0.02) -> tuple[ModelLifecycle, FakeManager]:
    manager = FakeManager(load_s)
    settings = ServerSettings(max_loaded_models=max_loaded, keep_alive=keep_alive)
    return ModelLifecycle(manager, settings, find_spec=find_spec), manager  # type: ignore[arg-type]


async def use(lifecycle: ModelLifecycle, model_id: str, keep_alive: object = None) -> None:
    lifecycle.release(await lifecycle.acquire(model_id, keep_alive=keep_alive))


async def test_concurrent_requests_share_one_load() -> None:
    lifecycle, manager = make(load_s=0.1)
    leases = await asyncio.gather(*(lifecycle.acquire("a") for _ in range(8)))
    assert manager.loads == ["a"] and {lease.record.state for lease in leases} == {"loaded"}
    assert lifecycle.records["a"].num_users == 8
    for lease in leases:
        lifecycle.release(lease)
    assert lifecycle.records["a"].num_users == 0


async def test_lru_eviction_order() -> None:
    lifecycle, manager = make("chat=2,embeddings=1")
    for model_id in ("a", "b", "a"):  # b is now the least recently used
        await use(lifecycle, model_id)
    await use(lifecycle, "c")
    assert manager.unloads == ["b"] and set(manager.loaded) == {"a", "c"}
    await use(lifecycle, "d")  # a was used before c
    assert manager.unloads == ["b", "a"] and set(manager.loaded) == {"c", "d"}
    await use(lifecycle, "emb-1")  # other kinds have their own limit
    await use(lifecycle, "emb-2")
    assert manager.unloads == ["b", "a", "emb-1"] and set(manager.loaded) == {"c", "d", "emb-2"}


async def test_busy_models_are_never_evicted(monkeypatch: pytest.MonkeyPatch) -> None:
    lifecycle, manager = make("chat=1")
    held = await lifecycle.acquire("a")  # a request holds a
    loading_b = asyncio.create_task(use(lifecycle, "b"))
    await asyncio.sleep(0.4)
    assert not loading_b.done() and manager.unloads == []  # b waits for a room
    lifecycle.release(held)
    manager.engine.in_flight["a"] = 1  # ... and a's engine still has work (e.g. a batch job)
    await asyncio.sleep(0.4)
    assert not loading_b.done() and manager.unloads == []
    manager.engine.in_flight["a"] = 0
    await asyncio.wait_for(loading_b, 2)
    assert manager.unloads == ["a"] and set(manager.loaded) == {"b"}

    monkeypatch.setattr(lifecycle_module, "EVICT_WAIT_S", 0.3)
    held = await lifecycle.acquire("b")
    with pytest.raises(QueueFullError, match="busy"):
        await lifecycle.acquire("c")
    assert "c" not in lifecycle.records and set(manager.loaded) == {"b"}
    lifecycle.release(held)


async def test_keep_alive_zero_unloads_after_the_request() -> None:
    lifecycle, manager = make()
    lifecycle.start()
    try:
        lease = await lifecycle.acquire("a", keep_alive=0)
        await asyncio.sleep(0.2)
        assert "a" in manager.loaded  # held: never unloaded mid-request
        lifecycle.release(lease)
        for _ in range(50):
            if "a" not in manager.loaded:
                break
            await asyncio.sleep(0.02)
        assert manager.unloads == ["a"]
    finally:
        await lifecycle.stop()


async def test_keep_alive_durations_and_defaults() -> None:
    lifecycle, manager = make("0")  # no limit: only keep_alive unloads here
    await use(lifecycle, "on-demand")
    assert lifecycle.records["on-demand"].keep_alive_s == 300.0  # Ollama's 5m default
    await use(lifecycle, "short", keep_alive="250ms")
    await use(lifecycle, "forever", keep_alive=-1)
    manager.loaded["startup"] = Loaded(find_spec("startup"))  # type: ignore[arg-type]
    lifecycle.sync()
    assert lifecycle.records["startup"].keep_alive_s == math.inf  # --model ones stay
    for record in lifecycle.records.values():
        record.last_used -= 100.0  # as if idle for 100 s
    await lifecycle.reap()
    assert set(manager.loaded) == {"on-demand", "forever", "startup"}
    await use(lifecycle, "on-demand")  # a request without keep_alive goes back to the default
    assert lifecycle.records["on-demand"].keep_alive_s == 300.0

    explicit, manager = make(keep_alive="1s")
    manager.loaded["startup"] = Loaded(find_spec("startup"))  # type: ignore[arg-type]
    explicit.sync()
    assert explicit.records["startup"].keep_alive_s == 1.0  # an explicit --keep-alive applies to all


async def test_errors_reach_every_waiter_and_leave_nothing_behind() -> None:
    lifecycle, manager = make(load_s=0.05)
    manager.fail.add("broken")
    results = await asyncio.gather(*(lifecycle.acquire("broken") for _ in range(3)), return_exceptions=True)
    assert all(isinstance(r, ModelLoadingError) for r in results) and manager.loads == ["broken"]
    assert "broken" not in lifecycle.records
    with pytest.raises(ModelNotFoundError):
        await lifecycle.acquire("unknown-model")
    with pytest.raises(InvalidRequestError, match="embeddings model"):
        await lifecycle.acquire("emb-x", kind="chat")
    with pytest.raises(InvalidRequestError, match="invalid model id"):
        await lifecycle.acquire("../x")
    with pytest.raises(InvalidRequestError, match="keep_alive"):
        await lifecycle.acquire("a", keep_alive="soon")
    assert manager.loads == ["broken"]


async def test_a_cancelled_request_does_not_cancel_the_shared_load() -> None:
    lifecycle, manager = make(load_s=0.2)
    first = asyncio.create_task(lifecycle.acquire("a"))
    await asyncio.sleep(0.05)
    first.cancel()
    lease = await lifecycle.acquire("a")
    assert manager.loads == ["a"] and lifecycle.records["a"].num_users == 1
    lifecycle.release(lease)


async def test_unload_and_describe() -> None:
    lifecycle, manager = make()
    await use(lifecycle, "a", keep_alive="10m")
    [row] = lifecycle.describe()
    assert row["id"] == "a" and row["keep_alive"] == "10m" and 590 < row["expires_in_s"] <= 600  # type: ignore[operator]
    assert row["options"] == {"ctx_per_slot": 512}  # the manager's load report
    await lifecycle.unload("a")
    assert manager.unloads == ["a"] and lifecycle.describe() == []
    with pytest.raises(ModelNotFoundError):
        await lifecycle.unload("a")


async def test_load_options_go_to_the_load_and_other_options_need_an_unload() -> None:
    lifecycle, manager = make()
    wanted = ModelOptions(ctx_size=1024, parallel=2)
    lifecycle.release(await lifecycle.acquire("a", options=wanted))
    assert lifecycle.records["a"].spec.options == wanted
    lifecycle.release(await lifecycle.acquire("a"))  # plain requests use it as loaded
    lifecycle.release(await lifecycle.acquire("a", options=ModelOptions(ctx_size=1024, parallel=2)))
    with pytest.raises(InvalidRequestError, match="unload it first") as exc:
        await lifecycle.acquire("a", options=ModelOptions(ctx_size=2048))
    assert exc.value.param == "options"
    await lifecycle.unload("a")
    lifecycle.release(await lifecycle.acquire("a"))  # loaded again on demand: its own options, not the request's
    assert lifecycle.records["a"].spec.options == ModelOptions() and manager.loads == ["a", "a"]


async def test_a_held_lease_outlives_keep_alive_zero_and_lru() -> None:
    """What the batch runner relies on: while it holds a model, neither the
    reaper nor a load that needs room unloads it."""
    lifecycle, manager = make("chat=1", keep_alive="0")
    held = await lifecycle.acquire("a")
    await use(lifecycle, "a", keep_alive=0)  # a line of the batch, asking to unload right after it
    assert await lifecycle.reap() > 0 and manager.unloads == []
    other = asyncio.create_task(use(lifecycle, "b"))
    await asyncio.sleep(0.3)
    assert not other.done() and manager.unloads == [] and "a" in manager.loaded
    lifecycle.release(held)
    await asyncio.wait_for(other, 2)
    assert manager.unloads == ["a"]
