"""What each backend can run on here: `localserve devices` and the
`devices` part of `/api/v1/stats`.

Each backend is asked the way it decides at load time (llama.cpp's GPU
offload support, onnxruntime's execution providers, OpenVINO's
`available_devices`), so what this lists is exactly what `--device` can
pick; a backend whose package is missing is listed as unavailable with the
install hint instead of failing the whole report.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib import metadata


@dataclass(frozen=True, slots=True)
class BackendDevices:
    """One backend's view of this machine."""

    backend: str  # llamacpp | onnx | openvino
    available: bool  # its package imports
    version: str
    devices: tuple[str, ...]  # our device names, best first for `auto` ("CPU", "GPU", "NPU", "CUDA", ...)
    details: dict[str, str]  # device -> what it is (OpenVINO's FULL_DEVICE_NAME, an onnxruntime provider, ...)
    note: str = ""  # why it is unavailable, or how to get more devices


def _llamacpp() -> BackendDevices:
    from localserve.backends.llamacpp.backend import available_devices

    devices = tuple(available_devices())
    gpu = "GPU" in devices
    return BackendDevices(
        "llamacpp",
        True,
        _version("llama-cpp-python"),
        devices,
        {"GPU": "n_gpu_layers offload"} if gpu else {},
        "" if gpu else "this llama-cpp-python is a CPU build; see README for a CUDA/Vulkan/Metal build",
    )


def _onnx() -> BackendDevices:
    import onnxruntime as ort

    from localserve.backends.onnx.backend import PROVIDERS, available_devices

    providers = dict(zip(("CUDA", "DirectML", "CPU"), PROVIDERS.values(), strict=True))
    devices = tuple(available_devices())
    note = "" if len(devices) > 1 else "GPU: pip install onnxruntime-gpu (CUDA) or onnxruntime-directml (Windows)"
    details = {d: providers.get(d, d) for d in devices}
    details["providers"] = ", ".join(ort.get_available_providers())
    return BackendDevices("onnx", True, ort.__version__, devices, details, note)


def _openvino() -> BackendDevices:
    import openvino as ov

    from localserve.backends.openvino.backend import DEVICE_ORDER

    core = ov.Core()
    present = list(core.available_devices)
    rank = {kind: i for i, kind in enumerate(DEVICE_ORDER)}
    devices = tuple(sorted(present, key=lambda d: (rank.get(d.split(".")[0], len(rank)), d)))
    details = {}
    for device in devices:
        try:
            details[device] = str(core.get_property(device, "FULL_DEVICE_NAME"))
        except RuntimeError:
            details[device] = ""
    note = "" if any(d.startswith(("NPU", "GPU")) for d in devices) else "NPU and GPU need Intel's drivers"
    return BackendDevices("openvino", True, _version("openvino"), devices, details, note)


PROBES: dict[str, tuple[Callable[[], BackendDevices], str]] = {
    "llamacpp": (_llamacpp, "make install"),
    "onnx": (_onnx, "pip install onnxruntime"),
    "openvino": (_openvino, "pip install 'localserve[openvino]'"),
}


def discover() -> list[BackendDevices]:
    """Every backend's devices, asked now (OpenVINO and llama.cpp probe the hardware)."""
    found = []
    for name, (probe, install) in PROBES.items():
        try:
            found.append(probe())
        except ImportError as exc:
            found.append(BackendDevices(name, False, "", (), {}, f"not installed ({exc.name}): {install}"))
        except RuntimeError as exc:  # a plugin that fails to enumerate
            found.append(BackendDevices(name, True, _version(name), (), {}, f"device discovery failed: {exc}"))
    return found


@functools.cache
def cached_snapshot() -> tuple[dict[str, object], ...]:
    """`discover()` as JSON-ready dicts, asked once per process (devices do
    not come and go while the server runs; the stats route polls often)."""
    return tuple(_as_dict(d) for d in discover())


def _as_dict(found: BackendDevices) -> dict[str, object]:
    data = asdict(found)
    data["devices"] = list(found.devices)
    return data


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return ""
