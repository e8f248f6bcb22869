"""Which ONNX Runtime execution providers a device name picks, for the
decoder and the embeddings alike.

Each execution provider we know is a device name (`cuda`, `directml`, ...);
`gpu` takes the first GPU provider present, `npu` the first NPU provider,
and `gpu:N` / `cuda:N` pass `device_id` N where the provider takes one.
`auto` keeps what was measured to pay: CUDA, else DirectML, else the CPU.
The CPU provider always comes last, so a node the chosen provider lacks
still runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from localserve.backends.device_names import AUTO, CPU, GPU, NPU, DeviceTable, Present


@dataclass(frozen=True, slots=True)
class Provider:
    """One execution provider under our device name."""

    name: str  # our name: cuda, directml, ...
    runtime: str  # onnxruntime's: CUDAExecutionProvider
    label: str  # BackendInfo.device: CUDA, DirectML
    kind: str = GPU  # GPU, NPU, or "" (only by its own name)
    device_id: bool = True  # takes a `device_id` option (gpu:N)


#: Best first within each kind; every runtime name is one of onnxruntime.get_all_providers().
PROVIDERS = (
    Provider("cuda", "CUDAExecutionProvider", "CUDA"),
    Provider("directml", "DmlExecutionProvider", "DirectML"),
    Provider("migraphx", "MIGraphXExecutionProvider", "MIGraphX"),
    Provider("tensorrt", "TensorrtExecutionProvider", "TensorRT"),
    Provider("qnn", "QNNExecutionProvider", "QNN", NPU, device_id=False),
    Provider("vitisai", "VitisAIExecutionProvider", "VitisAI", NPU, device_id=False),
    Provider("coreml", "CoreMLExecutionProvider", "CoreML", "", device_id=False),
    Provider(CPU, "CPUExecutionProvider", "CPU", CPU, device_id=False),
)
CPU_PROVIDER = "CPUExecutionProvider"
_BY_RUNTIME = {p.runtime: p for p in PROVIDERS}

ONNXRUNTIME = DeviceTable(
    "ONNX Runtime",
    accepts=(AUTO, CPU, GPU, NPU, *(p.name for p in PROVIDERS if p.name != CPU)),
    auto=("cuda", "directml", CPU),
    hint="A GPU needs its onnxruntime build: pip install onnxruntime-gpu (CUDA) or onnxruntime-directml (Windows).",
)


def present_providers(available: list[str]) -> list[Present]:
    """The providers of `available` we can pick, best first, under our names."""
    present = []
    for p in PROVIDERS:
        if p.runtime in available:
            kinds = frozenset({p.name, p.kind} - {""})
            present.append(Present(p.name, p.runtime, kinds, None if p.device_id else 0))
    return present


def session_providers(device: str, available: list[str]) -> list[Any]:
    """The `providers` argument of an `InferenceSession` for `device`:
    the chosen provider (with its `device_id` for gpu:N), then the CPU."""
    wanted, found = ONNXRUNTIME.resolve(device, present_providers(available))
    chosen = found[0].runtime
    if chosen == CPU_PROVIDER:
        return [CPU_PROVIDER]
    if wanted.index is not None:
        return [(chosen, {"device_id": wanted.index}), CPU_PROVIDER]
    return [chosen, CPU_PROVIDER]


def label(providers: list[Any]) -> str:
    """BackendInfo.device for the providers a session was given."""
    if isinstance(providers[0], tuple):
        runtime, options = providers[0]
        return f"{_BY_RUNTIME[runtime].label}:{options['device_id']}"
    return _BY_RUNTIME[providers[0]].label


def available_devices() -> list[str]:
    """Our names of the providers onnxruntime has here, best first."""
    import onnxruntime as ort

    return [p.name for p in present_providers(ort.get_available_providers())]
