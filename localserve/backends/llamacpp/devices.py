"""What llama.cpp runs on: its one-time initialisation, the devices ggml
sees, and where a device name puts a model's layers.

llama-cpp-python 0.3.36 has no Python binding for ggml's device API, but
the ggml library it loads exports it (`ggml_backend_dev_count/get/type/
name/description/memory`, see ggml-backend.h). A GPU is a ggml device of
type GPU or IGPU; `gpu:N` counts those in registry order, which is the
order llama.cpp's `main_gpu` counts in.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

import llama_cpp

from localserve.backends.device_names import AUTO, CPU, GPU, DeviceTable, Present
from localserve.backends.llamacpp import selfcheck
from localserve.errors import LlamaCppBuildError, LocalServeError

log = logging.getLogger(__name__)

#: ggml device names start with their API: CUDA0, ROCm0, Vulkan0, Metal.
_API_PREFIXES = {"cuda": "CUDA", "rocm": "ROCm", "vulkan": "Vulkan", "metal": "Metal"}
_GGML_GPU_TYPES = (1, 2)  # enum ggml_backend_dev_type: CPU=0, GPU=1, IGPU=2, ACCEL=3, META=4

LLAMACPP = DeviceTable(
    "llama.cpp",
    accepts=(AUTO, CPU, GPU, *_API_PREFIXES),
    auto=(GPU, CPU),
    hint="A GPU needs a llama-cpp-python build with GPU support: reinstall it with CMAKE_ARGS=-DGGML_CUDA=on "
    "(or Vulkan/Metal; see README).",
)

_init_lock = threading.Lock()
_log_callback = None  # must stay referenced for the life of the process


def init_llama() -> None:
    """Initialise llama.cpp once per process and route its log to ours."""
    global _log_callback
    with _init_lock:
        if _log_callback is not None:
            return
        llama_cpp.llama_backend_init()

        @llama_cpp.llama_log_callback
        def forward(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
            log.debug("llama.cpp: %s", text.decode("utf-8", errors="replace").rstrip())

        _log_callback = forward
        llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
        # Native code may still log while the interpreter finalizes (static
        # destructors, threads of contexts freed late); a Python callback then
        # aborts the process. Hand logging back to llama.cpp's own (a NULL
        # callback) before that.
        atexit.register(llama_cpp.llama_log_set, llama_cpp.llama_log_callback(), ctypes.c_void_p(0))


@dataclass(frozen=True, slots=True)
class GgmlDevice:
    """One device of ggml's registry."""

    name: str  # CPU, CUDA0, Vulkan1, Metal
    description: str  # the hardware: "NVIDIA H200", the CPU model
    type: int  # enum ggml_backend_dev_type
    free: int  # bytes
    total: int

    @property
    def is_gpu(self) -> bool:
        return self.type in _GGML_GPU_TYPES


def ggml_devices() -> list[GgmlDevice]:
    """Every device llama.cpp sees, in registry order (initialises llama.cpp)."""
    init_llama()
    lib = _ggml()
    out = []
    for index in range(lib.ggml_backend_dev_count()):
        device = lib.ggml_backend_dev_get(index)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(device, ctypes.byref(free), ctypes.byref(total))
        name = (lib.ggml_backend_dev_name(device) or b"?").decode()
        description = (lib.ggml_backend_dev_description(device) or b"").decode()
        out.append(GgmlDevice(name, description, int(lib.ggml_backend_dev_type(device)), free.value, total.value))
    return out


def present_devices(devices: list[GgmlDevice] | None = None) -> list[Present]:
    """The GPUs (`gpu:N`, also named by their API) then the CPU, under our names."""
    if devices is None:
        init_llama()
        devices = ggml_devices() if llama_cpp.llama_supports_gpu_offload() else []
    gpus = [d for d in devices if d.is_gpu]
    present = []
    for index, gpu in enumerate(gpus):
        apis = {api for api, prefix in _API_PREFIXES.items() if gpu.name.startswith(prefix)}
        present.append(Present(f"gpu:{index}", gpu.name, frozenset({GPU, *apis}), index, gpu.description))
    present.append(Present(CPU, "CPU", frozenset({CPU})))
    return present


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a model's layers go."""

    use_gpu: bool
    main_gpu: int | None  # one GPU only (split mode none); None: layers split over every GPU
    label: str  # BackendInfo.device: CPU, GPU, GPU:1

    def apply(self, params: llama_cpp.llama_model_params, n_gpu_layers: int) -> None:
        """Fill llama.cpp's model parameters: layers offloaded, which GPU."""
        params.n_gpu_layers = n_gpu_layers if self.use_gpu else 0
        if self.main_gpu is not None:
            params.split_mode = llama_cpp.LLAMA_SPLIT_MODE_NONE
            params.main_gpu = self.main_gpu


def place(device: str, present: list[Present] | None = None) -> Placement:
    """The placement for a device name; UnsupportedDeviceError or
    DeviceNotFoundError (both 400) name what llama.cpp can use here."""
    wanted, found = LLAMACPP.resolve(device, present_devices() if present is None else present)
    if CPU in found[0].kinds:
        return Placement(False, None, "CPU")
    if wanted.index is None:  # llama.cpp's default: the layers split over every GPU
        return Placement(True, None, "GPU")
    return Placement(True, found[0].index, f"GPU:{found[0].index}")


def load_model(
    path: Path, device: str, n_gpu_layers: int, *, embeddings: bool = False
) -> tuple[llama_cpp.llama_model_p, str]:
    """Load a GGUF file's weights on `device` (after `init_llama`): the model
    handle and the device label. What both llama.cpp backends do first; a
    missing or unreadable file is a LocalServeError that names it. The first
    load with a llama.cpp library checks in a child process that it runs on
    this CPU (`ensure_runs_here`)."""
    if not path.is_file():
        raise LocalServeError(f"model file not found: {path}")
    ensure_runs_here(path, embeddings=embeddings)
    placement = place(device)
    params = llama_cpp.llama_model_default_params()
    placement.apply(params, n_gpu_layers)
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise LocalServeError(f"llama.cpp could not load {path}; is it a GGUF file of a supported architecture?")
    return model, placement.label


def ensure_runs_here(path: Path, *, embeddings: bool = False) -> None:
    """Refuse, in one line that names the fix, a llama.cpp library that dies
    in a decode on this CPU (selfcheck.py): better a clear error than a
    server killed by its first request."""
    verdict = selfcheck.library_verdict(path, embeddings=embeddings)
    if verdict.signal:
        raise LlamaCppBuildError(
            f"this llama-cpp-python build crashes on this CPU ({verdict.detail} while decoding {path.name} in a "
            f"child process; likely AMX kernels, see README); {selfcheck.FIX}"
        )
    if not verdict.ok:
        log.warning("llama.cpp's decode check was inconclusive (%s); loading %s anyway", verdict.detail, path.name)


def available_devices() -> list[str]:
    """Our names of what llama.cpp can run on here, best first for `auto`."""
    return [p.name for p in present_devices()]


@functools.cache
def _ggml() -> ctypes.CDLL:
    from llama_cpp._ggml import libggml as lib

    ptr, size = ctypes.c_void_p, ctypes.c_size_t
    for name, args, result in (
        ("ggml_backend_dev_count", [], size),
        ("ggml_backend_dev_get", [size], ptr),
        ("ggml_backend_dev_type", [ptr], ctypes.c_int),
        ("ggml_backend_dev_name", [ptr], ctypes.c_char_p),
        ("ggml_backend_dev_description", [ptr], ctypes.c_char_p),
        ("ggml_backend_dev_memory", [ptr, ctypes.POINTER(size), ctypes.POINTER(size)], None),
    ):
        function = getattr(lib, name)
        function.argtypes, function.restype = args, result
    return lib  # type: ignore[no-any-return]


def warm_up(model: llama_cpp.llama_model_p, ctx: llama_cpp.llama_context_p, batch: llama_cpp.llama_batch) -> None:
    """Decode one token in `ctx` and forget it, as llama-server does at start
    (its --no-warmup turns that off): otherwise the first request of a fresh
    process pays for the weights' first touch (the mmap's page faults) and
    the compute buffers' first use. `llama_set_warmup` makes a
    mixture-of-experts graph touch every expert. Unlike llama-server, the KV
    cells are cleared without zeroing their memory: that would commit the
    whole KV buffer at start (8 slots x 4,096 tokens of SmolLM2 are 750 MB),
    where a slot's pages are otherwise touched only as it fills.

    Call it on the thread that will decode in `ctx` for good (the step
    thread: `GenerativeBackend.warm_up`), never on the thread that loaded the
    model. llama.cpp's CPU backend computes in an OpenMP team, and libgomp
    keeps one pool of worker threads per thread that ever started a team;
    once the process's pools hold more threads than there are CPUs, every
    barrier wait in every pool spins only 100 times before it sleeps
    (libgomp's "throttled" spin count), as if OMP_WAIT_POLICY were PASSIVE.
    One decode here from the loading thread left a second pool behind and
    cost one stream 35-45% of its speed on 2 cores for the life of the
    process (issue 39)."""
    vocab = llama_cpp.llama_model_get_vocab(model)
    token = llama_cpp.llama_vocab_bos(vocab)
    if token < 0:
        token = max(0, llama_cpp.llama_vocab_eos(vocab))
    llama_cpp.llama_set_warmup(ctx, True)
    try:
        if llama_cpp.llama_model_has_decoder(model):
            batch.token[0] = token
            batch.pos[0] = 0  # type: ignore[call-overload]  # a llama_pos*; the stubs say an array of arrays
            batch.n_seq_id[0] = 1
            batch.seq_id[0][0] = 0
            batch.logits[0] = 1
            batch.n_tokens = 1
            llama_cpp.llama_decode(ctx, batch)  # a failure here shows again, explained, at the first request
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), False)
        llama_cpp.llama_synchronize(ctx)
    finally:
        llama_cpp.llama_set_warmup(ctx, False)
