"""What a model is loaded with: its options resolved (models/options.py),
fitted to the machine (models/fit.py) for a GGUF, turned into the backend's
config, and reported (the load log, `/api/v1/stats`, `/api/v1/loaded`,
`localserve list`).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localserve.backends.kv_types import kv_bytes_scale
from localserve.backends.llamacpp.backend import LlamaCppConfig
from localserve.backends.llamacpp.devices import place
from localserve.config import ServerSettings
from localserve.engine.types import Capacity
from localserve.models.catalog import ModelOptions
from localserve.models.fit import (
    MIB,
    ONE_CONTEXT_POOL,
    Fit,
    FitRequest,
    Memory,
    fit_model,
    gpu_devices,
    probe_memory,
)
from localserve.models.gguf_shape import GgufShape, read_gguf_shape
from localserve.models.options import CATALOG, DEFAULT, ResolvedOptions, check_gpu_request, resolve_options

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LoadReport:
    """The effective options of a loaded model, and why they are what they are."""

    ctx_per_slot: int
    num_slots: int
    kv_size: int
    kv_bytes: int  # 0 when unknown (not a GGUF)
    n_gpu_layers: int  # layers offloaded (all of them: n_layers)
    n_layers: int  # 0 when unknown
    device: str
    sources: dict[str, str] = field(default_factory=dict)  # option -> where its value came from
    notes: tuple[str, ...] = ()  # what the auto-fit decided
    weight_bytes: int = 0  # every tensor of the model; 0 when unknown (not a GGUF)
    cache_type_k: str | None = None  # KV cache element types and flash attention (llama.cpp only)
    cache_type_v: str | None = None
    flash_attn: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "ctx_per_slot": self.ctx_per_slot,
            "parallel": self.num_slots,
            "kv_tokens": self.kv_size,
            "kv_mib": round(self.kv_bytes / MIB, 1),
            "cache_type_k": self.cache_type_k,
            "cache_type_v": self.cache_type_v,
            "flash_attn": self.flash_attn,
            "weights_mib": round(self.weight_bytes / MIB, 1),
            "kv_shared": self.kv_size < self.ctx_per_slot * self.num_slots,  # one pool for all slots
            "n_gpu_layers": self.n_gpu_layers,
            "n_layers": self.n_layers,
            "device": self.device,
            "sources": dict(self.sources),
            "fit": list(self.notes),
        }

    def summary(self) -> str:
        """One line for the load log and `localserve list`."""
        gpu = f"{self.n_gpu_layers}/{self.n_layers}" if self.n_layers else str(self.n_gpu_layers)
        kv = f", KV {self.kv_bytes / MIB:.0f} MiB" if self.kv_bytes else ""
        if self.kv_bytes and (self.cache_type_k, self.cache_type_v) != ("f16", "f16"):
            kv += f" {self.cache_type_k}/{self.cache_type_v}"
        if self.kv_size < self.ctx_per_slot * self.num_slots:
            kv += f" (one pool of {self.kv_size} cells)"
        return f"ctx {self.ctx_per_slot} x {self.num_slots} slots, GPU layers {gpu}{kv}"


@dataclass(frozen=True, slots=True)
class LlamaCppPlan:
    """A GGUF model's backend config, and what to report once it is loaded."""

    config: LlamaCppConfig
    options: ResolvedOptions
    shape: GgufShape
    fit: Fit

    def report(self, capacity: Capacity, device: str) -> LoadReport:
        """The report, with the context the backend really made."""
        per_slot = capacity.n_ctx
        return LoadReport(
            ctx_per_slot=per_slot,
            num_slots=capacity.num_slots,
            kv_size=capacity.kv_size,
            kv_bytes=capacity.kv_size * self.shape.kv_bytes_per_cell,
            n_gpu_layers=self.fit.num_gpu_layers if device != "CPU" else 0,
            n_layers=self.shape.n_layers,
            device=device,
            sources=self.options.sources,
            notes=self.fit.notes,
            weight_bytes=self.shape.weight_bytes,
            cache_type_k=self.config.cache_type_k,
            cache_type_v=self.config.cache_type_v,
            flash_attn=self.config.flash_attn,
        )


def plan_llamacpp(model_id: str, path: Path, settings: ServerSettings, request: ModelOptions) -> LlamaCppPlan:
    """Resolve, check and fit a GGUF model's options (blocking: reads the GGUF header and the catalog)."""
    return plan_resolved(model_id, path, settings, resolve_options(model_id, settings, request))


def plan_resolved(model_id: str, path: Path, settings: ServerSettings, options: ResolvedOptions) -> LlamaCppPlan:
    """Check and fit a GGUF model's resolved options to memory (blocking: reads the GGUF header)."""
    memory = probe_memory()
    check_gpu_request(model_id, options, memory.gpu_offload)
    placement = place(options.device)  # a device llama.cpp cannot use fails here, before the fit
    if placement.main_gpu is not None:  # gpu:N: that GPU's memory only
        memory = on_one_gpu(memory, placement.main_gpu)
    shape = with_kv_types(read_gguf_shape(path), options.cache_type_k, options.cache_type_v)
    want = FitRequest(
        ctx_size=options.ctx_size,
        num_slots=options.parallel,
        kv_size=ONE_CONTEXT_POOL if default_kv_pool(options) else options.kv_size,
        n_gpu_layers=options.n_gpu_layers,
        use_gpu=options.device != "cpu",  # auto on a CPU build: the fit notes why no layer is offloaded
    )
    fit = fit_model(shape, memory, want)
    config = LlamaCppConfig(
        model_path=str(path),
        n_ctx=fit.n_ctx,
        num_slots=fit.num_slots,
        kv_size=fit.kv_size if fit.shared_pool else 0,  # 0: one stream of n_ctx cells per slot
        step_tokens=settings.batch_tokens,
        n_threads=settings.cpu_threads,
        device=options.device,
        n_gpu_layers=fit.n_gpu_layers,
        cache_type_k=options.cache_type_k,
        cache_type_v=options.cache_type_v,
        flash_attn=options.flash_attn,
        draft_model_path=str(Path(settings.draft_model).expanduser()) if settings.draft_model else "",
    )
    for note in fit.notes:
        log.info("%s: %s", model_id, note)
    return LlamaCppPlan(config, options, shape, fit)


def on_one_gpu(memory: Memory, index: int) -> Memory:
    """`memory` as a model held by GPU `index` alone sees it."""
    _, gpus = gpu_devices()
    name, free, total = gpus[index]
    return dataclasses.replace(memory, gpu_free=free, gpu_total=total, gpu_names=(name,))


def default_kv_pool(options: ResolvedOptions) -> bool:
    """Nobody chose the KV size nor a context per slot: the slots then share
    one pool of one context's cells, as llama-server's default does (a
    stream of the training context per slot took 1.6 GB for the 98 MB
    default model). Asking for `ctx_size` (or `kv_size` 0) gives each slot
    its own stream of that length, which decodes many sequences faster."""
    return options.sources.get("kv_size") == DEFAULT and options.sources.get("ctx_size") in (CATALOG, DEFAULT)


def with_kv_types(shape: GgufShape, type_k: str, type_v: str) -> GgufShape:
    """`shape` with its KV bytes for these cache types (the GGUF reader counts f16)."""
    scale = kv_bytes_scale(type_k, type_v)
    return dataclasses.replace(shape, kv_bytes_per_layer=tuple(round(b * scale) for b in shape.kv_bytes_per_layer))


def plain_report(options: ResolvedOptions, capacity: Capacity, device: str) -> LoadReport:
    """The report of a model without a GGUF (ONNX, OpenVINO): no fit, no layer counts."""
    return LoadReport(
        ctx_per_slot=capacity.n_ctx,
        num_slots=capacity.num_slots,
        kv_size=capacity.kv_size,
        kv_bytes=0,
        n_gpu_layers=0,
        n_layers=0,
        device=device,
        sources=options.sources,
    )
