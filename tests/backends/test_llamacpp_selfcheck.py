"""A llama.cpp build that dies on this CPU is caught, never served.

The wheel recipe (scripts/llama_wheel.py) and the runtime check
(backends/llamacpp/selfcheck.py) are tested against a stand-in library that
dies with a real SIGILL in the child process, and against the real library,
which must pass. The real native build itself is tested by `make test` on
whatever CPU runs it."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from localserve.backends.llamacpp import selfcheck
from localserve.errors import LlamaCppBuildError

ROOT = Path(__file__).resolve().parents[2]


def _load_wheel_script():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("llama_wheel", ROOT / "scripts" / "llama_wheel.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["llama_wheel"] = module
    spec.loader.exec_module(module)
    return module


llama_wheel = _load_wheel_script()

DIES = "import os, signal\nos.kill(os.getpid(), signal.SIGILL)\n"


def dying_script(tmp_path: Path) -> Path:
    """A stand-in for the check's child that dies as a broken build does: a real SIGILL."""
    script = tmp_path / "dies.py"
    script.write_text(DIES)
    return script


def stand_in_wheel(out_dir: Path, *, dies: bool) -> Path:
    """A wheel whose llama_cpp dies with SIGILL on import, or a copy of the real, installed llama_cpp."""
    import llama_cpp

    wheel = out_dir / f"llama_cpp_python-{llama_wheel.VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        if dies:
            archive.writestr("llama_cpp/__init__.py", DIES)
        else:
            package = Path(llama_cpp.__file__).parent
            for path in package.rglob("*"):
                if path.is_file() and "__pycache__" not in path.parts:
                    archive.write(path, Path("llama_cpp") / path.relative_to(package))
    return wheel


# ---- the key -----------------------------------------------------------------------------------


def test_the_key_changes_with_everything_that_changes_the_binary(monkeypatch):
    base = llama_wheel.Inputs(cpu_flags=("avx2", "avx512f"), machine="x86_64")
    key = llama_wheel.wheel_key(base)
    for changed in (
        replace(base, cmake_args="-DGGML_CUDA=on"),
        replace(base, cflags="-O2"),
        replace(base, cxxflags="-O2"),
        replace(base, try_amx=True),
        replace(base, cpu_flags=("amx_tile", "avx2", "avx512f")),
        replace(base, machine="aarch64"),
    ):
        assert llama_wheel.wheel_key(changed) != key, changed
    monkeypatch.setattr(llama_wheel, "RECIPE", llama_wheel.RECIPE + 1)
    assert llama_wheel.wheel_key(base) != key
    monkeypatch.undo()
    monkeypatch.setattr(llama_wheel, "VERSION", "0.3.99")
    assert llama_wheel.wheel_key(base) != key


def test_the_inputs_come_from_the_environment():
    inputs = llama_wheel.Inputs.from_env(
        {"CMAKE_ARGS": " -DGGML_NATIVE=OFF ", "CFLAGS": "-O3", "CXXFLAGS": "-O1", "LOCALSERVE_TRY_AMX": "1"}
    )
    assert (inputs.cmake_args, inputs.cflags, inputs.cxxflags, inputs.try_amx) == (
        "-DGGML_NATIVE=OFF",
        "-O3",
        "-O1",
        True,
    )
    assert inputs.cpu_flags == llama_wheel.cpu_flags()


# ---- which builds, in which order --------------------------------------------------------------------


def test_native_builds_leave_out_amx_then_fall_back_to_portable():
    amx = llama_wheel.Inputs(cflags="-O2", cpu_flags=("amx_int8", "amx_tile", "avx512f"), machine="x86_64")
    names = [(v.name, v.cflags, v.cmake_args) for v in llama_wheel.variants(amx)]
    assert names == [
        ("native-no-amx", f"-O2 {llama_wheel.NO_AMX}", ""),
        ("portable", "-O2", "-DGGML_NATIVE=OFF"),
    ]
    tried = [v.name for v in llama_wheel.variants(replace(amx, try_amx=True))]
    assert tried == ["native", "native-no-amx", "portable"]
    no_amx = [v.name for v in llama_wheel.variants(replace(amx, cpu_flags=("avx2",), try_amx=True))]
    assert no_amx == ["native-no-amx", "portable"]  # nothing to try: the CPU has no AMX
    asked = llama_wheel.variants(replace(amx, cmake_args="-DGGML_NATIVE=OFF -DGGML_AVX2=on"))
    assert [(v.name, v.cmake_args) for v in asked] == [("portable", "-DGGML_NATIVE=OFF -DGGML_AVX2=on")]
    arm = [v.name for v in llama_wheel.variants(replace(amx, machine="aarch64", cpu_flags=("asimd",)))]
    assert arm == ["native", "portable"]


@pytest.mark.slow
def test_a_build_that_dies_in_the_check_falls_back_and_is_never_reused(tmp_path, smollm2_path, capsys, monkeypatch):
    """The first build's llama_cpp dies with SIGILL in the check's child; the
    portable one (here the real library) passes and is kept, with one line
    saying so. The same inputs reuse it; a new RECIPE builds again."""
    built: list[str] = []

    def build(variant, out_dir: Path, log_file: Path) -> Path:  # type: ignore[no-untyped-def]
        built.append(variant.name)
        log_file.write_text("stand-in build\n")
        return stand_in_wheel(out_dir, dies=variant.name != "portable")

    inputs = llama_wheel.Inputs(cpu_flags=("amx_tile", "avx512f"), machine="x86_64")
    check = llama_wheel.wheel_checker(smollm2_path)
    wheel = llama_wheel.ensure(inputs, tmp_path, build, check)
    assert built == ["native-no-amx", "portable"]
    assert wheel.is_file() and wheel.parent.name.endswith(llama_wheel.wheel_key(inputs))
    kept = json.loads((wheel.parent / "kept.json").read_text())
    assert kept["variant"] == "portable" and "native-no-amx died on SIGILL" in kept["why"]
    assert "decoded 1 and 8 sequences" in kept["check"]
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("llama.cpp: kept")]
    assert lines == [f"llama.cpp: kept the portable build ({kept['why']})"]

    assert llama_wheel.ensure(inputs, tmp_path, build, check) == wheel
    assert built == ["native-no-amx", "portable"]  # reused, nothing built

    monkeypatch.setattr(llama_wheel, "RECIPE", llama_wheel.RECIPE + 1)  # the recipe changed
    again = llama_wheel.ensure(inputs, tmp_path, build, check)
    assert again != wheel and built == ["native-no-amx", "portable", "native-no-amx", "portable"]


def test_builds_are_compared_only_on_x86_with_avx512_and_nothing_asked():
    xeon = llama_wheel.Inputs(cpu_flags=("amx_tile", "avx2", "avx512f"), machine="x86_64")
    assert llama_wheel.compares_builds(xeon)
    assert not llama_wheel.compares_builds(replace(xeon, cpu_flags=("avx2", "fma")))  # AVX2 only
    assert not llama_wheel.compares_builds(replace(xeon, cmake_args="-DGGML_CUDA=on"))  # a GPU build asked
    assert not llama_wheel.compares_builds(replace(xeon, machine="aarch64", cpu_flags=("asimd",)))


def _comparing(tmp_path: Path, tok_s: dict[str, list[float]], cpu_flags: tuple[str, ...]):  # type: ignore[no-untyped-def]
    """ensure() with stand-in builds that pass the check and scripted speeds per variant."""
    built: list[str] = []
    timed: list[str] = []

    def build(variant, out_dir: Path, log_file: Path) -> Path:  # type: ignore[no-untyped-def]
        built.append(variant.name)
        wheel = out_dir / f"llama_cpp_python-{llama_wheel.VERSION}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr("llama_cpp/__init__.py", f"BUILD = {variant.name!r}\n")
        return wheel

    def time_wheel(wheel: Path) -> float:
        name = wheel.parent.name  # ensure keeps a compared build under home/<variant>/
        timed.append(name)
        return tok_s[name][sum(t == name for t in timed) - 1]

    inputs = llama_wheel.Inputs(cpu_flags=cpu_flags, machine="x86_64")
    wheel = llama_wheel.ensure(inputs, tmp_path, build, lambda w: (True, "decodes"), time_wheel)
    return wheel, built, timed


def test_on_avx512_the_faster_of_native_and_portable_is_kept(tmp_path, capsys):
    """Both builds pass the check; they decode alternately (A B, B A, ...)
    and the one faster by the median paired ratio, in all rounds but one at
    most, is kept, with the figures in kept.json and one line saying why.
    The loser is removed."""
    flags = ("amx_tile", "avx512f")
    speeds = {"native-no-amx": [60.0, 61.0, 95.0, 60.0, 62.0], "portable": [75.0, 74.0, 100.0, 75.0, 76.0]}
    wheel, built, timed = _comparing(tmp_path / "a", speeds, flags)
    assert built == ["native-no-amx", "portable"]
    assert timed == ["native-no-amx", "portable", "portable", "native-no-amx"] * 2 + ["native-no-amx", "portable"]
    kept = json.loads((wheel.parent / "kept.json").read_text())
    assert kept["variant"] == "portable" and "1.23x as fast as the native-no-amx build" in kept["why"]
    assert kept["tok_s"] == speeds
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read("llama_cpp/__init__.py") == b"BUILD = 'portable'\n"
    assert sorted(p.name for p in wheel.parent.iterdir() if p.is_dir()) == []  # both build folders gone
    assert f"llama.cpp: kept the portable build ({kept['why']})" in capsys.readouterr().err

    # Within FASTER_BY the native build stays (it is the CPU's own), and the figure is said.
    close = {"native-no-amx": [100.0] * 5, "portable": [102.0, 101.0, 104.0, 101.0, 103.0]}
    wheel, built, _ = _comparing(tmp_path / "b", close, flags)
    kept = json.loads((wheel.parent / "kept.json").read_text())
    assert kept["variant"] == "native-no-amx" and "the portable build decoded 1.02x as fast" in kept["why"]

    # Faster by the median but slower in two rounds (a drifting host): native stays.
    split = {"native-no-amx": [100.0] * 5, "portable": [120.0, 90.0, 120.0, 90.0, 120.0]}
    wheel, built, _ = _comparing(tmp_path / "d", split, flags)
    kept = json.loads((wheel.parent / "kept.json").read_text())
    assert kept["variant"] == "native-no-amx" and "1.20x as fast (rounds 0.90 / 0.90 / 1.20" in kept["why"]

    # Without AVX-512 nothing is compared: one build, no timing.
    wheel, built, timed = _comparing(tmp_path / "c", speeds, ("avx2",))
    assert built == ["native-no-amx"] and timed == []
    assert json.loads((wheel.parent / "kept.json").read_text())["variant"] == "native-no-amx"


@pytest.mark.slow
def test_the_speed_run_times_the_real_library(tmp_path, smollm2_path):
    """The timing child decodes 1 and 16 sequences with the real library and
    reports tokens/s; the recipe's timer runs it from an unpacked wheel."""
    verdict = selfcheck.run_check(smollm2_path, speed=True)
    assert verdict.ok, verdict
    result = json.loads(verdict.detail)
    assert set(result["by_sequences"]) == {"1", "16"} and all(v > 0 for v in result["by_sequences"].values())
    assert result["tok_s"] == pytest.approx((result["by_sequences"]["1"] * result["by_sequences"]["16"]) ** 0.5, 0.01)
    wheel = stand_in_wheel(tmp_path, dies=False)
    assert llama_wheel.wheel_timer(smollm2_path)(wheel) > 0
    broken = tmp_path / "broken"
    broken.mkdir()
    assert llama_wheel.wheel_timer(smollm2_path)(stand_in_wheel(broken, dies=True)) == 0.0  # it did not run


# ---- the runtime check (serve, run, batch run) ---------------------------------------------------


def test_the_real_library_passes_the_check(smollm2_path):
    verdict = selfcheck.run_check(smollm2_path)
    assert verdict.ok, verdict
    assert "decoded 1 and 8 sequences" in verdict.detail


def test_a_child_that_dies_on_sigill_is_a_crash_verdict(tmp_path, smollm2_path):
    verdict = selfcheck.run_check(smollm2_path, script=dying_script(tmp_path))
    assert not verdict.ok and verdict.signal == "SIGILL"
    assert verdict.line() == "died on SIGILL"
    assert not list(tmp_path.glob("core*"))


def test_a_crash_verdict_is_remembered_by_library_and_refuses_the_load(tmp_path, smollm2_path, monkeypatch):
    monkeypatch.setenv("LOCALSERVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("LOCALSERVE_LLAMA_CHECK", raising=False)
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libggml-cpu.so").write_bytes(b"a build that dies")
    real_run_check = selfcheck.run_check
    calls = []

    def dying_check(model_path, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(model_path)
        return real_run_check(model_path, script=dying_script(tmp_path))

    monkeypatch.setattr(selfcheck, "run_check", dying_check)
    monkeypatch.setattr(selfcheck, "_checked", {})
    verdict = selfcheck.library_verdict(smollm2_path, lib_dir=lib)
    assert verdict.signal == "SIGILL" and len(calls) == 1
    stored = list((tmp_path / "cache" / "llama-check").glob("*.json"))
    assert len(stored) == 1 and json.loads(stored[0].read_text())["signal"] == "SIGILL"
    monkeypatch.setattr(selfcheck, "_checked", {})  # a new process: the verdict comes from disk
    assert selfcheck.library_verdict(smollm2_path, lib_dir=lib) == verdict and len(calls) == 1
    (lib / "libggml-cpu.so").write_bytes(b"rebuilt")  # another library: checked anew
    selfcheck.library_verdict(smollm2_path, lib_dir=lib)
    assert len(calls) == 2


def _seed_crash_verdict(cache: Path, model: Path, tmp_path: Path) -> None:
    """Store, for the installed library, the verdict a real SIGILL in the child gives."""
    import llama_cpp

    verdict = selfcheck.run_check(model, script=dying_script(tmp_path))
    assert verdict.signal == "SIGILL"
    digest = selfcheck.library_digest(Path(llama_cpp.__file__).parent / "lib")
    (cache / "llama-check").mkdir(parents=True)
    (cache / "llama-check" / f"{digest}.json").write_text(
        json.dumps({"ok": verdict.ok, "detail": verdict.detail, "signal": verdict.signal})
    )


@pytest.mark.slow
@pytest.mark.parametrize("command", ["run", "serve"])
def test_serve_and_run_refuse_a_crashing_build_in_one_line(tmp_path, smollm2_path, command):
    cache = tmp_path / "cache"
    _seed_crash_verdict(cache, smollm2_path, tmp_path)
    env = dict(os.environ, LOCALSERVE_CACHE=str(cache), LOCALSERVE_HOME=str(tmp_path / "home"))
    env.pop("LOCALSERVE_LLAMA_CHECK", None)
    args = {
        "run": ["run", str(smollm2_path), "hello", "--max-tokens", "4"],
        "serve": ["serve", "--model", str(smollm2_path), "--port", "0"],
    }[command]
    child = subprocess.run(
        [sys.executable, "-m", "localserve", *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert child.returncode == 1, child.stderr
    errors = [line for line in child.stderr.splitlines() if "crashes on this CPU" in line]
    assert len(errors) == 1, child.stderr
    assert "SIGILL" in errors[0] and "-mno-amx-tile" in errors[0] and "GGML_NATIVE=OFF" in errors[0]


def test_the_load_raises_a_clear_error_on_a_crash_verdict(monkeypatch, smollm2_path):
    from localserve.backends.llamacpp import devices

    monkeypatch.setattr(
        selfcheck, "library_verdict", lambda path, **kw: selfcheck.Verdict(False, "died", signal.SIGILL.name)
    )
    with pytest.raises(LlamaCppBuildError, match="crashes on this CPU") as caught:
        devices.load_model(smollm2_path, "cpu", 0)
    assert caught.value.code == "llama_cpp_build_crashes"
