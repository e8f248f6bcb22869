"""The servers of the comparison: how each is started on loopback, waited
for, measured (CPU time) and stopped, and how llama-server is built."""

from __future__ import annotations

import argparse
import os
import platform
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODEL_ID = "smollm2-135m-instruct"
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
CACHE = Path.home() / ".cache" / "localserve-bench"
LLAMA_CPP_SRC = CACHE / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}" / "vendor" / "llama.cpp"
LLAMA_SERVER = LLAMA_CPP_SRC / "build" / "bin" / "llama-server"


@dataclass(frozen=True, slots=True)
class ServerSpec:
    name: str
    argv: list[str]
    ready_path: str  # answers 200 once the model is loaded


def server_specs(args: argparse.Namespace, model_path: str, port: int) -> dict[str, ServerSpec]:
    """How each server is started: same model, threads, slots and context per slot."""
    t, p, ctx = args.threads, args.parallel, args.ctx_size
    lt = getattr(args, "localserve_threads", None) or t  # bench/busy_desktop.py: auto against llama-server's -t
    py = sys.executable
    localserve = f"-m localserve serve --port {port} --model {MODEL_ID} --threads {lt} --parallel {p} --ctx-size {ctx}"
    llama_server = f"--host 127.0.0.1 --port {port} -t {t} -tb {t} -np {p} -c {p * ctx} --cont-batching -a {MODEL_ID}"
    # llama_cpp.server's default --interrupt_requests True ends a stream whenever another request arrives.
    llama_cpp_server = (
        f"--model_alias {MODEL_ID} --host 127.0.0.1 --port {port} --n_threads {t} --n_threads_batch {t} "
        f"--n_ctx {ctx} --interrupt_requests False"
    )
    return {
        "localserve": ServerSpec("localserve", [py, *localserve.split()], "/health"),
        "llama-server": ServerSpec(
            "llama-server", [str(args.llama_server), "-m", model_path, *llama_server.split()], "/health"
        ),
        "llama_cpp.server": ServerSpec(
            "llama_cpp.server",
            [py, "-m", "llama_cpp.server", "--model", model_path, *llama_cpp_server.split()],
            "/v1/models",
        ),
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RunningServer:
    """One server process, started and awaited on `with`, stopped on exit."""

    def __init__(
        self,
        spec: ServerSpec,
        port: int,
        log_path: Path,
        env: dict[str, str],
        timeout_s: float = 180.0,
        cwd: Path = ROOT,
    ) -> None:
        self.spec, self.port, self.log_path, self.env, self.timeout_s = spec, port, log_path, env, timeout_s
        self.cwd = cwd  # `python -m` puts the working directory first on sys.path: it picks the tree served
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> RunningServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.spec.argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.cwd, env={**os.environ, **self.env}
            )
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.spec.name} exited with {self.process.returncode}; see {self.log_path}")
            try:
                with urllib.request.urlopen(self.url + self.spec.ready_path, timeout=2) as response:
                    if response.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.5)
        self.__exit__()
        raise RuntimeError(f"{self.spec.name} not ready after {self.timeout_s:.0f} s; see {self.log_path}")

    def __exit__(self, *exc: object) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        for sig, wait_s in ((signal.SIGINT, 20), (signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            self.process.send_signal(sig)
            try:
                self.process.wait(wait_s)
                return
            except subprocess.TimeoutExpired:
                continue


class CpuMeter:
    """CPU seconds (user + system) a server process spends per level: unlike
    wall time, hardly changed by other load on a shared machine."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.tick = os.sysconf("SC_CLK_TCK")
        self.started = 0.0

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self.tick  # utime, stime

    def start(self, _level: Any = None) -> None:
        self.started = self.cpu_s()

    def stop(self, summary: dict[str, Any]) -> None:
        used = self.cpu_s() - self.started
        s = summary["all"]
        num_tokens = s["output_tokens_per_s"] * s["duration_s"]
        summary["server_cpu_s"] = round(used, 2)
        summary["server_cpu_ms_per_output_token"] = round(used * 1e3 / num_tokens, 2) if num_tokens else None


def server_version(name: str, args: argparse.Namespace) -> str:
    if name == "llama-server":
        out = subprocess.run([str(args.llama_server), "--version"], capture_output=True, text=True, timeout=30)
        return (out.stdout + out.stderr).strip().splitlines()[0] if (out.stdout + out.stderr).strip() else "?"
    if name == "llama_cpp.server":
        import llama_cpp

        return f"llama-cpp-python {llama_cpp.__version__}"
    from localserve import __version__

    return f"localserve {__version__}"


def build_llama_server(*, portable: bool = False) -> None:
    """Download the llama-cpp-python sdist and build its vendored llama.cpp's
    llama-server under ~/.cache/localserve-bench the way llama.cpp's README
    builds it: default CMake options, so a native CPU build with OpenMP
    (`portable`: GGML_NATIVE=OFF, for a binary that runs on any x86-64). A
    native build leaves out AMX as our wheel does (scripts/llama_wheel.py:
    this llama.cpp's AMX kernels die on AMX Xeons), so both run the same code."""
    CACHE.mkdir(parents=True, exist_ok=True)
    sdist = CACHE / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
    build = LLAMA_CPP_SRC / "build"
    pip_download = (
        f"-m pip download --no-binary llama-cpp-python --no-deps llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} -d"
    )
    options = "-DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF "
    options += "-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON"
    if portable:
        options += " -DGGML_NATIVE=OFF"
    steps = []
    if not sdist.exists():
        steps.append([sys.executable, *pip_download.split(), str(CACHE)])
    if not LLAMA_CPP_SRC.exists():
        steps.append(["tar", "xzf", str(sdist), "-C", str(CACHE)])
    steps.append(["cmake", "-S", str(LLAMA_CPP_SRC), "-B", str(build), *options.split()])
    steps.append(["cmake", "--build", str(build), "--target", "llama-server", f"-j{os.cpu_count() or 2}"])
    env = dict(os.environ)
    if not portable and platform.machine().lower() in ("x86_64", "amd64"):
        no_amx = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
        env["CFLAGS"] = f"{env.get('CFLAGS', '')} {no_amx}".strip()
        env["CXXFLAGS"] = f"{env.get('CXXFLAGS', '')} {no_amx}".strip()
    for step in steps:
        print("+", " ".join(step), flush=True)
        subprocess.run(step, check=True, env=env)


QUIET_LOAD = 0.5  # 1-minute load average below which a run may start


def wait_for_quiet(max_wait_s: float = 420.0, threshold: float = QUIET_LOAD) -> float:
    """Wait until the 1-minute load average is below `threshold` (the previous
    server's own load takes a minute or two to decay) and return it; exit
    without a figure if the machine stays busy: a run on a busy machine is no
    figure."""
    deadline = time.monotonic() + max_wait_s
    load = os.getloadavg()[0]
    while load >= threshold:
        if time.monotonic() > deadline:
            raise SystemExit(
                f"the machine is busy (1-minute load average {load:.2f} >= {threshold} after {max_wait_s:.0f} s): "
                "stop what else runs and benchmark again; no figures were recorded for this run"
            )
        time.sleep(5)
        load = os.getloadavg()[0]
    return load


def start_peers(stack: Any, args: argparse.Namespace, model_path: str, tag: str) -> dict[str, str]:
    """localserve (with its own empty LOCALSERVE_HOME and `args.env`, if any)
    and llama-server, both up until `stack` (an ExitStack) closes: name -> base URL."""
    import tempfile

    urls = {}
    for name in ("localserve", "llama-server"):
        port = free_port()
        env: dict[str, str] = {}
        if name == "localserve":
            env = {**getattr(args, "env", {}), "LOCALSERVE_HOME": stack.enter_context(tempfile.TemporaryDirectory())}
        spec = server_specs(args, model_path, port)[name]
        stack.enter_context(RunningServer(spec, port, CACHE / "logs" / f"{tag}-{name}.log", env))
        urls[name] = f"http://127.0.0.1:{port}"
    return urls
