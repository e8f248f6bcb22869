"""Fitting a GGUF model to this machine's memory: how many layers go to the
GPU and how long a context each slot gets.

The KV cache (backends/llamacpp/backend.py) is one stream of `n_ctx` cells per slot,
or, when `kv_size` is below `n_ctx * num_slots`, one pool of `kv_size` cells
the slots share (by default, when neither a context per slot nor a KV size
was asked for, one pool of one context: see `models.plan.default_kv_pool`). It takes `cells * kv_bytes_per_cell` bytes, split between
the GPU (the offloaded layers) and RAM (the rest). The fit:

1. asks for `ctx_size` per slot (0: the model's training context), never
   more than the training context;
2. offloads layers: none on a build without GPU offload (`auto` says so),
   else as many as the free GPU memory holds with their weights and their
   share of the KV cache (`auto`), or the number asked for;
3. cuts the KV cache until the part left in RAM fits the memory budget:
   available RAM (psutil) minus the weights kept in RAM, the compute buffers
   and a headroom for everything else. Streams get a shorter context per
   slot; a shared pool gets fewer cells (and the context, only if the pool
   would hold less than one slot's worth).

`fit_model` is pure (tests feed it made-up numbers); `probe_memory` reads
the machine.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import psutil

from localserve.errors import InvalidRequestError
from localserve.models.gguf_shape import GgufShape

log = logging.getLogger(__name__)

MIB = 1024 * 1024
GIB = 1024 * MIB
MIN_CTX = 256  # the shortest per-slot context worth loading a model for
CTX_STEP = 256  # a context cut to fit memory is rounded down to this
RAM_HEADROOM_SHARE, MIN_RAM_HEADROOM = 0.10, 1 * GIB  # left for the OS, the server and other models
GPU_HEADROOM_SHARE, MIN_GPU_HEADROOM = 0.05, 512 * MIB  # drivers, fragmentation
UBATCH_TOKENS = 512  # llama.cpp's micro-batch (backends/llamacpp/backend.py caps n_ubatch there)
ALL_LAYERS = -1


@dataclass(frozen=True, slots=True)
class Memory:
    """What the machine has free now."""

    ram_available: int
    ram_total: int
    gpu_free: int = 0  # summed over GPU devices; 0 without any
    gpu_total: int = 0
    gpu_names: tuple[str, ...] = ()
    gpu_offload: bool = False  # this llama.cpp build can offload layers


ONE_CONTEXT_POOL = -1  # FitRequest.kv_size: the slots share one pool of one context (ctx_size cells)


@dataclass(frozen=True, slots=True)
class FitRequest:
    """The options that size a load (already resolved: request > flag > config > catalog > default)."""

    ctx_size: int  # per slot; 0 = the model's training context
    num_slots: int
    kv_size: int = (
        0  # KV cells over all slots; 0 = ctx_size * num_slots; ONE_CONTEXT_POOL = one context's cells, shared
    )
    n_gpu_layers: int | None = None  # None = auto, -1 = all
    use_gpu: bool = True  # False: device cpu


@dataclass(frozen=True, slots=True)
class Fit:
    """The sizes a model is loaded with, and why."""

    n_ctx: int  # per slot
    num_slots: int
    kv_size: int  # KV cells of all slots together
    shared_pool: bool  # kv_size < n_ctx * num_slots: the slots share one pool (else one stream each)
    n_gpu_layers: int  # -1 = all (output head included)
    n_layers: int
    kv_bytes: int  # the whole KV cache, every slot
    kv_bytes_gpu: int
    weight_bytes_ram: int
    notes: tuple[str, ...] = field(default=())

    @property
    def num_gpu_layers(self) -> int:
        return self.n_layers if self.n_gpu_layers == ALL_LAYERS else self.n_gpu_layers


def fit_model(shape: GgufShape, memory: Memory, want: FitRequest) -> Fit:
    """Pick the per-slot context and the GPU layers for `shape` on `memory` (see the module docstring)."""
    notes: list[str] = []
    num_slots = max(1, want.num_slots)
    ctx = want.ctx_size or shape.n_ctx_train or 4096
    if shape.n_ctx_train and ctx > shape.n_ctx_train:
        notes.append(f"ctx {ctx} > the model's training context: {shape.n_ctx_train}")
        ctx = shape.n_ctx_train
    if want.kv_size == ONE_CONTEXT_POOL:
        cells = ctx
    else:
        cells = max(want.kv_size, ctx) if 0 < want.kv_size < ctx * num_slots else ctx * num_slots
    layers = _gpu_layers(shape, memory, want, cells, notes)
    on_gpu = shape.n_layers if layers == ALL_LAYERS else layers
    kv_gpu_per_cell = sum(shape.kv_bytes_per_layer[:on_gpu])
    kv_ram_per_cell = shape.kv_bytes_per_cell - kv_gpu_per_cell
    weights_ram = shape.weight_bytes - sum(shape.layer_bytes[:on_gpu])
    if layers == ALL_LAYERS:
        weights_ram -= _output_bytes(shape)
    if kv_ram_per_cell:
        budget = memory.ram_available - weights_ram - _compute_bytes(shape, ctx, num_slots) - _ram_headroom(memory)
        ctx, cells = _cap_cells(ctx, cells, num_slots, budget // kv_ram_per_cell, f"{_gib(budget)} of free RAM", notes)
    if on_gpu and kv_gpu_per_cell:
        budget = memory.gpu_free - sum(shape.layer_bytes[:on_gpu]) - _gpu_headroom(memory)
        what = f"{_gib(budget)} of free GPU memory"
        ctx, cells = _cap_cells(ctx, cells, num_slots, budget // kv_gpu_per_cell, what, notes)
    return Fit(
        n_ctx=ctx,
        num_slots=num_slots,
        kv_size=cells,
        shared_pool=cells < ctx * num_slots,
        n_gpu_layers=layers,
        n_layers=shape.n_layers,
        kv_bytes=cells * shape.kv_bytes_per_cell,
        kv_bytes_gpu=cells * kv_gpu_per_cell,
        weight_bytes_ram=weights_ram,
        notes=tuple(notes),
    )


def _gpu_layers(shape: GgufShape, memory: Memory, want: FitRequest, kv_size: int, notes: list[str]) -> int:
    if not want.use_gpu:
        return 0
    if not memory.gpu_offload or not memory.gpu_free:
        if want.n_gpu_layers is None:
            notes.append("n_gpu_layers auto: 0 (no GPU: this llama.cpp build has no GPU offload)")
        return 0  # an explicit count on a CPU build was refused before the fit
    if want.n_gpu_layers is not None:
        wanted = want.n_gpu_layers
        return ALL_LAYERS if wanted < 0 or wanted > shape.n_layers else wanted
    budget = memory.gpu_free - _gpu_headroom(memory) - _compute_bytes(shape, kv_size, 1)
    layers = 0
    for weights, kv_cell in zip(shape.layer_bytes, shape.kv_bytes_per_layer, strict=True):
        cost = weights + kv_cell * kv_size
        if cost > budget:
            break
        budget -= cost
        layers += 1
    if layers == shape.n_layers and budget >= _output_bytes(shape):
        notes.append(
            f"n_gpu_layers auto: all {shape.n_layers} layers fit in {_gib(memory.gpu_free)} of free GPU memory"
        )
        return ALL_LAYERS
    notes.append(
        f"n_gpu_layers auto: {layers} of {shape.n_layers} layers fit in {_gib(memory.gpu_free)} of free GPU memory"
    )
    return layers


def _cap_cells(ctx: int, cells: int, num_slots: int, max_cells: int, what: str, notes: list[str]) -> tuple[int, int]:
    """(ctx per slot, KV cells) cut so that at most `max_cells` cells are needed:
    streams (cells = ctx * num_slots) lose context per slot; a shared pool
    loses cells first, and context only below one slot's worth."""
    if cells <= max_cells:
        return ctx, cells
    shared = cells < ctx * num_slots
    fitting_ctx = max(0, max_cells) // (1 if shared else num_slots) // CTX_STEP * CTX_STEP
    if fitting_ctx < MIN_CTX:
        raise InvalidRequestError(
            f"not enough memory for the KV cache: {what} holds {max(0, fitting_ctx)} tokens per slot, "
            f"{MIN_CTX} at least are needed; lower --parallel or --ctx-size, or unload another model",
            param="ctx_size",
        )
    if shared:
        pool = max(0, max_cells) // CTX_STEP * CTX_STEP
        new_ctx = min(ctx, pool)
        notes.append(f"shared KV pool {cells} -> {pool} cells (ctx {new_ctx} per slot): it must fit {what}")
        return new_ctx, pool
    notes.append(f"ctx {ctx} -> {fitting_ctx} per slot: the KV cache of {num_slots} slots must fit {what}")
    return fitting_ctx, fitting_ctx * num_slots


def _compute_bytes(shape: GgufShape, ctx: int, num_slots: int) -> int:
    """llama.cpp's compute and output buffers: mostly the logits of a micro-batch
    (measured on SmolLM2: 98 MiB compute + 1.5 MiB output at 8 x 8192)."""
    logits = UBATCH_TOKENS * shape.n_vocab * 4
    activations = UBATCH_TOKENS * shape.n_embd * 4 * 16
    mask = UBATCH_TOKENS * ctx * 2
    return logits + activations + mask + num_slots * shape.n_vocab * 4


def _output_bytes(shape: GgufShape) -> int:
    """The output head and norm: offloaded only with every layer (llama.cpp keeps token embeddings in RAM)."""
    return shape.other_bytes // 2 if shape.other_bytes else 0


def _ram_headroom(memory: Memory) -> int:
    return max(MIN_RAM_HEADROOM, int(memory.ram_total * RAM_HEADROOM_SHARE))


def _gpu_headroom(memory: Memory) -> int:
    return max(MIN_GPU_HEADROOM, int(memory.gpu_total * GPU_HEADROOM_SHARE))


def _gib(num_bytes: int) -> str:
    num_bytes = max(0, num_bytes)
    return f"{num_bytes / GIB:.1f} GiB" if num_bytes >= GIB else f"{num_bytes / MIB:.0f} MiB"


# ---- the machine -------------------------------------------------------------------------

_GGML_GPU_TYPES = (1, 2)  # enum ggml_backend_dev_type: CPU=0, GPU=1, IGPU=2, ACCEL=3, META=4


def probe_memory() -> Memory:
    """Free RAM now, and free memory of the GPUs llama.cpp sees."""
    vm = psutil.virtual_memory()
    offload, gpus = gpu_devices()
    return Memory(
        ram_available=int(vm.available),
        ram_total=int(vm.total),
        gpu_free=sum(free for _, free, _ in gpus),
        gpu_total=sum(total for _, _, total in gpus),
        gpu_names=tuple(name for name, _, _ in gpus),
        gpu_offload=offload,
    )


def gpu_devices() -> tuple[bool, list[tuple[str, int, int]]]:
    """(GPU offload supported, [(name, free bytes, total bytes)] per GPU device, in `gpu:N` order)."""
    import llama_cpp

    from localserve.backends.llamacpp.devices import init_llama

    init_llama()
    if not llama_cpp.llama_supports_gpu_offload():
        return False, []
    return True, [(name, free, total) for name, kind, free, total in ggml_devices() if kind in _GGML_GPU_TYPES]


def ggml_devices() -> list[tuple[str, int, int, int]]:
    """[(description, ggml device type, free bytes, total bytes)] of every device llama.cpp sees
    (backends/llamacpp/devices.py asks ggml)."""
    from localserve.backends.llamacpp.devices import ggml_devices as ask_ggml

    return [(d.description or d.name, d.type, d.free, d.total) for d in ask_ggml()]
