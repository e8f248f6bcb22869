"""Device names and discovery: one vocabulary (`--device`, the catalog, load
options, `localserve devices`), each backend's mapping of it as a pure
function over what it sees (no GPU or NPU on this machine: the 'present'
lists are made up), and the listing asked the way each backend decides at
load time."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from localserve.backends import devices
from localserve.backends.device_names import APIS, KINDS, canonical_device, parse_device, vocabulary
from localserve.backends.devices import BackendDevices, discover
from localserve.backends.llamacpp.devices import LLAMACPP, GgmlDevice, place, present_devices
from localserve.backends.onnx.providers import ONNXRUNTIME, PROVIDERS, label, session_providers
from localserve.backends.openvino.backend import OPENVINO, resolve_device
from localserve.backends.speech.faster_whisper import CTRANSLATE2
from localserve.backends.speech.faster_whisper import present_devices as ct2_devices
from localserve.backends.speech.whisper_cpp import WHISPER_CPP
from localserve.errors import DeviceNotFoundError, UnsupportedDeviceError

CPU_EP = "CPUExecutionProvider"
TABLES = (LLAMACPP, ONNXRUNTIME, OPENVINO, CTRANSLATE2, WHISPER_CPP)

# ---- the vocabulary ----------------------------------------------------------------------


def test_names_have_one_spelling() -> None:
    assert [canonical_device(t) for t in ("AUTO", " Cpu ", "gpu", "GPU.1", "gpu:12", "NPU", "DML", "cuda:1")] == [
        "auto", "cpu", "gpu", "gpu:1", "gpu:12", "npu", "directml", "cuda:1"
    ]  # fmt: skip
    assert parse_device("gpu:3").index == 3 and parse_device("gpu").index is None


@pytest.mark.parametrize("text", ["tpu", "", "gpu:", "gpu:-1", "cpu:0", "auto:1", "cuda0", "gpu:x"])
def test_names_outside_the_vocabulary_are_refused_with_it(text: str) -> None:
    with pytest.raises(ValueError, match="unknown device .*use one of: auto, cpu, gpu, gpu:N, npu, cuda"):
        parse_device(text)


def test_every_backend_serves_auto_and_cpu_and_only_names_of_the_vocabulary() -> None:
    for table in TABLES:
        assert {"auto", "cpu"} <= set(table.accepts) <= set(KINDS), table.backend
        assert set(table.auto) <= set(table.accepts)
    served = set().union(*(t.accepts for t in TABLES))
    assert served == set(KINDS), "a name no backend serves"
    assert all(api in vocabulary() for api in APIS)


def test_every_onnx_provider_name_is_one_onnxruntime_knows() -> None:
    import onnxruntime

    assert {p.runtime for p in PROVIDERS} <= set(onnxruntime.get_all_providers())


# ---- llama.cpp: which GPUs hold the layers -------------------------------------------------


def ggml(*names: str) -> list[GgmlDevice]:
    return [GgmlDevice(n, f"{n} card", 0 if n == "CPU" else 1, 8 << 30, 16 << 30) for n in names]


def test_llamacpp_auto_and_gpu_split_over_every_gpu_and_gpu_n_takes_one() -> None:
    two = present_devices(ggml("CUDA0", "CUDA1", "CPU"))
    assert [p.name for p in two] == ["gpu:0", "gpu:1", "cpu"]
    for name in ("auto", "gpu", "cuda"):
        assert (place(name, two).use_gpu, place(name, two).main_gpu, place(name, two).label) == (True, None, "GPU")
    one = place("gpu:1", two)
    assert (one.use_gpu, one.main_gpu, one.label) == (True, 1, "GPU:1")
    assert place("cpu", two) == place("auto", present_devices(ggml("CPU")))
    assert not place("cpu", two).use_gpu and place("cpu", two).label == "CPU"


def test_llamacpp_names_the_build_and_what_it_cannot_use() -> None:
    vulkan = present_devices(ggml("Vulkan0", "CPU"))
    assert place("vulkan", vulkan).use_gpu
    with pytest.raises(DeviceNotFoundError, match="'cuda' was asked for.*present: gpu:0, cpu"):
        place("cuda", vulkan)
    with pytest.raises(DeviceNotFoundError, match="'gpu:2' was asked for.*present: gpu:0, cpu") as absent:
        place("gpu:2", vulkan)
    assert absent.value.status == 400 and absent.value.code == "device_not_found"
    with pytest.raises(DeviceNotFoundError, match="sees no such device here; present: cpu. A GPU needs"):
        place("gpu", present_devices(ggml("CPU")))
    with pytest.raises(
        UnsupportedDeviceError, match="llama.cpp cannot run on 'npu'; it can use: auto, cpu, gpu, gpu:N"
    ) as no:
        place("npu", vulkan)
    assert no.value.status == 400 and no.value.code == "unsupported_device" and "localserve devices" in str(no.value)


# ---- ONNX Runtime: which execution providers ----------------------------------------------


def test_onnx_auto_keeps_cuda_then_directml_then_the_cpu() -> None:
    assert session_providers("auto", ["AzureExecutionProvider", CPU_EP]) == [CPU_EP]
    assert (
        session_providers("auto", ["DmlExecutionProvider", "CUDAExecutionProvider", CPU_EP])[0]
        == "CUDAExecutionProvider"
    )
    assert session_providers("auto", ["DmlExecutionProvider", CPU_EP]) == ["DmlExecutionProvider", CPU_EP]
    # measured default: a present TensorRT or QNN is used only when asked for
    assert session_providers("auto", ["TensorrtExecutionProvider", "QNNExecutionProvider", CPU_EP]) == [CPU_EP]


def test_onnx_explicit_providers_gpu_npu_and_device_ids() -> None:
    every = [p.runtime for p in PROVIDERS]
    assert session_providers("dml", every) == ["DmlExecutionProvider", CPU_EP]
    assert session_providers("tensorrt", every) == ["TensorrtExecutionProvider", CPU_EP]
    assert session_providers("gpu", ["MIGraphXExecutionProvider", CPU_EP]) == ["MIGraphXExecutionProvider", CPU_EP]
    assert session_providers("npu", ["VitisAIExecutionProvider", CPU_EP]) == ["VitisAIExecutionProvider", CPU_EP]
    assert session_providers("coreml", every) == ["CoreMLExecutionProvider", CPU_EP]
    on_second = session_providers("gpu:1", every)
    assert on_second == [("CUDAExecutionProvider", {"device_id": 1}), CPU_EP] and label(on_second) == "CUDA:1"
    assert label(session_providers("cpu", every)) == "CPU" and label(session_providers("directml", every)) == "DirectML"
    with pytest.raises(DeviceNotFoundError, match="'coreml:1' was asked for"):  # CoreML takes no device id
        session_providers("coreml:1", every)


@pytest.mark.parametrize("device", ["cuda", "directml", "gpu", "npu", "gpu:0"])
def test_onnx_an_absent_provider_names_those_present_and_how_to_get_one(device: str) -> None:
    with pytest.raises(DeviceNotFoundError, match="ONNX Runtime sees no such device here; present: cpu. A GPU needs"):
        session_providers(device, ["AzureExecutionProvider", CPU_EP])


def test_onnx_refuses_names_it_cannot_serve() -> None:
    with pytest.raises(UnsupportedDeviceError, match="ONNX Runtime cannot run on 'vulkan'; it can use: .*directml"):
        session_providers("vulkan", [CPU_EP])
    with pytest.raises(UnsupportedDeviceError, match="unknown device 'tpu'"):
        session_providers("tpu", [CPU_EP])


# ---- OpenVINO and the speech runtimes --------------------------------------------------------


def test_openvino_auto_prefers_npu_then_gpu_then_cpu() -> None:
    assert resolve_device("auto", ["CPU"]) == "CPU"
    assert resolve_device("auto", ["CPU", "GPU.0", "GPU.1"]) == "GPU.0"
    assert resolve_device("AUTO", ["CPU", "GPU", "NPU"]) == "NPU"
    assert resolve_device("gpu", ["CPU", "GPU"]) == "GPU" and resolve_device("gpu:0", ["CPU", "GPU"]) == "GPU"
    assert resolve_device("gpu:1", ["CPU", "GPU.0", "GPU.1"]) == resolve_device("GPU.1", ["GPU.1"]) == "GPU.1"
    assert resolve_device("npu", ["CPU", "NPU"]) == "NPU"


@pytest.mark.parametrize("device", ["NPU", "GPU", "gpu.1", "gpu:1"])
def test_openvino_an_absent_device_names_those_present(device: str) -> None:
    with pytest.raises(DeviceNotFoundError, match="OpenVINO sees no such device here; present: cpu"):
        resolve_device(device, ["CPU"])
    with pytest.raises(UnsupportedDeviceError, match="OpenVINO cannot run on 'cuda'; it can use: auto, cpu, gpu"):
        resolve_device("cuda", ["CPU", "GPU"])


def test_faster_whisper_uses_cuda_devices_and_whisper_cpp_the_cpu() -> None:
    two = ct2_devices(2)
    assert [p.name for p in CTRANSLATE2.resolve("auto", two)[1]] == ["gpu:0", "gpu:1"]
    assert CTRANSLATE2.resolve("cuda:1", two)[1][0].index == 1
    assert CTRANSLATE2.resolve("auto", ct2_devices(0))[1][0].name == "cpu"
    with pytest.raises(DeviceNotFoundError, match="present: cpu"):
        CTRANSLATE2.resolve("gpu", ct2_devices(0))
    with pytest.raises(UnsupportedDeviceError, match="whisper.cpp .*CPU only.*can use: auto, cpu"):
        WHISPER_CPP.resolve("gpu", [])


# ---- what `localserve devices` lists ---------------------------------------------------------


def test_every_backend_reports_the_cpu_and_its_version() -> None:
    found = {b.backend: b for b in discover()}
    assert list(found) == ["llamacpp", "onnx", "openvino", "faster-whisper", "whisper.cpp"]
    for b in found.values():
        if b.available:
            assert b.devices[-1] == "cpu" and b.version and b.accepts.startswith("auto, cpu")
    assert found["llamacpp"].available and found["onnx"].available
    assert "CPUExecutionProvider" in found["onnx"].details["providers"]


def test_the_lists_match_what_each_backend_resolves_at_load() -> None:
    import onnxruntime

    from localserve.backends.llamacpp.devices import available_devices as llama_devices
    from localserve.backends.onnx.providers import available_devices as onnx_devices

    found = {b.backend: b for b in discover()}
    assert list(found["llamacpp"].devices) == llama_devices()
    assert list(found["onnx"].devices) == onnx_devices()
    assert found["onnx"].version == onnxruntime.__version__
    assert found["llamacpp"].accepts == LLAMACPP.accepted()
    if found["openvino"].available:
        import openvino

        assert len(found["openvino"].devices) == len(openvino.Core().available_devices)
        for name in found["openvino"].devices:  # each listed name resolves to a device OpenVINO has
            assert resolve_device(name, openvino.Core().available_devices) in openvino.Core().available_devices


def test_a_missing_backend_package_is_listed_with_its_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> BackendDevices:
        raise ModuleNotFoundError("No module named 'openvino'", name="openvino")

    monkeypatch.setitem(devices.PROBES, "openvino", (missing, "pip install 'localserve[openvino]'"))
    openvino = next(b for b in discover() if b.backend == "openvino")
    assert not openvino.available and openvino.devices == ()
    assert openvino.note == "not installed (openvino): pip install 'localserve[openvino]'"


@pytest.mark.slow
def test_the_devices_command_prints_json_and_a_table() -> None:
    run = [sys.executable, "-m", "localserve", "devices"]
    as_json = subprocess.run([*run, "--json"], capture_output=True, text=True, timeout=120, check=True)
    backends = json.loads(as_json.stdout)["backends"]
    assert [b["backend"] for b in backends][:3] == ["llamacpp", "onnx", "openvino"]
    assert all(isinstance(b["devices"], list) for b in backends)
    table = subprocess.run(run, capture_output=True, text=True, timeout=120, check=True).stdout
    assert table.splitlines()[0].startswith("llamacpp") and table.splitlines()[0].endswith("cpu")
    assert "--device: auto, cpu, gpu, gpu:N" in table


@pytest.mark.slow
def test_discovery_does_not_import_torch() -> None:
    code = "import sys, localserve.backends.devices as d; d.cached_snapshot(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"
