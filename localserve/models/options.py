"""A model's load options, from the most specific place that sets each one:

    the load request (`POST /api/v1/load` "options")
    > a flag or LOCALSERVE_* variable (`--ctx-size`, ...; any ServerSettings value not None)
    > the user's config file entry for the model id
    > the built-in catalog entry
    > MODEL_DEFAULTS (config.py)

Each option is chosen on its own, and where it came from is kept: the load
log and `/api/v1/stats` show it next to the value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from localserve.backends.device_names import canonical_device
from localserve.backends.kv_types import check_kv_types
from localserve.config import MODEL_DEFAULTS, ServerSettings
from localserve.errors import DeviceNotFoundError, InvalidRequestError, UnsupportedDeviceError
from localserve.models.catalog import ModelOptions, option_layers, parse_gpu_layers

OPTION_NAMES = (
    "ctx_size",
    "parallel",
    "kv_size",
    "device",
    "n_gpu_layers",
    "cache_type_k",
    "cache_type_v",
    "flash_attn",
)
REQUEST, FLAG, CONFIG, CATALOG, DEFAULT = "request", "flag", "config", "catalog", "default"


@dataclass(frozen=True, slots=True)
class ResolvedOptions:
    """One value per option, and where each came from."""

    ctx_size: int  # per slot; 0 = the model's training context
    parallel: int
    kv_size: int
    device: str  # a device name (backends/device_names.py): auto, cpu, gpu, gpu:N, npu, cuda, ...
    n_gpu_layers: int | None  # None = auto, -1 = all
    sources: dict[str, str] = field(default_factory=dict)  # option -> REQUEST | FLAG | CONFIG | CATALOG | DEFAULT
    cache_type_k: str = "f16"  # KV cache element types (backends/kv_types.py)
    cache_type_v: str = "f16"
    flash_attn: str = "auto"  # auto | on | off

    def explicit_gpu_layers(self) -> bool:
        """A number of GPU layers the user asked for (not the catalog's, not auto)."""
        return self.n_gpu_layers not in (None, 0) and self.sources.get("n_gpu_layers") in (REQUEST, FLAG, CONFIG)

    def settings_for(self, settings: ServerSettings) -> ServerSettings:
        """`settings` with these options filled in (for backends that read ServerSettings)."""
        import dataclasses

        return dataclasses.replace(
            settings,
            ctx_size=self.ctx_size or int(MODEL_DEFAULTS["ctx_size"]),
            parallel=self.parallel,
            kv_size=self.kv_size,
            device=self.device,
            n_gpu_layers=self.n_gpu_layers,
            cache_type_k=self.cache_type_k,
            cache_type_v=self.cache_type_v,
            flash_attn=self.flash_attn,
        )


def resolve_options(model_id: str, settings: ServerSettings, request: ModelOptions | None = None) -> ResolvedOptions:
    """The options `model_id` loads with (blocking: reads the catalog files)."""
    catalog, user = option_layers(model_id)
    flags = _settings_layer(settings)
    layers = ((REQUEST, (request or ModelOptions()).given()), (FLAG, flags), (CONFIG, user.given()),
              (CATALOG, catalog.given()), (DEFAULT, MODEL_DEFAULTS))  # fmt: skip
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name in OPTION_NAMES:
        for source, layer in layers:
            if layer.get(name) is not None:
                values[name], sources[name] = layer[name], source
                break
    layers_value = values["n_gpu_layers"]
    try:
        check_kv_types(str(values["cache_type_k"]), str(values["cache_type_v"]), str(values["flash_attn"]))
    except ValueError as exc:
        raise InvalidRequestError(f"model {model_id!r}: {exc}", param="cache_type_v") from None
    return ResolvedOptions(
        ctx_size=int(values["ctx_size"]),
        parallel=int(values["parallel"]),
        kv_size=int(values["kv_size"]),
        device=_device(model_id, values["device"]),
        n_gpu_layers=None if layers_value == "auto" else int(layers_value),
        sources=sources,
        cache_type_k=str(values["cache_type_k"]),
        cache_type_v=str(values["cache_type_v"]),
        flash_attn=str(values["flash_attn"]),
    )


def _device(model_id: str, value: Any) -> str:
    """A device name in its one spelling (`--device` and the catalog check
    theirs already; ServerSettings built in code may hold any string)."""
    try:
        return canonical_device(str(value))
    except ValueError as exc:
        raise UnsupportedDeviceError(f"model {model_id!r}: {exc}", param="device") from None


def _settings_layer(settings: ServerSettings) -> dict[str, Any]:
    layer = {name: getattr(settings, name) for name in OPTION_NAMES}
    if isinstance(layer["n_gpu_layers"], str):
        try:
            layer["n_gpu_layers"] = parse_gpu_layers(layer["n_gpu_layers"])
        except ValueError as exc:
            raise InvalidRequestError(str(exc), param="n_gpu_layers") from None
    return layer


def check_gpu_request(model_id: str, options: ResolvedOptions, gpu_offload: bool) -> None:
    """GPU layers asked for on a build without GPU offload are a load error
    that says so (`auto` just resolves to the CPU). The device name itself is
    checked by the llama.cpp resolver (backends/llamacpp/devices.place)."""
    if gpu_offload or not options.explicit_gpu_layers():
        return
    raise DeviceNotFoundError(
        f"model {model_id!r}: n_gpu_layers {options.n_gpu_layers} ({options.sources['n_gpu_layers']}) asked for "
        "GPU offload, but this llama-cpp-python build has no GPU support; present: cpu. Use n_gpu_layers 0 or "
        "auto (--n-gpu-layers), or reinstall llama-cpp-python with CMAKE_ARGS=-DGGML_CUDA=on (or Vulkan/Metal)."
    )
