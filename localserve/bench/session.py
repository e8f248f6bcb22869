"""A benchmark session against one server: its levels, warm-up, the run of
each level, and the JSON document that records it all."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import platform
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from localserve import __version__
from localserve.bench.report import Slo, summarize_level
from localserve.bench.runner import Level, LoadRunner, Probe
from localserve.bench.workload import RequestClass, Workload


class BenchError(Exception):
    """The benchmark cannot run: no server, no model, a failed warm-up."""


def build_levels(
    concurrency: Sequence[float],
    rates: Sequence[float],
    num_requests: int = 0,
    duration_s: float = 0.0,
    probe: Probe | None = None,
) -> list[Level]:
    """Closed-loop levels, then open-loop ones. Without a request count or a
    duration, a level sends max(8, 4 x concurrency) or max(8, 20 s x rate)."""

    def count(auto: int) -> int:
        return 0 if (duration_s or probe) else (num_requests or auto)

    levels = [Level("concurrency", c, count(max(8, int(4 * c))), duration_s, probe) for c in concurrency]
    levels += [Level("rate", r, count(max(8, math.ceil(20 * r))), duration_s, probe) for r in rates if r > 0]
    if any(level.value == 0 and level.probe is None for level in levels):
        raise BenchError("a level of 0 sends nothing without a probe (--probe-rate)")
    return levels


def describe(workload: Workload) -> str:
    fixed = "fixed" if workload.fixed_output else "up to"
    return (
        f"{workload.endpoint}, prompt ~{workload.prompt_tokens} tokens, {fixed} {workload.output_tokens} "
        f"output tokens, temperature {workload.temperature:g}"
    )


async def run_bench(
    base_url: str,
    workload: Workload,
    classes: Sequence[RequestClass],
    levels: Sequence[Level],
    slo: Slo,
    *,
    api_key: str | None = None,
    seed: int = 0,
    warmup: int = 1,
    pause_s: float = 1.0,
    timeout_s: float = 600.0,
    on_level: Callable[[dict[str, Any]], None] | None = None,
    on_level_start: Callable[[Level], None] | None = None,
) -> dict[str, Any]:
    """Run `levels` one after another against `base_url`; the JSON document.
    `on_level_start(level)` and `on_level(summary)` bracket each level (the
    summary may be amended, e.g. with the server's CPU time)."""
    meta: dict[str, Any] = {
        "url": base_url,
        "workload": dataclasses.asdict(workload),
        "classes": [dataclasses.asdict(c) for c in classes],
        "slo": dataclasses.asdict(slo),
        "seed": seed,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "loadavg_start": os.getloadavg(),
        "cpu_count": os.cpu_count(),
        "machine": f"{platform.machine()} {platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "localserve": __version__,
    }
    summaries = []
    async with LoadRunner(base_url, workload, classes, api_key=api_key, seed=seed, timeout_s=timeout_s) as runner:
        errors = [r.error for r in await runner.warmup(warmup) if r.error]
        if errors:
            raise BenchError(f"the warm-up request to {base_url} failed: {errors[0]}")
        for i, level in enumerate(levels):
            if i:
                # Requests cut off at the end of the last level may still hold the server
                # (a FIFO server runs queued ones until it notices); one tiny request waits that out.
                await runner.warmup(1, output_tokens=1)
                await asyncio.sleep(pause_s)
            if on_level_start is not None:
                on_level_start(level)
            summary = summarize_level(await runner.run(level), slo)
            summary["loadavg"] = os.getloadavg()[0]
            summaries.append(summary)
            if on_level is not None:
                on_level(summary)
    meta["loadavg_end"] = os.getloadavg()
    return {"meta": meta, "levels": summaries}


def first_model(base_url: str, api_key: str | None) -> str:
    """The first model a server lists, for when --model is not given."""
    request = urllib.request.Request(base_url.rstrip("/") + "/v1/models")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return str(json.load(response)["data"][0]["id"])
    except (OSError, ValueError, KeyError, IndexError) as exc:
        raise BenchError(f"cannot list the models at {base_url} ({exc}); is it up? pass --model") from None


def print_progress(summary: dict[str, Any]) -> None:
    """One line per finished level on stderr."""
    s = summary["all"]
    print(
        f"  {summary['label']}: {s['num_completed']} done, {s['num_failed']} failed, "
        f"{s['output_tokens_per_s']:.1f} out tok/s, TTFT p95 {s['ttft_ms']['p95']} ms",
        file=sys.stderr,
    )
