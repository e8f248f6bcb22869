"""Two servers up at once, measured in pairs: the comparison every speed
claim of this project rests on (bench/guard.py, bench/peers.py,
bench/busy_desktop.py).

The host's speed drifts by up to 30% within minutes, so two servers measured
one after the other compare the drift as much as the servers. Here both are
up for the whole run; a cell (stream count x sampling) is measured as
several pairs, each pair one run on each server back to back, the order
alternating pair by pair (A B, B A, A B, ...). A pair's ratio compares two
runs a few seconds apart; the cell reports the median of the pairs' ratios
and their range, and the raw runs.

Every run sends the same shape of work: closed-loop streams of completions
with ~32-word prompts and exactly `output_tokens` tokens out (`ignore_eos`),
both servers the same prompts within a pair and new prompts every pair (no
prefix cache hits across runs).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from localserve.bench.report import Slo, summarize_level
from localserve.bench.runner import Level, LoadRunner
from localserve.bench.workload import RequestClass, Workload

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, slots=True)
class Cell:
    """One measured condition: stream count and sampling."""

    streams: int
    temperature: float = 0.0

    @property
    def num_requests(self) -> int:
        """Enough for a few seconds of steady state: 4 alone, 2 a stream beside others."""
        return max(4, 2 * self.streams)

    @property
    def half_requests(self) -> int:
        """A nested pair's half run: half the requests, and at least 3 (about
        4 seconds of one stream; shorter, a one-stream half is as noisy as
        this host)."""
        return max(3, self.num_requests // 2)

    @property
    def label(self) -> str:
        sampling = "greedy" if self.temperature <= 0 else f"t={self.temperature:g}"
        return f"{self.streams} x {sampling}"


@dataclass(frozen=True, slots=True)
class Target:
    """A server under test: its name in reports and its base URL."""

    name: str
    url: str
    model: str


def parse_cells(streams: str, temperatures: str) -> list[Cell]:
    """`1,8` x `0,0.7` -> the four cells, stream count first."""
    counts = [int(s) for s in streams.split(",") if s.strip()]
    temps = [float(t) for t in temperatures.split(",") if t.strip()]
    return [Cell(n, t) for n in counts for t in temps]


async def run_once(
    target: Target,
    cell: Cell,
    *,
    seed: int,
    prompt_tokens: int,
    output_tokens: int,
    extra_body: dict[str, Any],
    seeded: bool = False,
    num_requests: int = 0,
) -> dict[str, Any]:
    """One closed-loop run of `cell` on `target`: tok/s, TTFT and ITL.
    `seeded` gives every sampled request its own seed, the same on both
    sides of a pair; `num_requests` replaces the cell's own count."""
    workload = Workload(
        target.model, "completions", prompt_tokens, output_tokens, True, cell.temperature, extra_body, seeded
    )
    level = Level("concurrency", cell.streams, num_requests or cell.num_requests)
    async with LoadRunner(target.url, workload, [RequestClass("default")], seed=seed) as runner:
        summary = summarize_level(await runner.run(level), Slo())
    s = summary["all"]
    if s["num_failed"]:
        raise RuntimeError(f"{target.name}: {s['num_failed']} requests failed at {cell.label}: {s['errors']}")
    return {
        "tok_s": s["output_tokens_per_s"],
        "ttft_p50_ms": s["ttft_ms"]["p50"],
        "itl_p50_ms": s["itl_ms"]["p50"],
        "duration_s": s["duration_s"],
        "loadavg": round(os.getloadavg()[0], 2),
    }


async def warm(target: Target, output_tokens: int = 16) -> None:
    """A few requests first: the first of a fresh process is no measure."""
    workload = Workload(target.model, "completions", 32, output_tokens, True, 0.0)
    async with LoadRunner(target.url, workload, [RequestClass("default")], seed=10_000) as runner:
        results = await runner.warmup(2, output_tokens=output_tokens)
    errors = [r.error for r in results if r.error]
    if errors:
        raise RuntimeError(f"{target.name} at {target.url} failed its warm-up request: {errors[0]}")


def run_pairs(
    a: Target,
    b: Target,
    cells: Sequence[Cell],
    *,
    pairs: int = 3,
    prompt_tokens: int = 32,
    output_tokens: int = 128,
    extra_body: dict[str, Any] | None = None,
    before_cell: Callable[[Cell], float | None] | None = None,
    seed: int = 0,
    seeded: bool = False,
    nested: bool = False,
) -> dict[str, Any]:
    """Measure every cell as `pairs` pairs of runs, A then B, then B then A,
    and so on; the ratio is A's tok/s over B's. `before_cell` may wait (for
    a quiet machine) and returns the load it started at.

    `nested` runs each pair as A B B A (or B A A B) in half runs of half
    the requests, and counts each server's two halves together: a drift of
    the host's speed within the pair then falls on both servers alike."""
    extra = dict(extra_body or {})
    out: list[dict[str, Any]] = []
    for target in (a, b):
        asyncio.run(warm(target))
    for index, cell in enumerate(cells):
        load = before_cell(cell) if before_cell is not None else None
        runs: list[dict[str, Any]] = []
        for pair in range(pairs):
            order = (a, b) if pair % 2 == 0 else (b, a)
            pair_seed = seed + 1_000 * index + 100 * pair
            result = {}
            sequence = (
                [(t, 0) for t in order] + [(t, 1) for t in reversed(order)] if nested else [(t, 0) for t in order]
            )
            halves: dict[str, list[dict[str, Any]]] = {a.name: [], b.name: []}
            for target, half in sequence:
                halves[target.name].append(
                    asyncio.run(
                        run_once(
                            target,
                            cell,
                            seed=pair_seed + half,
                            prompt_tokens=prompt_tokens,
                            output_tokens=output_tokens,
                            extra_body=extra,
                            seeded=seeded,
                            num_requests=cell.half_requests if nested else 0,
                        )
                    )
                )
            for name, parts in halves.items():
                result[name] = combine_runs(parts)
            result["ratio"] = round(result[a.name]["tok_s"] / result[b.name]["tok_s"], 4)
            result["first"] = order[0].name
            runs.append(result)
            print(_pair_line(cell, pair, a, b, result), flush=True)
        out.append(summarize_cell(cell, a, b, runs, load))
    return {"a": a.name, "b": b.name, "cells": out}


def combine_runs(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One server's runs within a pair as one: tok/s over their whole time,
    latencies as the mean of their medians."""
    if len(parts) == 1:
        return parts[0]
    duration = sum(p["duration_s"] for p in parts)
    tokens = sum(p["tok_s"] * p["duration_s"] for p in parts)
    return {
        "tok_s": round(tokens / duration, 2),
        "ttft_p50_ms": round(statistics.fmean(p["ttft_p50_ms"] for p in parts), 2),
        "itl_p50_ms": round(statistics.fmean(p["itl_p50_ms"] for p in parts), 2),
        "duration_s": round(duration, 3),
        "loadavg": parts[0]["loadavg"],
        "halves_tok_s": [p["tok_s"] for p in parts],
    }


def summarize_cell(cell: Cell, a: Target, b: Target, runs: list[dict[str, Any]], load: float | None) -> dict[str, Any]:
    ratios = [r["ratio"] for r in runs]

    def median(name: str, key: str) -> float:
        return round(statistics.median(r[name][key] for r in runs), 2)

    return {
        **asdict(cell),
        "num_requests": cell.num_requests,
        "label": cell.label,
        "loadavg_before": load,
        "ratio_median": round(statistics.median(ratios), 4),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        a.name: {k: median(a.name, k) for k in ("tok_s", "ttft_p50_ms", "itl_p50_ms")},
        b.name: {k: median(b.name, k) for k in ("tok_s", "ttft_p50_ms", "itl_p50_ms")},
        "runs": runs,
    }


def _pair_line(cell: Cell, pair: int, a: Target, b: Target, r: dict[str, Any]) -> str:
    ra, rb = r[a.name], r[b.name]
    return (
        f"  {cell.label:<12} pair {pair + 1}: {a.name} {ra['tok_s']:7.1f} tok/s (ITL {ra['itl_p50_ms']} ms)  "
        f"{b.name} {rb['tok_s']:7.1f} tok/s (ITL {rb['itl_p50_ms']} ms)  ratio {r['ratio']:.3f}  "
        f"load {ra['loadavg']:.2f}"
    )


def table(result: dict[str, Any]) -> str:
    """The cells as a Markdown table: median ratio, range, both servers' tok/s."""
    a, b = result["a"], result["b"]
    lines = [
        f"| cell | {a} / {b} (median) | range | {a} tok/s | {b} tok/s | ITL p50 ms ({a} / {b}) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for c in result["cells"]:
        lines.append(
            f"| {c['label']} | {c['ratio_median']:.3f} | {c['ratio_min']:.2f}-{c['ratio_max']:.2f} | "
            f"{c[a]['tok_s']:.1f} | {c[b]['tok_s']:.1f} | {c[a]['itl_p50_ms']} / {c[b]['itl_p50_ms']} |"
        )
    return "\n".join(lines)


def git_describe(path: Path = ROOT, rev: str | None = None) -> str:
    """The commit `rev` names in the repository at `path` (short hash); None:
    the working tree, its HEAD with `+dirty` when it has uncommitted changes."""
    sha = subprocess.run(
        ["git", "-C", str(path), "rev-parse", "--short", rev or "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    if rev is None:
        dirty = subprocess.run(
            ["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
        ).stdout.strip()
        if dirty:
            sha += "+dirty"
    return sha


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
