"""Device discovery (`localserve devices`): what each backend sees, asked the
way it decides at load time, and a clear line for a backend that is missing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from localserve.backends import devices
from localserve.backends.devices import BackendDevices, discover


def test_every_backend_reports_the_cpu_and_its_version() -> None:
    found = {b.backend: b for b in discover()}
    assert list(found) == ["llamacpp", "onnx", "openvino"]
    for b in found.values():
        if b.available:
            assert "CPU" in b.devices and b.version
    assert found["llamacpp"].available and found["onnx"].available
    assert "CPUExecutionProvider" in found["onnx"].details["providers"]


def test_the_lists_match_what_each_backend_resolves_at_load() -> None:
    import onnxruntime

    from localserve.backends.llamacpp.backend import available_devices as llama_devices
    from localserve.backends.onnx.backend import available_devices as onnx_devices

    found = {b.backend: b for b in discover()}
    assert list(found["llamacpp"].devices) == llama_devices()
    assert list(found["onnx"].devices) == onnx_devices()
    assert found["onnx"].version == onnxruntime.__version__
    if found["openvino"].available:
        import openvino

        assert sorted(found["openvino"].devices) == sorted(openvino.Core().available_devices)


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
    assert [b["backend"] for b in backends] == ["llamacpp", "onnx", "openvino"]
    assert all(isinstance(b["devices"], list) for b in backends)
    table = subprocess.run(run, capture_output=True, text=True, timeout=120, check=True).stdout
    assert table.splitlines()[0].startswith("llamacpp") and "CPU" in table.splitlines()[0]


@pytest.mark.slow
def test_discovery_does_not_import_torch() -> None:
    code = "import sys, localserve.backends.devices as d; d.cached_snapshot(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"
