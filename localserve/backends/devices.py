"""What each backend can run on here: `localserve devices` and the
`devices` part of `/api/v1/stats`.

Each backend is asked the way it decides at load time (the GPUs ggml sees,
onnxruntime's execution providers, OpenVINO's `available_devices`,
CTranslate2's CUDA devices) and lists them under the names of
backends/device_names.py, the ones `--device` takes; `accepts` says every
name the backend can serve. A backend whose package is missing is listed as
unavailable with the install hint instead of failing the whole report.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib import metadata

from localserve.backends.device_names import CPU, DeviceTable, Present


@dataclass(frozen=True, slots=True)
class BackendDevices:
    """One backend's view of this machine, under the names `--device` takes."""

    backend: str  # llamacpp | onnx | openvino | faster-whisper | whisper.cpp
    available: bool  # its package imports
    version: str
    devices: tuple[str, ...]  # present, best first for `auto`: "gpu:0", "cuda", "npu", "cpu", ...
    details: dict[str, str]  # device -> what it is (the runtime's name for it, the hardware)
    note: str = ""  # why it is unavailable, or how to get more devices
    accepts: str = ""  # every name this backend can serve (backends/device_names.py)


def _listing(name: str, version: str, table: DeviceTable, present: list[Present], note: str) -> BackendDevices:
    details = {p.name: _what(p) for p in present if _what(p).lower() != p.name}
    missing = not any(set(p.kinds) - {CPU} for p in present)
    return BackendDevices(name, True, version, tuple(p.name for p in present), details, note if missing else "",
                          table.accepted())  # fmt: skip


def _what(device: Present) -> str:
    return f"{device.runtime} ({device.description})" if device.description else device.runtime


def _llamacpp() -> BackendDevices:
    from localserve.backends.llamacpp.devices import LLAMACPP, present_devices

    note = "this llama-cpp-python is a CPU build; see README for a CUDA/Vulkan/Metal build"
    return _listing("llamacpp", _version("llama-cpp-python"), LLAMACPP, present_devices(), note)


def _onnx() -> BackendDevices:
    import onnxruntime as ort

    from localserve.backends.onnx.providers import ONNXRUNTIME, present_providers

    available = ort.get_available_providers()
    found = _listing("onnx", ort.__version__, ONNXRUNTIME, present_providers(available), ONNXRUNTIME.hint)
    found.details["providers"] = ", ".join(available)
    return found


def _openvino() -> BackendDevices:
    import openvino as ov

    from localserve.backends.openvino.backend import OPENVINO, present_devices

    core = ov.Core()
    present = present_devices(list(core.available_devices))
    present = [dataclasses.replace(p, description=_ov_name(core, p.runtime)) for p in present]
    return _listing("openvino", _version("openvino"), OPENVINO, present, OPENVINO.hint)


def _ov_name(core: object, device: str) -> str:
    try:
        return str(core.get_property(device, "FULL_DEVICE_NAME"))  # type: ignore[attr-defined]
    except RuntimeError:
        return ""


def _faster_whisper() -> BackendDevices:
    import ctranslate2

    from localserve.backends.speech.faster_whisper import CTRANSLATE2, present_devices

    present = present_devices(ctranslate2.get_cuda_device_count())
    return _listing("faster-whisper", _version("faster-whisper"), CTRANSLATE2, present, CTRANSLATE2.hint)


def _whisper_cpp() -> BackendDevices:
    import _pywhispercpp  # noqa: F401  # installed?

    from localserve.backends.speech.whisper_cpp import WHISPER_CPP

    cpu = [Present(CPU, "cpu", frozenset({CPU}))]
    return _listing("whisper.cpp", _version("pywhispercpp"), WHISPER_CPP, cpu, "the PyPI wheel runs on the CPU only")


PROBES: dict[str, tuple[Callable[[], BackendDevices], str]] = {
    "llamacpp": (_llamacpp, "make install"),
    "onnx": (_onnx, "pip install 'localserve[onnx]'"),
    "openvino": (_openvino, "pip install 'localserve[openvino]'"),
    "faster-whisper": (_faster_whisper, "pip install 'localserve[speech]'"),
    "whisper.cpp": (_whisper_cpp, "pip install 'localserve[speech]'"),
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
