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
bench/results/TAG-summary.{json,md}, plots to docs/bench-*.png. The server
modules: compare_servers (start, stop, CPU time, build), compare_summary
(medians, targets, tables), compare_plots (matplotlib).

    python bench/compare.py --build-llama-server      # once: download the sdist, build llama-server (minutes)
    python bench/compare.py --repeats 3 --threads 2
    python bench/compare.py --plots-only              # re-aggregate and re-plot the saved runs
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.compare_plots import plot_all  # noqa: E402
from bench.compare_servers import (  # noqa: E402
    CACHE,
    LLAMA_SERVER,
    MODEL_ID,
    CpuMeter,
    RunningServer,
    build_llama_server,
    free_port,
    server_specs,
    server_version,
    wait_for_quiet,
)
from bench.compare_summary import SERVERS, aggregate, markdown_summary, targets  # noqa: E402
from localserve.bench.report import Slo  # noqa: E402
from localserve.bench.runner import Level, Probe  # noqa: E402
from localserve.bench.session import run_bench  # noqa: E402
from localserve.bench.workload import RequestClass, Workload  # noqa: E402

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


async def bench_server(args: argparse.Namespace, url: str, pid: int, *, with_priority: bool) -> dict[str, Any]:
    workload = Workload(MODEL_ID, "completions", args.prompt_tokens, args.output_tokens, True, 0.0)
    slo = Slo(args.slo_ttft_ms / 1e3, args.slo_itl_ms / 1e3)
    meter = CpuMeter(pid)

    def level_done(summary: dict[str, Any]) -> None:
        meter.stop(summary)
        progress(summary)

    sweep = await run_bench(
        url,
        workload,
        [RequestClass("default")],
        sweep_levels(args),
        slo,
        seed=args.seed + 1,
        warmup=2,
        pause_s=args.pause,
        on_level=level_done,
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
            load = wait_for_quiet(args.max_wait_quiet)
            print(f"[repeat {repeat + 1}/{args.repeats}] {name}  load average {load:.2f}", flush=True)
            started = time.time()
            log_path = CACHE / "logs" / f"{args.tag}-{name}-r{repeat}.log"
            with RunningServer(spec, port, log_path, args.env) as server:
                assert server.process is not None
                with_priority = name in args.priority_servers
                result = asyncio.run(bench_server(args, server.url, server.process.pid, with_priority=with_priority))
            result["server"] = {"name": name, "argv": spec.argv, "env": args.env, "version": server_version(name, args)}
            result["repeat"] = repeat
            result["loadavg_before"] = round(load, 2)
            result["wall_s"] = round(time.time() - started, 1)
            path = runs_dir / f"{args.tag}-{name}-r{repeat}.json"
            path.write_text(json.dumps(result, indent=1) + "\n")
            print(f"  -> {_show(path)} ({result['wall_s']} s)", flush=True)


def _show(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


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
    for path in plot_all(summary, args.docs, args.tag):
        print(f"plot: {_show(path)}")
    return summary


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
    add("--build-llama-server", action="store_true", help="download and build llama-server (native), then exit")
    add("--portable", action="store_true", help="with --build-llama-server: GGML_NATIVE=OFF (default: native)")
    add(
        "--max-wait-quiet",
        type=float,
        default=420.0,
        help="seconds to wait before each run for a 1-minute load average below 0.5; then give up (default: 420)",
    )
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
        build_llama_server(portable=args.portable)
        return
    if not args.plots_only:
        if "llama-server" in args.servers and not args.llama_server.exists():
            raise SystemExit(f"no llama-server at {args.llama_server}: run with --build-llama-server first")
        run_all(args)
    write_summary(args)


if __name__ == "__main__":
    main()
