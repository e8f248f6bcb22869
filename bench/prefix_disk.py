"""The prefix cache's disk tier: time to first token of a request with a
~2,000-token shared prefix, cold, warm (in a slot) and after a restart
(from disk), and chat throughput with the tier on against off.

Each scenario starts servers afresh (a new LOCALSERVE_HOME per repeat), on
SmolLM2-135M-Instruct Q4_1 with 2 threads:

* cold     the first request with the document: every token computed
* warm     the same document, another question: the slot cache (the median
           of three questions)
* restart  the server stopped (the slot's blocks go to disk at shutdown) and
           started again on the same home: the disk tier
* restart, tier off   the same with --prefix-cache-disk 0 (as cold)
* swap     two models under --max-loaded-models chat=1: the document on a,
           a request on b (a is unloaded), the document on a again

Throughput: two servers up at once, tier on and off, 8 streams of the usual
32-word prompts and 128 tokens, alternating run by run (paired), median of
the ratios. Every run waits for a 1-minute load average below 0.5.

    python bench/prefix_disk.py --repeats 3 --out bench/results/prefix-disk.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.compare_servers import MODEL_ID, RunningServer, ServerSpec, free_port, wait_for_quiet  # noqa: E402
from bench.spec_bench import run_cell  # noqa: E402

DOCUMENT = " ".join(
    f"Entry {i}: the survey team measured the river at station {i}, found the water {['clear', 'muddy', 'fast'][i % 3]}, "
    f"counted {i * 3 + 7} fish and noted the weather as {['sunny', 'windy', 'grey', 'rainy'][i % 4]}."
    for i in range(60)
)


def serve(home: Path, port: int, *extra: str, models: tuple[str, ...] = (MODEL_ID,)) -> RunningServer:
    argv = [sys.executable, "-m", "localserve", "serve", "--port", str(port), "--threads", "2", "--parallel", "4"]
    argv += ["--ctx-size", "4096"]
    for model in models:
        argv += ["--model", model]
    spec = ServerSpec("localserve", [*argv, *extra], "/health")
    return RunningServer(spec, port, home / f"server-{port}-{time.monotonic_ns()}.log", {"LOCALSERVE_HOME": str(home)})


async def ttft(url: str, question: str, model: str = MODEL_ID) -> dict[str, float]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"{DOCUMENT}\n\nQuestion: {question}"}],
        "max_tokens": 16,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        started = time.perf_counter()
        first = None
        cached = prompt = 0
        async with session.post(f"{url}/v1/chat/completions", json=body) as response:
            async for raw in response.content:
                line = raw.decode().strip()
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if first is None and chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                    first = time.perf_counter() - started
                if chunk.get("usage"):
                    prompt = chunk["usage"]["prompt_tokens"]
                    cached = chunk["usage"]["prompt_tokens_details"]["cached_tokens"]
    return {"ttft_s": round(first or float("nan"), 4), "prompt_tokens": prompt, "cached_tokens": cached}


def scenario_restart(disk: str) -> dict[str, Any]:
    out: dict[str, Any] = {"load_before": round(wait_for_quiet(), 2)}
    with tempfile.TemporaryDirectory(prefix="prefix-bench-") as tmp:
        home, port = Path(tmp), free_port()
        with serve(home, port, "--prefix-cache-disk", disk) as server:
            out["cold"] = asyncio.run(ttft(server.url, "Which station had the most fish?"))
            # Warm is the median of three (one request's TTFT varies by +-50% here).
            warm = [asyncio.run(ttft(server.url, f"What was the weather at station {i}?")) for i in (5, 7, 11)]
            out["warm_all_s"] = [w["ttft_s"] for w in warm]
            out["warm"] = sorted(warm, key=lambda w: w["ttft_s"])[1]
        wait_for_quiet()
        with serve(home, port, "--prefix-cache-disk", disk) as server:
            out["restart"] = asyncio.run(ttft(server.url, "Was the water at station 9 clear?"))
    return out


def scenario_swap() -> dict[str, Any]:
    out: dict[str, Any] = {"load_before": round(wait_for_quiet(), 2)}
    path = _model_path()
    with tempfile.TemporaryDirectory(prefix="prefix-bench-") as tmp:
        home, port = Path(tmp), free_port()
        extra = ("--max-loaded-models", "chat=1", "--prefix-cache-disk", "2G")
        with serve(home, port, *extra, models=(f"a={path}", f"b={path}")) as server:
            out["a_cold"] = asyncio.run(ttft(server.url, "Which station had the most fish?", "a"))
            out["b"] = asyncio.run(ttft(server.url, "Which station was windy?", "b"))  # a is swapped out
            out["a_after_swap"] = asyncio.run(ttft(server.url, "What was the weather at station 5?", "a"))
    return out


def throughput(pairs: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="prefix-bench-") as tmp:
        home = Path(tmp)
        servers = {"on": serve(home / "on", free_port(), "--prefix-cache-disk", "2G", "--parallel", "8")}
        servers["off"] = serve(home / "off", free_port(), "--prefix-cache-disk", "0", "--parallel", "8")
        for server in servers.values():
            server.__enter__()
        try:
            runs = []
            for pair in range(pairs):
                load = round(wait_for_quiet(), 2)
                order = ["on", "off"] if pair % 2 == 0 else ["off", "on"]
                result = {name: asyncio.run(run_cell(servers[name].url, "chat", 8))["tok_s"] for name in order}
                runs.append({"load_before": load, **result, "ratio": result["on"] / result["off"]})
                print(f"throughput pair {pair + 1}: on {result['on']:.1f} off {result['off']:.1f} tok/s", flush=True)
        finally:
            for server in servers.values():
                server.__exit__()
    ratios = [r["ratio"] for r in runs]
    return {"runs": runs, "ratio_median": round(statistics.median(ratios), 3), "min": min(ratios), "max": max(ratios)}


def _model_path() -> str:
    from localserve.models.registry import resolve

    return str(resolve(MODEL_ID).path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=5, help="throughput pairs")
    parser.add_argument("--skip", default="", help="comma list of: restart,off,swap,throughput")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "prefix-disk.json")
    args = parser.parse_args()
    skip = set(args.skip.split(","))
    report: dict[str, Any] = {"cpu_count": os.cpu_count()}
    for name, run in (
        ("restart", lambda: scenario_restart("2G")),
        ("off", lambda: scenario_restart("0")),
        ("swap", scenario_swap),
    ):
        if name in skip:
            continue
        report[name] = []
        for repeat in range(args.repeats):
            result = run()
            report[name].append(result)
            print(f"{name} {repeat + 1}: {json.dumps(result)}", flush=True)
    if "restart" in report:
        ratios = [r["restart"]["ttft_s"] / r["warm"]["ttft_s"] for r in report["restart"]]
        report["restart_over_warm"] = {"median": round(statistics.median(ratios), 3), "all": ratios}
    if "throughput" not in skip:
        report["throughput"] = throughput(args.pairs)
    args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k in ("restart_over_warm",)}, indent=1))
    if "throughput" in report:
        print("throughput on/off:", report["throughput"]["ratio_median"])


if __name__ == "__main__":
    main()
