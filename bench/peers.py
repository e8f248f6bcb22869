"""localserve against llama-server, both up at once, paired (bench/paired.py).

    .venv/bin/python bench/compare.py --build-llama-server     # once
    .venv/bin/python bench/peers.py --json bench/results/peers-llama-server.json

Same model (SmolLM2-135M-Instruct Q4_1), same threads, slots and context
per slot (localserve `--threads 2 --parallel 16 --ctx-size 1024`,
llama-server `-t 2 -tb 2 -np 16 -c 16384 --cont-batching`), llama-server
built from the llama.cpp vendored in the same llama-cpp-python sdist
(native, OpenMP). Cells: 1, 8 and 16 streams, greedy and temperature 0.7
with `top_k`, `top_p` and `min_p` unset (each server's defaults), 128 output
tokens (`ignore_eos`). Every cell waits for a 1-minute load below 0.5 first
and records it. The README's table comes from the JSON
(bench/readme_tables.py), never typed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.compare_servers import (  # noqa: E402
    LLAMA_SERVER,
    MODEL_ID,
    server_version,
    start_peers,
    wait_for_quiet,
)
from bench.paired import Cell, Target, git_describe, now, parse_cells, run_pairs, table  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--streams", default="1,8,16", help="stream counts (default: 1,8,16)")
    add("--temperatures", default="0,0.7", help="sampling temperatures, 0 is greedy (default: 0,0.7)")
    add("--pairs", type=int, default=3, help="pairs of runs per cell (default: 3)")
    add("--threads", type=int, default=2, help="threads of both servers (default: 2)")
    add("--parallel", type=int, default=16, help="slots of both servers (default: 16)")
    add("--ctx-size", type=int, default=1024, help="context per slot (default: 1024)")
    add("--llama-server", type=Path, default=LLAMA_SERVER, help=f"llama-server binary (default: {LLAMA_SERVER})")
    add("--env", action="append", default=[], metavar="KEY=VALUE", help="extra environment of localserve")
    add("--no-quiet-wait", action="store_true", help="do not wait for a quiet machine before each cell")
    add("--max-wait-quiet", type=float, default=420.0, help="seconds to wait for a load below 0.5 (default: 420)")
    add("--json", type=Path, default=None, help="write the result here (e.g. bench/results/peers-llama-server.json)")
    args = parser.parse_args(argv)
    args.env = dict(item.split("=", 1) for item in args.env)
    return args


def llama_cpp_build() -> str:
    """The instruction sets of the llama.cpp in localserve's venv: the install
    keeps a native or a portable build, whichever decodes faster on an AVX-512
    CPU (scripts/llama_wheel.py), and llama-server is built native."""
    import llama_cpp

    return llama_cpp.llama_print_system_info().decode(errors="replace").strip()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.llama_server.exists():
        raise SystemExit(f"no llama-server at {args.llama_server}: run bench/compare.py --build-llama-server first")
    from localserve.models.registry import resolve

    model_path = str(resolve(MODEL_ID).path)
    commit = git_describe(ROOT)

    def before_cell(cell: Cell) -> float | None:
        if args.no_quiet_wait:
            return round(os.getloadavg()[0], 2)
        load = wait_for_quiet(args.max_wait_quiet)
        print(f"{cell.label}: 1-minute load {load:.2f}", flush=True)
        return round(load, 2)

    with ExitStack() as stack:
        urls = start_peers(stack, args, model_path, "peers")
        targets = [Target(name, url, MODEL_ID) for name, url in urls.items()]
        cells = parse_cells(args.streams, args.temperatures)
        result = run_pairs(targets[0], targets[1], cells, pairs=args.pairs, before_cell=before_cell)
    result.update(
        {
            "kind": "peers",
            "commit": commit,
            "started": now(),
            "servers": {
                "localserve": server_version("localserve", args),
                "llama-server": server_version("llama-server", args),
            },
            "settings": f"--threads {args.threads} --parallel {args.parallel} --ctx-size {args.ctx_size}",
            "localserve_llama_cpp": llama_cpp_build(),
        }
    )
    print("\n" + table(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
