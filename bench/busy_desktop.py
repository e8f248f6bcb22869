"""localserve against llama-server on a busy desktop (issue 43): paired as in
bench/paired.py, at 1 and 8 streams, first on a quiet machine, then with
other programs taking CPU.

    .venv/bin/python bench/compare.py --build-llama-server     # once
    .venv/bin/python bench/busy_desktop.py --json bench/results/busy-desktop.json

Conditions, one after the other, both servers up throughout:
- quiet: nothing else runs (waits for a 1-minute load below 0.5 first);
- busy: `--busy-cores` processes spin (`while True: pass`), one core each;
- bursty: as many processes spin 2 s, sleep 2 s, out of step with the runs.

llama-server runs with `-t --threads`; localserve with `--threads auto` (its
default: all cores, fewer while other programs keep cores busy,
engine/threads.py) unless `--localserve-threads` says otherwise. After each
condition the script reads the thread count localserve chose and the CPU it
saw taken (/api/v1/stats). It prints each condition's table, localserve's
tok/s under load over its quiet tok/s per cell, and writes everything to
`--json`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.compare_servers import LLAMA_SERVER, MODEL_ID, server_version, start_peers, wait_for_quiet  # noqa: E402
from bench.paired import Target, git_describe, now, parse_cells, run_pairs, table  # noqa: E402

SPIN = "while True: pass"
BURST = "import time\nwhile True:\n    end = time.monotonic() + {on}\n    while time.monotonic() < end: pass\n    time.sleep({off})"


@contextmanager
def neighbours(condition: str, cores: int, on_s: float, off_s: float) -> Iterator[None]:
    """Processes that take CPU for the length of the block."""
    code = {"quiet": None, "busy": SPIN, "bursty": BURST.format(on=on_s, off=off_s)}[condition]
    procs = [] if code is None else [subprocess.Popen([sys.executable, "-c", code]) for _ in range(cores)]
    try:
        if procs:
            time.sleep(2.0)  # let the servers see it before the first run
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def thread_state(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/api/v1/stats", timeout=10) as response:
        stats = json.load(response)
    for model in stats.get("models", []):
        if isinstance(model, dict) and "threads" in model:
            return dict(model["threads"])
    return {}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--conditions", default="quiet,busy,bursty", help="which, in order (default: quiet,busy,bursty)")
    add("--streams", default="1,8", help="stream counts (default: 1,8)")
    add("--temperatures", default="0", help="sampling temperatures, 0 is greedy (default: 0)")
    add("--pairs", type=int, default=3, help="pairs of runs per cell (default: 3)")
    add("--busy-cores", type=int, default=1, help="spinning processes in the busy and bursty conditions (default: 1)")
    add("--burst", default="2,2", help="bursty: seconds on, seconds off (default: 2,2)")
    add("--threads", type=int, default=2, help="llama-server's -t and -tb (default: 2)")
    add("--localserve-threads", default="auto", help="localserve's --threads (default: auto)")
    add("--parallel", type=int, default=16, help="slots of both servers (default: 16)")
    add("--ctx-size", type=int, default=1024, help="context per slot (default: 1024)")
    add("--llama-server", type=Path, default=LLAMA_SERVER, help=f"llama-server binary (default: {LLAMA_SERVER})")
    add("--max-wait-quiet", type=float, default=420.0, help="seconds to wait for a load below 0.5 (default: 420)")
    add("--json", type=Path, default=None, help="write the result here (e.g. bench/results/busy-desktop.json)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.llama_server.exists():
        raise SystemExit(f"no llama-server at {args.llama_server}: run bench/compare.py --build-llama-server first")
    from localserve.models.registry import resolve

    on_s, off_s = (float(x) for x in args.burst.split(","))
    model_path = str(resolve(MODEL_ID).path)
    cells = parse_cells(args.streams, args.temperatures)
    load = wait_for_quiet(args.max_wait_quiet)
    print(f"busy_desktop: 1-minute load {load:.2f} at the start; {os.cpu_count()} cores", flush=True)
    conditions: dict[str, Any] = {}
    with ExitStack() as stack:
        urls = start_peers(stack, args, model_path, "busy")
        targets = [Target(name, url, MODEL_ID) for name, url in urls.items()]
        for condition in args.conditions.split(","):
            if condition == "quiet":
                wait_for_quiet(args.max_wait_quiet)
            print(f"\n== {condition}", flush=True)
            with neighbours(condition, args.busy_cores, on_s, off_s):
                result = run_pairs(targets[0], targets[1], cells, pairs=args.pairs)
                result["localserve_threads"] = thread_state(urls["localserve"])
            print(table(result))
            print(f"localserve threads at the end: {result['localserve_threads']}", flush=True)
            conditions[condition] = result
    own: dict[str, dict[str, float]] = {}
    if "quiet" in conditions:
        quiet = {c["label"]: c["localserve"]["tok_s"] for c in conditions["quiet"]["cells"]}
        for name, result in conditions.items():
            if name != "quiet":
                own[name] = {
                    c["label"]: round(c["localserve"]["tok_s"] / quiet[c["label"]], 3) for c in result["cells"]
                }
                print(f"localserve {name} / quiet tok/s: {own[name]}")
    report = {
        "kind": "busy_desktop",
        "commit": git_describe(ROOT),
        "started": now(),
        "loadavg_before": round(load, 2),
        "cores": os.cpu_count(),
        "busy_cores": args.busy_cores,
        "burst_s": [on_s, off_s],
        "servers": {
            "localserve": server_version("localserve", args),
            "llama-server": server_version("llama-server", args),
        },
        "settings": f"localserve --threads {args.localserve_threads}, llama-server -t {args.threads}; "
        f"--parallel {args.parallel} --ctx-size {args.ctx_size}",
        "conditions": conditions,
        "localserve_over_its_quiet": own,
    }
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
