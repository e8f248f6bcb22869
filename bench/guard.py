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
(bench/paired.py), the servers started twice: half the pairs with HEAD's
server started first, half with BASE's, so neither start order decides a
verdict.

This host's speed moves by 5-10% from one 3-second run to the next (the same
requests on one server, CPU time per token moving with the wall time), so:
a pair is nested, A B B A in half runs, each server's two halves counted
together; every sampled request carries a seed, the same on both sides, so
both servers sample the same text (unseeded, one server's text fell into a
loop that prompt-lookup drafting speeds up and the other's did not, which
made the 8 x t=0.7 cell fail the same code against itself: 0.91-0.94); and
a cell whose median falls below the threshold is measured once more (as
many pairs again, both start orders) and judged on all its pairs.
It prints each pair,
then a table of HEAD / BASE tok/s per cell (median of the pairs and their
range), and exits 1 when a cell's median falls below --threshold (0.95).
About 5 minutes on 2 cores (2-3 more to confirm a low cell); it first waits for a 1-minute load below 0.5.
`--head-threads auto` measures the adaptive thread count against a fixed
one (`guard.py HEAD --head-threads auto`: the same code on both sides), and
`--head-env KEY=VALUE` a setting (`guard.py HEAD --head-env
LOCALSERVE_THREAD_WAIT=default`). `--neighbours bursty` measures with one
other process spinning 2 s and idling 2 s, as bench/busy_desktop.py does
(`--neighbours busy`: spinning throughout): a change to the adaptive thread
count (engine/threads.py) runs it with `--threads auto` on both sides.
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

from bench.busy_desktop import neighbours  # noqa: E402
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
    argv += ["--log-level", args.log_level]
    env = {"PYTHONPATH": str(tree), "LOCALSERVE_HOME": home, **extra_env}
    log = CACHE / "logs" / f"guard-{label}.log"
    stack.enter_context(RunningServer(ServerSpec(label, argv, "/health"), port, log, env, cwd=tree))
    return Target(label, f"http://127.0.0.1:{port}", MODEL_ID)


def merge_halves(
    halves: list[tuple[bool, dict[str, Any]]], cells: list[Cell], head: Target, base: Target
) -> dict[str, Any]:
    """One result from the runs of every start of the servers: each cell
    summarized over all its pairs, each pair marked with the server started
    first (a confirming round measures only some of the cells)."""
    merged = []
    for cell in cells:
        runs, loads = [], []
        for base_first, half in halves:
            for measured in half["cells"]:
                if measured["label"] == cell.label:
                    loads.append(measured["loadavg_before"])
                    for run in measured["runs"]:
                        runs.append({**run, "started_first": base.name if base_first else head.name})
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
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment of both servers, e.g. LOCALSERVE_SPECULATIVE=off (repeatable)",
    )
    add(
        "--unseeded",
        action="store_true",
        help="send sampled requests without a seed (each server then samples its own text)",
    )
    add(
        "--whole-runs",
        action="store_true",
        help="run each pair as A B (whole runs) instead of A B B A in half runs",
    )
    add(
        "--no-confirm",
        dest="confirm",
        action="store_false",
        help="decide on the first round alone (by default a cell below the threshold is measured once more, "
        "as many pairs again, and judged on all its pairs)",
    )
    add(
        "--base-first",
        action="store_true",
        help="with --pairs 1: start BASE's server first (more pairs are split between both orders)",
    )
    add(
        "--neighbours",
        choices=("quiet", "busy", "bursty"),
        default="quiet",
        help="other programs while measuring, as bench/busy_desktop.py makes them: one process spinning "
        "(busy) or spinning --burst seconds on and off (bursty); changes to engine/threads.py run the guard "
        "under bursty too (default: quiet)",
    )
    add("--burst", default="2,2", help="bursty: seconds on, seconds off (default: 2,2)")
    add("--parallel", type=int, default=16, help="--parallel of both servers (default: 16)")
    add("--ctx-size", type=int, default=1024, help="--ctx-size of both servers (default: 1024)")
    add(
        "--log-level",
        default="info",
        help="--log-level of both servers; debug logs each thread switch and why (logs under ~/.cache/localserve-bench/logs)",
    )
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
    both_env = dict(item.split("=", 1) for item in args.env)
    head_env = both_env | dict(item.split("=", 1) for item in args.head_env)
    cells = parse_cells(args.streams, args.temperatures)
    halves: list[tuple[bool, dict[str, Any]]] = []
    head_label, base_label = f"head-{head_sha}", f"base-{base_sha}"
    # merge_halves and the table need only the names; each round serves its own
    head, base = Target(head_label, "", MODEL_ID), Target(base_label, "", MODEL_ID)

    on_s, off_s = (float(x) for x in args.burst.split(","))

    def measure(round_cells: list[Cell], round_index: int) -> None:
        with neighbours(args.neighbours, 1, on_s, off_s):
            measure_orders(round_cells, round_index)

    def measure_orders(round_cells: list[Cell], round_index: int) -> None:
        for base_first in (False, True) if args.pairs > 1 else (args.base_first,):
            pairs = (args.pairs + (0 if base_first else 1)) // 2 if args.pairs > 1 else 1
            who = "BASE" if base_first else "HEAD"
            print(f"guard: {pairs} pair(s) with {who}'s server started first", flush=True)
            with ExitStack() as stack:
                head_args = (head_tree, args, stack, head_label, args.head_threads or args.threads, head_env)
                base_args = (base_tree, args, stack, base_label, args.threads, both_env)
                if base_first:
                    served_base = serve(*base_args)
                    served_head = serve(*head_args)
                else:
                    served_head = serve(*head_args)
                    served_base = serve(*base_args)
                measured = run_pairs(
                    served_head,
                    served_base,
                    round_cells,
                    pairs=pairs,
                    seeded=not args.unseeded,
                    nested=not args.whole_runs,
                    seed=10_000 * (2 * round_index + base_first),
                )
                halves.append((base_first, measured))

    measure(cells, 0)
    confirmed: list[str] = []
    if args.confirm:
        below = [c for c in merge_halves(halves, cells, head, base)["cells"] if c["ratio_median"] < args.threshold]
        if below:
            again = [cell for cell in cells if cell.label in {c["label"] for c in below}]
            confirmed = [cell.label for cell in again]
            print(f"guard: below {args.threshold} at {', '.join(confirmed)}; measuring them again", flush=True)
            measure(again, 1)
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
            "env": args.env,
            "seeded": not args.unseeded,
            "nested": not args.whole_runs,
            "confirmed": confirmed,
            "neighbours": args.neighbours if args.neighbours != "bursty" else f"bursty {args.burst}",
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
