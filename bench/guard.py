"""The speed guard: does a change slow localserve down? Run it for every
change to engine/, backends/, serving/ or the streaming paths of api/, and
put its table in the commit message.

    .venv/bin/python bench/guard.py BASE [HEAD]

BASE and HEAD are git revisions; HEAD left out is the working tree as it is
(uncommitted changes included). Each is served from its own checkout (BASE
from a detached worktree under ~/.cache/localserve-bench/guard/, kept for the
next run) with this venv, both up at once on SmolLM2-135M-Instruct Q4_1 (2
threads, 16 slots x 1024), each with its own empty LOCALSERVE_HOME. The cells
-- 1 and 8 streams, greedy and temperature 0.7 -- are measured as paired runs
(bench/paired.py), the order alternating pair by pair, and the servers
started twice: half the pairs with HEAD's server started first, half with
BASE's, so neither start order decides a verdict. Known weakness: on the
2-core machine the 8 x t=0.7 cell gave the same code against itself
0.940 (HEAD first), 1.057 (BASE first) and 0.914 (both orders),
cause unknown (bench/results/guard-*same-code*.json); a failure there alone
is confirmed by running the guard again with BASE and HEAD swapped.
It prints each pair,
then a table of HEAD / BASE tok/s per cell (median of the pairs and their
range), and exits 1 when a cell's median falls below --threshold (0.95).
About 5 minutes on 2 cores; it first waits for a 1-minute load below 0.5.
`--head-threads auto` measures the adaptive thread count against a fixed
one (`guard.py HEAD --head-threads auto`: the same code on both sides), and
`--head-env KEY=VALUE` a setting (`guard.py HEAD --head-env
LOCALSERVE_THREAD_WAIT=default`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.compare_servers import (  # noqa: E402
    CACHE,
    MODEL_ID,
    RunningServer,
    ServerSpec,
    free_port,
    wait_for_quiet,
)
from bench.paired import (  # noqa: E402
    Cell,
    Target,
    git_describe,
    now,
    parse_cells,
    run_pairs,
    summarize_cell,
    table,
)

WORKTREES = CACHE / "guard"


def checkout(rev: str) -> tuple[Path, str]:
    """A detached worktree of `rev` (made once, reused), and its short hash."""
    sha = git_describe(ROOT, rev)
    path = WORKTREES / sha
    if not (path / "localserve").is_dir():
        WORKTREES.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], check=True)
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", "--force", str(path), sha],
            check=True,
            capture_output=True,
        )
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", str(path / "localserve")], check=False)
    return path, sha


def serve(
    tree: Path, args: argparse.Namespace, stack: ExitStack, label: str, threads: str, extra_env: dict[str, str]
) -> Target:
    """Start localserve from `tree` on a free port, with its own data directory."""
    port = free_port()
    home = stack.enter_context(tempfile.TemporaryDirectory(prefix=f"guard-{label}-"))
    argv = [sys.executable, "-m", "localserve", "serve", "--port", str(port), "--model", MODEL_ID]
    argv += ["--threads", threads, "--parallel", str(args.parallel), "--ctx-size", str(args.ctx_size)]
    env = {"PYTHONPATH": str(tree), "LOCALSERVE_HOME": home, **extra_env}
    log = CACHE / "logs" / f"guard-{label}.log"
    stack.enter_context(RunningServer(ServerSpec(label, argv, "/health"), port, log, env, cwd=tree))
    return Target(label, f"http://127.0.0.1:{port}", MODEL_ID)


def merge_halves(
    halves: list[tuple[bool, dict[str, Any]]], cells: list[Cell], head: Target, base: Target
) -> dict[str, Any]:
    """One result from the runs of both start orders: each cell summarized
    over all its pairs, each pair marked with the server started first."""
    merged = []
    for index, cell in enumerate(cells):
        runs = []
        for base_first, half in halves:
            for run in half["cells"][index]["runs"]:
                runs.append({**run, "started_first": base.name if base_first else head.name})
        loads = [half["cells"][index]["loadavg_before"] for _, half in halves]
        merged.append(summarize_cell(cell, head, base, runs, next((x for x in loads if x is not None), None)))
    return {"a": head.name, "b": base.name, "cells": merged}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("base", help="the revision to compare against (e.g. HEAD~1, a commit hash)")
    add("head", nargs="?", default=None, help="the revision under test (default: the working tree as it is)")
    add("--streams", default="1,8", help="stream counts (default: 1,8)")
    add("--temperatures", default="0,0.7", help="sampling temperatures, 0 is greedy (default: 0,0.7)")
    add("--pairs", type=int, default=4, help="pairs of runs per cell, split between both start orders (default: 4)")
    add("--threshold", type=float, default=0.95, help="lowest HEAD/BASE median accepted per cell (default: 0.95)")
    add("--threads", default="2", help="--threads of both servers (default: 2)")
    add(
        "--head-threads",
        default=None,
        help="--threads of HEAD only, e.g. auto against a fixed BASE (default: --threads)",
    )
    add(
        "--head-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment of HEAD only, e.g. LOCALSERVE_THREAD_WAIT=default against the same commit (repeatable)",
    )
    add(
        "--base-first",
        action="store_true",
        help="with --pairs 1: start BASE's server first (more pairs are split between both orders)",
    )
    add("--parallel", type=int, default=16, help="--parallel of both servers (default: 16)")
    add("--ctx-size", type=int, default=1024, help="--ctx-size of both servers (default: 1024)")
    add("--json", type=Path, default=None, help="also write the result here (e.g. bench/results/guard-X.json)")
    add("--max-wait-quiet", type=float, default=420.0, help="seconds to wait for a load below 0.5 (default: 420)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    base_tree, base_sha = checkout(args.base)
    head_tree, head_sha = (ROOT, git_describe(ROOT)) if args.head is None else checkout(args.head)
    if head_tree == ROOT:
        subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", str(ROOT / "localserve")], check=False)
    load = wait_for_quiet(args.max_wait_quiet)
    print(f"guard: HEAD {head_sha} against BASE {base_sha}; 1-minute load {load:.2f}", flush=True)
    head_env = dict(item.split("=", 1) for item in args.head_env)
    cells = parse_cells(args.streams, args.temperatures)
    no_env: dict[str, str] = {}
    halves = []
    for base_first in (False, True) if args.pairs > 1 else (args.base_first,):
        pairs = (args.pairs + (0 if base_first else 1)) // 2 if args.pairs > 1 else 1
        print(f"guard: {pairs} pair(s) with {'BASE' if base_first else 'HEAD'}'s server started first", flush=True)
        with ExitStack() as stack:
            head_args = (head_tree, args, stack, f"head-{head_sha}", args.head_threads or args.threads, head_env)
            base_args = (base_tree, args, stack, f"base-{base_sha}", args.threads, no_env)
            if base_first:
                base = serve(*base_args)
                head = serve(*head_args)
            else:
                head = serve(*head_args)
                base = serve(*base_args)
            halves.append((base_first, run_pairs(head, base, cells, pairs=pairs)))
    result = merge_halves(halves, cells, head, base)
    result.update(
        {
            "kind": "guard",
            "head": head_sha,
            "base": base_sha,
            "started": now(),
            "loadavg_before": round(load, 2),
            "loadavg_after": round(os.getloadavg()[0], 2),
            "threshold": args.threshold,
            "servers": f"--threads {args.threads} --parallel {args.parallel} --ctx-size {args.ctx_size}",
            "head_threads": args.head_threads or args.threads,
            "head_env": args.head_env,
            "start_orders": ["base first" if first else "head first" for first, _ in halves],
        }
    )
    failing = [c["label"] for c in result["cells"] if c["ratio_median"] < args.threshold]
    print(f"\nbench/guard.py {base_sha} -> {head_sha} (HEAD / BASE tok/s, {args.pairs} pairs, load {load:.2f}):\n")
    print(table(result).replace(f"head-{head_sha}", "HEAD").replace(f"base-{base_sha}", "BASE"))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    if failing:
        print(f"\nguard: FAIL, below {args.threshold} at {', '.join(failing)}")
        return 1
    print(f"\nguard: ok (every cell >= {args.threshold})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
