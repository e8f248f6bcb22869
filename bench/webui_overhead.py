"""What the browser UI's dashboard costs the server (issue 40: at most 2%).

One `localserve serve` (the default model, --parallel 8) answers 8
concurrent streams of greedy 128-token chat requests; a run measures the
aggregate generated tokens per second. Runs alternate: the dashboard open
in headless Chromium (Debian's chromium through Playwright, the page on
`/#dashboard`, its stats stream live) against the same page on its models
view (no stream, nothing redrawn); each pair gives the ratio open / closed. The machine must be quiet at the start (the
1-minute load average below 0.5, recorded); run it alone:

    .venv/bin/python bench/webui_overhead.py --json bench/results/webui-dashboard-overhead.json

Runs are short (one request per stream) and many (12 pairs), so that the
host's drift moves both runs of a pair alike. The JSON also records the
CPU that Chromium takes with the page open and with no page (in cores):
the cost measured directly, where the throughput ratio is noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.compare_servers import MODEL_ID, RunningServer, ServerSpec, free_port, wait_for_quiet  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PROMPT = "Write a long, detailed story about a lighthouse keeper and the ships she guides through winter storms."


async def one_stream(client: httpx.AsyncClient, max_tokens: int, num_requests: int) -> int:
    """`num_requests` chat requests one after another; the tokens generated."""
    tokens = 0
    for _ in range(num_requests):
        body = {
            "model": MODEL_ID,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if line.startswith("data: {") and '"usage"' in line:
                    usage = json.loads(line[6:]).get("usage")
                    if usage:
                        tokens += usage["completion_tokens"]
    return tokens


async def measure(url: str, streams: int, max_tokens: int, num_requests: int) -> float:
    """Aggregate generated tokens per second of `streams` concurrent streams."""
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        started = time.perf_counter()
        counts = await asyncio.gather(*(one_stream(client, max_tokens, num_requests) for _ in range(streams)))
        return sum(counts) / (time.perf_counter() - started)


def run_measure(url: str, streams: int, max_tokens: int, num_requests: int) -> float:
    """`measure` on a thread of its own: Playwright's sync API keeps an event
    loop running on this one, where asyncio.run() is refused."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, measure(url, streams, max_tokens, num_requests)).result()


def browser_cpu_s() -> dict[int, float]:
    """CPU seconds each of this process's Chromium processes used so far."""
    used = {}
    for child in psutil.Process().children(recursive=True):
        try:
            if child.name().startswith("chrom"):
                times = child.cpu_times()
                used[child.pid] = times.user + times.system
        except psutil.Error:
            continue
    return used


def cpu_between(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(after[pid] - before.get(pid, 0.0) for pid in after)


def run_pair(url: str, args: argparse.Namespace, page, order: tuple[str, str]) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """One run with the dashboard view live, one with the page on the models
    view (no stream, nothing redrawn): the same page, switched in place, so
    neither run pays for loading it."""
    result: dict[str, float] = {}
    for state in order:
        if state == "open":
            page.evaluate("location.hash = '#dashboard'")
            page.locator("#dash-state").filter(has_text="live").wait_for(timeout=30_000)
            points = int(page.locator("#dash-chart").get_attribute("data-points") or 0)
            page.wait_for_function(
                f"() => Number(document.getElementById('dash-chart').dataset.points) > {points}", timeout=30_000
            )
            points = int(page.locator("#dash-chart").get_attribute("data-points") or 0)
        else:
            page.evaluate("location.hash = '#models'")
            page.locator("#models-rows tr").first.wait_for(timeout=30_000)
        cpu_before, started = browser_cpu_s(), time.perf_counter()
        result[state] = run_measure(url, args.streams, args.max_tokens, args.requests)
        result[f"browser_cores_{state}"] = cpu_between(cpu_before, browser_cpu_s()) / (time.perf_counter() - started)
        if state == "open":  # the page really was updating during the run
            result["dashboard_samples"] = int(page.locator("#dash-chart").get_attribute("data-points") or 0) - points
        print(f"  {state}: {result[state]:.1f} tok/s, browser {result[f'browser_cores_{state}']:.3f} cores", flush=True)
    result["ratio"] = result["open"] / result["closed"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=12, help="pairs of runs (short runs, many pairs: the host drifts)")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--requests", type=int, default=1, help="requests per stream and run")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-wait-quiet", type=float, default=300.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    load_at_start = wait_for_quiet(args.max_wait_quiet)
    port = free_port()
    argv = [sys.executable, "-m", "localserve", "serve", "--port", str(port), "--model", MODEL_ID]
    argv += ["--parallel", str(args.streams), "--threads", str(args.threads), "--ctx-size", "1024"]
    pairs = []
    with (
        tempfile.TemporaryDirectory(prefix="localserve-webui-bench-") as home,
        RunningServer(
            ServerSpec("localserve", argv, "/health"), port, Path(home) / "server.log", {"LOCALSERVE_HOME": home}
        ) as server,
        sync_playwright() as playwright,
    ):
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(f"{server.url}/#models")
        run_measure(server.url, args.streams, 16, 1)  # warm-up
        for i in range(args.pairs):
            order = ("closed", "open") if i % 2 == 0 else ("open", "closed")
            print(f"pair {i + 1}/{args.pairs} ({' then '.join(order)})", flush=True)
            pairs.append(run_pair(server.url, args, page, order))
        browser.close()
    ratios = [p["ratio"] for p in pairs]
    summary = {
        "benchmark": "webui dashboard open vs closed, aggregate tok/s",
        "streams": args.streams,
        "max_tokens": args.max_tokens,
        "requests_per_stream": args.requests,
        "threads": args.threads,
        "load_at_start": round(load_at_start, 2),
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "pairs": pairs,
        "median_ratio": round(statistics.median(ratios), 4),
        "min_ratio": round(min(ratios), 4),
        "max_ratio": round(max(ratios), 4),
        # What the open page costs the machine, measured directly (less noisy than
        # the throughput ratio): Chromium's CPU with the dashboard open against
        # the same browser with no page, in cores.
        "browser_cores_open": round(statistics.median(p["browser_cores_open"] for p in pairs), 4),
        "browser_cores_closed": round(statistics.median(p["browser_cores_closed"] for p in pairs), 4),
        "median_closed_tok_s": round(statistics.median(p["closed"] for p in pairs), 1),
        "median_open_tok_s": round(statistics.median(p["open"] for p in pairs), 1),
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "pairs"}, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
