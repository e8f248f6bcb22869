"""Per-model options: request > flag > user config file > catalog > default,
each option on its own; and the options reaching llama.cpp through a real
load (tiny GGUF, SmolLM2), GPU requests on a CPU build, and the memory fit."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import llama_cpp
import pytest

from localserve.backends.llamacpp.devices import place
from localserve.config import MODEL_DEFAULTS, ServerSettings
from localserve.engine.engine import Engine
from localserve.errors import DeviceNotFoundError, InvalidRequestError, UnsupportedDeviceError
from localserve.models import plan as plan_module
from localserve.models.catalog import ModelOptions, load_catalog, option_layers
from localserve.models.fit import GIB, Memory
from localserve.models.options import check_gpu_request, resolve_options
from localserve.models.registry import LoadedModel, ModelRegistry, ModelSpec, resolve
from tests.models.conftest import write_catalog

SMOL = "smollm2-135m-instruct"
CPU_BUILD = not llama_cpp.llama_supports_gpu_offload()


@pytest.fixture
def user_catalog(home: Path, tmp_path: Path) -> Path:
    return tmp_path / "catalog.json"  # what LOCALSERVE_CATALOG points at (see conftest)


def test_each_option_comes_from_the_most_specific_level(user_catalog: Path) -> None:
    write_catalog(user_catalog, [{"id": SMOL, "options": {"parallel": 3, "kv_size": 30000}}])
    settings = ServerSettings(kv_size=6000)
    request = ModelOptions(n_gpu_layers=0)
    options = resolve_options(SMOL, settings, request)
    assert (options.ctx_size, options.parallel, options.kv_size) == (8192, 3, 6000)
    assert (options.device, options.n_gpu_layers) == ("auto", 0)
    assert options.sources == {
        "ctx_size": "catalog",
        "parallel": "config",
        "kv_size": "flag",
        "device": "default",
        "n_gpu_layers": "request",
        "cache_type_k": "default",
        "cache_type_v": "default",
        "flash_attn": "default",
    }
    assert resolve_options(SMOL, ServerSettings(), ModelOptions(kv_size=1)).kv_size == 1  # request beats all


def test_defaults_for_a_model_no_file_names(user_catalog: Path) -> None:
    options = resolve_options("my-model", ServerSettings())
    assert (options.ctx_size, options.parallel, options.kv_size, options.device) == (4096, 8, 0, "auto")
    assert options.n_gpu_layers is None  # auto
    assert set(options.sources.values()) == {"default"} and MODEL_DEFAULTS["n_gpu_layers"] == "auto"


def test_a_user_entry_without_sources_sets_options(user_catalog: Path) -> None:
    write_catalog(
        user_catalog,
        [
            {"id": SMOL, "options": {"ctx_size": 2048, "n_gpu_layers": "all", "device": "CPU"}},
            {"id": "my-model", "options": {"parallel": 2}},  # served as --model my-model=PATH
        ],
    )
    catalog = load_catalog()
    assert catalog[SMOL].options == ModelOptions(ctx_size=2048, n_gpu_layers=-1, device="cpu")
    assert catalog[SMOL].sources  # the built-in entry otherwise stays
    assert "my-model" not in catalog  # options alone make no model
    builtin, user = option_layers(SMOL)
    assert builtin.ctx_size == 8192 and user.ctx_size == 2048
    assert resolve_options("my-model", ServerSettings()).parallel == 2


@pytest.mark.parametrize(
    "options",
    [
        {"ctx_size": -1},
        {"parallel": 0},
        {"device": "tpu"},
        {"n_gpu_layers": "some"},
        {"n_gpu_layers": -2},
        {"ctxsize": 1},
    ],
)
def test_bad_options_in_the_config_file_name_the_file(user_catalog: Path, options: dict[str, object]) -> None:
    write_catalog(user_catalog, [{"id": SMOL, "options": options}])
    with pytest.raises(InvalidRequestError, match="catalog.json is not a valid model catalog"):
        resolve_options(SMOL, ServerSettings())


@pytest.mark.skipif(not CPU_BUILD, reason="this llama-cpp-python build has GPU offload")
def test_gpu_asked_for_on_a_cpu_build(user_catalog: Path) -> None:
    for settings in (ServerSettings(n_gpu_layers=4), ServerSettings(n_gpu_layers="all")):
        with pytest.raises(DeviceNotFoundError, match="no GPU support; present: cpu") as exc:
            check_gpu_request("m", resolve_options("m", settings), gpu_offload=False)
        assert exc.value.status == 400
    for settings in (ServerSettings(), ServerSettings(n_gpu_layers=0), ServerSettings(n_gpu_layers="auto")):
        check_gpu_request("m", resolve_options("m", settings), gpu_offload=False)
    write_catalog(user_catalog, [])  # a catalog's own n_gpu_layers is a default, not a demand
    options = dataclasses.replace(
        resolve_options("m", ServerSettings()), n_gpu_layers=20, sources={"n_gpu_layers": "catalog"}
    )
    check_gpu_request("m", options, gpu_offload=False)
    for device in ("gpu", "GPU.1", "cuda"):  # the device name goes through llama.cpp's resolver
        with pytest.raises(DeviceNotFoundError, match="llama.cpp sees no such device here; present: cpu"):
            place(resolve_options("m", ServerSettings(device=device)).device)


def test_device_names_have_one_spelling_and_a_clear_error(user_catalog: Path) -> None:
    assert resolve_options("m", ServerSettings(device="GPU.1")).device == "gpu:1"
    with pytest.raises(UnsupportedDeviceError, match="model 'm': unknown device 'tpu'; use one of: auto, cpu"):
        resolve_options("m", ServerSettings(device="tpu"))
    write_catalog(user_catalog, [{"id": "m", "options": {"device": "DML"}}])
    options = resolve_options("m", ServerSettings())
    assert (options.device, options.sources["device"]) == ("directml", "config")


# ---- through real loads ------------------------------------------------------------------


def load(settings: ServerSettings, spec: ModelSpec) -> LoadedModel:
    async def run() -> LoadedModel:
        registry = ModelRegistry(Engine(), settings)
        try:
            loaded = await registry.load(spec)
            assert registry.load_report(spec.model_id) == loaded.report.to_json()  # type: ignore[union-attr]
            return loaded  # type: ignore[return-value]
        finally:
            await registry.close()

    return asyncio.run(run())


def test_config_file_options_reach_llama_cpp(user_catalog: Path, tiny_gguf_path: Path) -> None:
    write_catalog(user_catalog, [{"id": "tiny", "options": {"ctx_size": 256, "parallel": 3}}])
    spec = resolve(f"tiny={tiny_gguf_path}")
    loaded = load(ServerSettings(threads=1), spec)
    capacity = loaded.backend.capacity()
    assert (capacity.n_ctx, capacity.num_slots, capacity.kv_size) == (256, 3, 768)
    report = loaded.report
    assert report is not None and report.sources["ctx_size"] == "config" and report.sources["parallel"] == "config"
    assert report.kv_bytes == 768 * 2 * 2 * 32 * 2 and report.n_layers == 2
    assert report.n_gpu_layers == 0 and report.device == "CPU"
    flagged = load(ServerSettings(threads=1, parallel=2), spec)  # a flag beats the config file
    assert flagged.backend.capacity().num_slots == 2
    requested = load(ServerSettings(threads=1, parallel=2), dataclasses.replace(spec, options=ModelOptions(parallel=5)))
    assert requested.backend.capacity().num_slots == 5  # the load request beats the flag
    pooled = load(ServerSettings(threads=1, ctx_size=256, parallel=4, kv_size=512), spec)
    capacity = pooled.backend.capacity()
    assert (capacity.n_ctx, capacity.num_slots, capacity.kv_size) == (256, 4, 512)  # one pool for 4 slots
    assert pooled.report is not None and pooled.report.to_json()["kv_shared"] is True


@pytest.mark.skipif(not CPU_BUILD, reason="this llama-cpp-python build has GPU offload")
def test_gpu_layers_on_a_cpu_build_fail_the_load(home: Path, tiny_gguf_path: Path) -> None:
    with pytest.raises(DeviceNotFoundError, match="n_gpu_layers 8 \\(flag\\)"):
        load(ServerSettings(threads=1, n_gpu_layers=8), resolve(f"tiny={tiny_gguf_path}"))
    auto = load(ServerSettings(threads=1, ctx_size=256, parallel=1), resolve(f"tiny={tiny_gguf_path}"))
    assert auto.report is not None and any("auto: 0" in note for note in auto.report.notes)


@pytest.mark.slow
def test_smollm2_context_auto_fits_the_memory_it_is_given(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ctx 0 = the training context (8192). With 2.2 GiB free, 8 slots of 8192
    (1.4 GiB of KV cache) do not fit beside the weights and 1 GiB of headroom:
    the context shrinks to what does."""
    spec = resolve(SMOL)
    full = load(ServerSettings(threads=1, ctx_size=0, parallel=1), spec)
    assert full.backend.capacity().n_ctx == 8192 and full.report is not None
    assert full.report.kv_bytes == 8192 * 23040
    small = Memory(ram_available=2 * GIB + 200 * 1024 * 1024, ram_total=8 * GIB)  # headroom: 1 GiB
    monkeypatch.setattr(plan_module, "probe_memory", lambda: small)
    fitted = load(ServerSettings(threads=1, ctx_size=8192, parallel=8), spec)
    capacity = fitted.backend.capacity()
    assert 256 <= capacity.n_ctx < 8192 and capacity.n_ctx % 256 == 0 and capacity.num_slots == 8
    assert fitted.report is not None and fitted.report.ctx_per_slot == capacity.n_ctx
    assert any("must fit" in note for note in fitted.report.notes)
    assert fitted.report.kv_bytes < small.ram_available - 1 * GIB  # what the budget left after the headroom


def test_concurrent_loads_of_one_model_share_one_load(tiny_gguf_path: Path) -> None:
    """The start-up list, an on-demand request and a resumed batch's hold may
    all ask for a model while it loads: one load, one engine entry."""
    spec = resolve(f"tiny={tiny_gguf_path}")

    async def run() -> list[LoadedModel]:
        registry = ModelRegistry(Engine(), ServerSettings(threads=1, ctx_size=256, parallel=2))
        opened = 0
        real_open = registry.open_model

        def counting_open(s: ModelSpec):  # type: ignore[no-untyped-def]
            nonlocal opened
            opened += 1
            return real_open(s)

        registry.open_model = counting_open  # type: ignore[method-assign]
        try:
            loaded = await asyncio.gather(*(registry.load(spec) for _ in range(3)))
            assert opened == 1 and list(registry.engine.stats()) == ["tiny"]
            assert await registry.load(spec) is loaded[0]  # and later asks get the loaded one
            hold = await registry.hold("tiny")  # a request for it holds the same load
            assert hold.record.model is loaded[0] and opened == 1
            registry.release(hold)
            return loaded  # type: ignore[return-value]
        finally:
            await registry.close()

    first, second, third = asyncio.run(run())
    assert first is second is third
