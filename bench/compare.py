"""localserve against its peers, one at a time on loopback, same model, same load.

Servers (all on SmolLM2-135M-Instruct Q4_1, the same threads):

* localserve       `python -m localserve serve --threads T --parallel P`
* llama-server     llama.cpp's own server, built from the llama.cpp source vendored
                   in the llama-cpp-python sdist we use (`--build-llama-server`
                   builds it under ~/.cache/localserve-bench, never in the repo),
                   `-t T -tb T -np P -c P*ctx --cont-batching`
* llama_cpp.server llama-cpp-python's server, `--interrupt_requests False` (its default
                   cuts a stream off whenever another request arrives)

Each repeat runs every server in turn (A, B, C, A, B, C, ...): a closed-loop
sweep over concurrency levels, then interactive probes under a batch-priority
load. Raw runs go to bench/results/runs/, medians over repeats to
bench/results/summary.{json,md}, plots to docs/bench-*.png.

    python bench/compare.py --build-llama-server      # once: download the sdist, build llama-server (minutes)
    python bench/compare.py --repeats 3 --threads 2
    python bench/compare.py --plots-only              # re-aggregate and re-plot the saved runs
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from localserve.bench.command import run_bench  # noqa: E402
from localserve.bench.report import Slo  # noqa: E402
from localserve.bench.runner import Level, Probe  # noqa: E402
from localserve.bench.workload import RequestClass, Workload  # noqa: E402

MODEL_ID = "smollm2-135m-instruct"
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
CACHE = Path.home() / ".cache" / "localserve-bench"
LLAMA_CPP_SRC = CACHE / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}" / "vendor" / "llama.cpp"
LLAMA_SERVER = LLAMA_CPP_SRC / "build" / "bin" / "llama-server"
SERVERS = ("localserve", "llama-server", "llama_cpp.server")


@dataclass(frozen=True, slots=True)
class ServerSpec:
    name: str
    argv: list[str]
    ready_path: str  # answers 200 once the model is loaded


def server_specs(args: argparse.Namespace, model_path: str, port: int) -> dict[str, ServerSpec]:
    t, p, ctx = str(args.threads), args.parallel, args.ctx_size
    py = sys.executable
    return {
        "localserve": ServerSpec(
            "localserve",
            [
                py,
                "-m",
                "localserve",
                "serve",
                "--port",
                str(port),
                "--model",
                MODEL_ID,
                "--threads",
                t,
                "--parallel",
                str(p),
                "--ctx-size",
                str(ctx),
            ],
            "/health",
        ),
        "llama-server": ServerSpec(
            "llama-server",
            [
                str(args.llama_server),
                "-m",
                model_path,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "-t",
                t,
                "-tb",
                t,
                "-np",
                str(p),
                "-c",
                str(p * ctx),
                "--cont-batching",
                "-a",
                MODEL_ID,
            ],
            "/health",
        ),
        "llama_cpp.server": ServerSpec(
            "llama_cpp.server",
            [
                py,
                "-m",
                "llama_cpp.server",
                "--model",
                model_path,
                "--model_alias",
                MODEL_ID,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--n_threads",
                t,
                "--n_threads_batch",
                t,
                "--n_ctx",
                str(ctx),
                "--interrupt_requests",
                "False",
            ],
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
        self, spec: ServerSpec, port: int, log_path: Path, env: dict[str, str], timeout_s: float = 180.0
    ) -> None:
        self.spec, self.port, self.log_path, self.env, self.timeout_s = spec, port, log_path, env, timeout_s
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> RunningServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.spec.argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, **self.env}
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


# ---- the load ---------------------------------------------------------------


def sweep_levels(args: argparse.Namespace) -> list[Level]:
    return [Level("concurrency", c, max(args.min_requests, args.requests_per_stream * c)) for c in args.concurrency]


def priority_levels(args: argparse.Namespace) -> list[Level]:
    probe = Probe(
        RequestClass("interactive", "interactive"),
        args.probe_rate,
        args.probe_requests,
        args.probe_output_tokens,
        args.probe_prompt_tokens,
        args.probe_delay,
    )
    return [Level("concurrency", b, probe=probe) for b in args.batch_loads]


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
        progress(summary)


async def bench_server(args: argparse.Namespace, url: str, pid: int, *, with_priority: bool) -> dict[str, Any]:
    workload = Workload(MODEL_ID, "completions", args.prompt_tokens, args.output_tokens, True, 0.0)
    slo = Slo(args.slo_ttft_ms / 1e3, args.slo_itl_ms / 1e3)
    meter = CpuMeter(pid)
    sweep = await run_bench(
        url,
        workload,
        [RequestClass("default")],
        sweep_levels(args),
        slo,
        seed=args.seed + 1,
        warmup=2,
        pause_s=args.pause,
        on_level=meter.stop,
        on_level_start=meter.start,
    )
    if not with_priority:
        return {"sweep": sweep, "priority": {"levels": []}}
    batch = await run_bench(
        url,
        workload,
        [RequestClass("batch", "batch")],
        priority_levels(args),
        slo,
        seed=args.seed + 2,  # prompts unlike the sweep's, which a prefix cache could still hold
        warmup=0,
        pause_s=args.pause,
        on_level=progress,
    )
    return {"sweep": sweep, "priority": batch}


def progress(summary: dict[str, Any]) -> None:
    cpu = summary.get("server_cpu_ms_per_output_token")
    for name, s in summary["classes"].items():
        print(
            f"    {summary['label']:<28} {name:<12} {s['num_completed']:>3} ok {s['num_failed']} failed cpu {cpu} ms/tok "
            f"{s['output_tokens_per_s']:7.1f} tok/s  TTFT p95 {s['ttft_ms']['p95']} ms  "
            f"TPOT p50 {s['tpot_ms']['p50']} ms  out {s['mean_output_tokens']}  load {summary['loadavg']:.1f}",
            flush=True,
        )


def run_all(args: argparse.Namespace) -> None:
    from localserve.models.registry import resolve

    model_path = str(resolve(MODEL_ID).path)
    runs_dir = args.out / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    for repeat in range(args.repeats):
        for name in args.servers:
            port = free_port()
            spec = server_specs(args, model_path, port)[name]
            print(f"[repeat {repeat + 1}/{args.repeats}] {name}  load average {os.getloadavg()[0]:.2f}", flush=True)
            started = time.time()
            log_path = CACHE / "logs" / f"{args.tag}-{name}-r{repeat}.log"
            with RunningServer(spec, port, log_path, args.env) as server:
                assert server.process is not None
                with_priority = name in args.priority_servers
                result = asyncio.run(bench_server(args, server.url, server.process.pid, with_priority=with_priority))
            result["server"] = {"name": name, "argv": spec.argv, "env": args.env, "version": server_version(name, args)}
            result["repeat"] = repeat
            result["wall_s"] = round(time.time() - started, 1)
            path = runs_dir / f"{args.tag}-{name}-r{repeat}.json"
            path.write_text(json.dumps(result, indent=1) + "\n")
            print(f"  -> {_show(path)} ({result['wall_s']} s)", flush=True)


def _show(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def server_version(name: str, args: argparse.Namespace) -> str:
    if name == "llama-server":
        out = subprocess.run([str(args.llama_server), "--version"], capture_output=True, text=True, timeout=30)
        return (out.stdout + out.stderr).strip().splitlines()[0] if (out.stdout + out.stderr).strip() else "?"
    if name == "llama_cpp.server":
        import llama_cpp

        return f"llama-cpp-python {llama_cpp.__version__}"
    from localserve import __version__

    return f"localserve {__version__}"


# ---- medians over repeats ----------------------------------------------------

METRICS = {  # name -> path into a class summary
    "output_tokens_per_s": ("output_tokens_per_s",),
    "requests_per_s": ("requests_per_s",),
    "ttft_p50_ms": ("ttft_ms", "p50"),
    "ttft_p95_ms": ("ttft_ms", "p95"),
    "itl_p50_ms": ("itl_ms", "p50"),
    "itl_p95_ms": ("itl_ms", "p95"),
    "tpot_p50_ms": ("tpot_ms", "p50"),
    "latency_p50_ms": ("latency_ms", "p50"),
    "latency_p95_ms": ("latency_ms", "p95"),
    "goodput_requests_per_s": ("goodput_requests_per_s",),
    "mean_output_tokens": ("mean_output_tokens",),
    "num_failed": ("num_failed",),
    "server_cpu_ms_per_output_token": ("server_cpu_ms_per_output_token",),
}


def _get(summary: dict[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = summary
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _median_of(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for metric, path in METRICS.items():
        values = [v for v in (_get(s, path) for s in summaries) if v is not None]
        out[metric] = round(statistics.median(values), 2) if values else None
        out[metric + "_range"] = [min(values), max(values)] if values else None
    out["num_runs"] = len(summaries)
    return out


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians (and ranges) per server, per sweep level and per batch load."""
    servers: dict[str, Any] = {}
    for name in sorted({r["server"]["name"] for r in runs}, key=lambda n: SERVERS.index(n) if n in SERVERS else 9):
        mine = [r for r in runs if r["server"]["name"] == name]
        sweep: dict[str, list[dict[str, Any]]] = {}
        probe: dict[str, list[dict[str, Any]]] = {}
        for run in mine:
            for level in run["sweep"]["levels"]:
                cpu = {"server_cpu_ms_per_output_token": level.get("server_cpu_ms_per_output_token")}
                sweep.setdefault(f"{level['value']:g}", []).append({**level["all"], **cpu})
            for level in run["priority"]["levels"]:
                probe.setdefault(f"{level['value']:g}", []).append(level["classes"].get("interactive", {}))
        loads = [r["sweep"]["meta"]["loadavg_start"][0] for r in mine]
        servers[name] = {
            "version": mine[0]["server"]["version"],
            "argv": mine[0]["server"]["argv"],
            "loadavg_median": round(statistics.median(loads), 2),
            "sweep": {k: _median_of(v) for k, v in sweep.items()},
            "interactive_under_batch": {k: _median_of(v) for k, v in probe.items()},
        }
    return {"servers": servers, "meta": runs[0]["sweep"]["meta"] if runs else {}}


def targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets as ratios (reported, never asserted)."""
    s = summary["servers"]
    ls, ref, lcp = s.get("localserve"), s.get("llama-server"), s.get("llama_cpp.server")
    out: list[dict[str, Any]] = []

    def ratio(a: Any, b: Any) -> float | None:
        return round(a / b, 3) if a is not None and b else None

    def add(what: str, value: float | None, bound: float, at_least: bool) -> None:
        met = None if value is None else (value >= bound if at_least else value <= bound)
        out.append({"target": what, "ratio": value, "bound": ("≥ " if at_least else "≤ ") + f"{bound:g}", "met": met})

    for c in ("8", "16"):
        tps = lambda srv, c=c: (srv or {}).get("sweep", {}).get(c, {}).get("output_tokens_per_s")  # noqa: E731
        add(f"out tok/s at {c} streams vs llama-server", ratio(tps(ls), tps(ref)), 0.9, True)
        add(f"out tok/s at {c} streams vs llama_cpp.server", ratio(tps(ls), tps(lcp)), 2.0, True)
    one = lambda srv, m: (srv or {}).get("sweep", {}).get("1", {}).get(m)  # noqa: E731
    add("single-stream TTFT p50 vs llama-server", ratio(one(ls, "ttft_p50_ms"), one(ref, "ttft_p50_ms")), 1.15, False)
    add("single-stream ITL p50 vs llama-server", ratio(one(ls, "itl_p50_ms"), one(ref, "itl_p50_ms")), 1.15, False)
    for name, srv in (("localserve", ls), ("llama-server (FIFO, for contrast)", ref)):
        probe = (srv or {}).get("interactive_under_batch", {})
        idle = probe.get("0", {}).get("ttft_p95_ms")
        for load, values in probe.items():
            if load != "0":
                what = f"{name}: interactive TTFT p95 under {load} batch streams vs idle"
                add(what, ratio(values.get("ttft_p95_ms"), idle), 1.5, False)
    return out


def markdown_summary(summary: dict[str, Any], checks: list[dict[str, Any]]) -> str:
    lines = [
        "| server | streams | out tok/s | req/s | TTFT p50 / p95 ms | ITL p50 / p95 ms | E2E p50 / p95 s "
        "| server CPU ms / out token |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, srv in summary["servers"].items():
        for c, m in srv["sweep"].items():
            lat = [m["latency_p50_ms"], m["latency_p95_ms"]]
            lines.append(
                f"| {name} | {c} | {m['output_tokens_per_s']} | {m['requests_per_s']} "
                f"| {m['ttft_p50_ms']} / {m['ttft_p95_ms']} | {m['itl_p50_ms']} / {m['itl_p95_ms']} "
                f"| {' / '.join('-' if v is None else f'{v / 1e3:.2f}' for v in lat)} "
                f"| {m['server_cpu_ms_per_output_token']} |"
            )
    if _loads(summary):
        lines += _probe_table(summary)
    lines += ["", "| target | ratio | bound | met |", "|---|---:|---:|---|"]
    lines += [f"| {c['target']} | {c['ratio']} | {c['bound']} | {c['met']} |" for c in checks]
    return "\n".join(lines) + "\n"


def _probe_table(summary: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "Interactive requests (probe) under a batch-priority load, TTFT p50 / p95 ms:",
        "",
        "| server | " + " | ".join(f"{b} batch streams" for b in _loads(summary)) + " |",
        "|---|" + "---:|" * len(_loads(summary)),
    ]
    for name, srv in summary["servers"].items():
        if not srv["interactive_under_batch"]:
            continue
        cells = [srv["interactive_under_batch"].get(b, {}) for b in _loads(summary)]
        lines.append(
            f"| {name} | " + " | ".join(f"{c.get('ttft_p50_ms')} / {c.get('ttft_p95_ms')}" for c in cells) + " |"
        )
    return lines


def _loads(summary: dict[str, Any]) -> list[str]:
    return sorted({b for s in summary["servers"].values() for b in s["interactive_under_batch"]}, key=float)


def write_summary(args: argparse.Namespace) -> dict[str, Any]:
    runs = [json.loads(p.read_text()) for p in sorted((args.out / "runs").glob(f"{args.tag}-*.json"))]
    if not runs:
        raise SystemExit(f"no runs under {args.out / 'runs'} tagged {args.tag!r}")
    summary = aggregate(runs)
    summary["targets"] = targets(summary)
    summary["loadavg_all_runs"] = [r["sweep"]["meta"]["loadavg_start"][0] for r in runs]
    (args.out / f"{args.tag}-summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    text = markdown_summary(summary, summary["targets"])
    (args.out / f"{args.tag}-summary.md").write_text(text)
    print(text)
    from bench.compare_plots import plot_all

    for path in plot_all(summary, args.docs, args.tag):
        print(f"plot: {_show(path)}")
    return summary


# ---- building llama-server ----------------------------------------------------


def build_llama_server() -> None:
    """Download the llama-cpp-python sdist and build its vendored llama.cpp's
    llama-server under ~/.cache/localserve-bench (GGML_NATIVE=OFF, as our
    llama-cpp-python build)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    sdist = CACHE / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
    steps = []
    if not sdist.exists():
        steps.append(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-binary",
                ":all:",
                "--no-deps",
                f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
                "-d",
                str(CACHE),
            ]
        )
    if not LLAMA_CPP_SRC.exists():
        steps.append(["tar", "xzf", str(sdist), "-C", str(CACHE)])
    steps.append(
        [
            "cmake",
            "-S",
            str(LLAMA_CPP_SRC),
            "-B",
            str(LLAMA_CPP_SRC / "build"),
            "-DCMAKE_BUILD_TYPE=Release",
            "-DGGML_NATIVE=OFF",
            "-DLLAMA_CURL=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_BUILD_SERVER=ON",
        ]
    )
    steps.append(
        ["cmake", "--build", str(LLAMA_CPP_SRC / "build"), "--target", "llama-server", f"-j{os.cpu_count() or 2}"]
    )
    for step in steps:
        print("+", " ".join(step), flush=True)
        subprocess.run(step, check=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--servers", default=",".join(SERVERS), help="comma-separated, in run order (default: all three)")
    add("--threads", type=int, default=os.cpu_count() or 2, help="CPU threads of every server (default: all cores)")
    add("--parallel", type=int, default=16, help="slots / sequences decoded together (default: 16)")
    add("--ctx-size", type=int, default=2048, help="context per slot (default: 2048)")
    add("--repeats", type=int, default=3, help="rounds over all servers (default: 3)")
    add("--concurrency", default="1,2,4,8,16", help="closed-loop sweep levels (default: 1,2,4,8,16)")
    add("--requests-per-stream", type=int, default=2, help="requests per stream per level (default: 2)")
    add("--min-requests", type=int, default=4, help="requests of a level at least (default: 4)")
    add("--prompt-tokens", type=int, default=128, help="prompt length, about N words (default: 128)")
    add("--output-tokens", type=int, default=128, help="fixed output length (default: 128)")
    add("--batch-loads", default="0,16,32", help="batch streams under the interactive probe (default: 0,16,32)")
    add(
        "--priority-servers",
        default="localserve,llama-server",
        help="servers that also get the interactive-under-batch test; llama_cpp.server serves one request at "
        "a time, so a probe waits for the whole batch queue (default: localserve,llama-server)",
    )
    add(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment of every server, e.g. OMP_WAIT_POLICY=PASSIVE (repeatable; default: none)",
    )
    add("--probe-rate", type=float, default=1.0, help="interactive probes per second (default: 1)")
    add("--probe-requests", type=int, default=10, help="interactive probes per load (default: 10)")
    add("--probe-output-tokens", type=int, default=16, help="max_tokens of a probe (default: 16)")
    add("--probe-prompt-tokens", type=int, default=64, help="prompt length of a probe (default: 64)")
    add("--probe-delay", type=float, default=3.0, help="head start of the batch load (default: 3 s)")
    add("--slo-ttft-ms", type=float, default=1000.0, help="goodput SLO on TTFT (default: 1000)")
    add("--slo-itl-ms", type=float, default=100.0, help="goodput SLO on time per output token (default: 100)")
    add("--seed", type=int, default=0, help="seed of prompts and arrivals (default: 0)")
    add("--pause", type=float, default=2.0, help="idle seconds between levels (default: 2)")
    add("--llama-server", type=Path, default=LLAMA_SERVER, help=f"llama-server binary (default: {LLAMA_SERVER})")
    add("--build-llama-server", action="store_true", help="download and build llama-server, then exit")
    add("--tag", default="smollm2", help="name of this comparison's files (default: smollm2)")
    add("--out", type=Path, default=ROOT / "bench" / "results", help="results folder (default: bench/results)")
    add("--docs", type=Path, default=ROOT / "docs", help="plots folder (default: docs)")
    add("--plots-only", action="store_true", help="aggregate and plot the saved runs, run nothing")
    args = parser.parse_args(argv)
    args.servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    unknown = set(args.servers) - set(SERVERS)
    if unknown:
        parser.error(f"unknown servers {sorted(unknown)}; known: {', '.join(SERVERS)}")
    args.priority_servers = [s.strip() for s in args.priority_servers.split(",") if s.strip()]
    args.env = dict(item.split("=", 1) for item in args.env)
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.batch_loads = [int(b) for b in args.batch_loads.split(",")]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.build_llama_server:
        build_llama_server()
        return
    if not args.plots_only:
        if "llama-server" in args.servers and not args.llama_server.exists():
            raise SystemExit(f"no llama-server at {args.llama_server}: run with --build-llama-server first")
        run_all(args)
    write_summary(args)


if __name__ == "__main__":
    main()
