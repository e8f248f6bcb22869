"""Interactive TTFT while a large batch runs, against idle.

Starts `localserve serve` in a subprocess (data in a temporary
LOCALSERVE_HOME), then measures the time to first token of interactive
streaming chat requests, one every --pace-s seconds (open loop; --closed-loop
waits for each answer first):

1. idle: nothing else runs;
2. during a batch: a BATCH-line `/v1/batches` job runs in the background.

It reports p50/p95 TTFT of both phases, their ratio (the goal is p95 within
1.5x of idle), and the batch's throughput while interactive requests come
and then alone; the batch is cancelled at the end (unless --finish).

    python bench/batch_isolation.py [--lines 500] [--requests 60] [--parallel 8] [--threads 0]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai

ROOT = Path(__file__).resolve().parents[1]
BACKOFF_SETTLE_S = 3.0
QUESTIONS = ["What is the capital of France?", "Name three fruits.", "What is 2 + 2?", "Say hello in Spanish."]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(args: argparse.Namespace, home: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [sys.executable, "-m", "localserve", "serve", "--port", str(port), "--model", args.model,
           "--parallel", str(args.parallel), "--threads", str(args.threads), "--ctx-size", "1024",
           "--log-level", "warning"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "LOCALSERVE_HOME": home})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("the server exited")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit("the server did not become healthy")


def ttft(client: openai.OpenAI, model: str, i: int, max_tokens: int) -> float:
    started = time.perf_counter()
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
        max_tokens=max_tokens,
        stream=True,
        extra_body={"priority": "interactive"},
    )
    first = None
    for _ in stream:
        if first is None:
            first = time.perf_counter() - started
    assert first is not None
    return first


def measure(client: openai.OpenAI, args: argparse.Namespace) -> list[float]:
    """TTFT of `args.requests` requests. Open loop (default): one starts every
    pace_s seconds whether or not the last has finished, so arrivals fall at
    random points of the server's steps. Closed loop: the next starts when the
    last has finished (and pace_s has passed), like an agent's calls."""
    if args.closed_loop:
        values = []
        for i in range(args.requests):
            began = time.perf_counter()
            values.append(ttft(client, args.model, i, args.max_tokens))
            time.sleep(max(0.0, args.pace_s - (time.perf_counter() - began)))
        return values
    with ThreadPoolExecutor(max_workers=args.requests) as pool:
        futures = []
        for i in range(args.requests):
            futures.append(pool.submit(ttft, client, args.model, i, args.max_tokens))
            time.sleep(args.pace_s)
        return [f.result() for f in futures]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def submit_batch(client: openai.OpenAI, args: argparse.Namespace) -> str:
    lines = "".join(
        json.dumps(
            {
                "custom_id": f"bg-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": args.model,
                    "messages": [{"role": "user", "content": f"Write a short story about the number {i}."}],
                    "max_tokens": args.batch_max_tokens,
                },
            }
        )
        + "\n"
        for i in range(args.lines)
    )
    source = client.files.create(file=("bench.jsonl", lines.encode()), purpose="batch")
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    while client.batches.retrieve(batch.id).request_counts.completed < 1:  # running at full width
        time.sleep(0.1)
    return batch.id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--lines", type=int, default=500, help="batch size (default: 500)")
    parser.add_argument("--batch-max-tokens", type=int, default=32)
    parser.add_argument("--requests", type=int, default=60, help="interactive requests per phase (default: 60)")
    parser.add_argument("--max-tokens", type=int, default=8, help="tokens per interactive answer (default: 8)")
    parser.add_argument("--pace-s", type=float, default=0.5, help="one interactive request every S seconds")
    parser.add_argument("--closed-loop", action="store_true", help="each request waits for the last to finish")
    parser.add_argument("--parallel", type=int, default=8)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--alone-s", type=float, default=15.0, help="then measure the batch alone this long")
    parser.add_argument("--finish", action="store_true", help="let the batch finish and report its throughput")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="localserve-bench-") as home:
        proc, url = start_server(args, home)
        try:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
            for i in range(3):  # warm-up: caches, first allocations
                ttft(client, args.model, i, args.max_tokens)
            idle = measure(client, args)
            batch_id = submit_batch(client, args)
            started, done_before = time.perf_counter(), client.batches.retrieve(batch_id).request_counts.completed
            busy = measure(client, args)
            batch = client.batches.retrieve(batch_id)
            lines_per_s = (batch.request_counts.completed - done_before) / (time.perf_counter() - started)
            still_running = batch.status == "in_progress"
            time.sleep(BACKOFF_SETTLE_S)  # the scheduler widens batch work again once interactive requests are gone
            alone_from, alone_started = batch.request_counts.completed, time.perf_counter()
            time.sleep(args.alone_s)
            alone = client.batches.retrieve(batch_id).request_counts.completed - alone_from
            lines_per_s_alone = alone / (time.perf_counter() - alone_started)
            if args.finish:
                while client.batches.retrieve(batch_id).status not in ("completed", "failed"):
                    time.sleep(1)
            else:
                client.batches.cancel(batch_id)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(60)

    p95_idle, p95_busy = percentile(idle, 95), percentile(busy, 95)
    report = {
        "parallel": args.parallel,
        "threads": args.threads,
        "requests_per_phase": args.requests,
        "arrivals": "closed loop" if args.closed_loop else f"open loop, one per {args.pace_s} s",
        "batch_lines": args.lines,
        "ttft_idle_p50_s": round(statistics.median(idle), 4),
        "ttft_idle_p95_s": round(p95_idle, 4),
        "ttft_batch_p50_s": round(statistics.median(busy), 4),
        "ttft_batch_p95_s": round(p95_busy, 4),
        "p95_ratio": round(p95_busy / p95_idle, 2),
        "batch_lines_per_s_meanwhile": round(lines_per_s, 2),
        "batch_lines_per_s_alone": round(lines_per_s_alone, 2),
        "batch_still_running_at_end": still_running,
        "ttft_idle_s": [round(v, 3) for v in idle],
        "ttft_batch_s": [round(v, 3) for v in busy],
    }
    print(json.dumps({k: v for k, v in report.items() if not isinstance(v, list)}, indent=2))
    print(json.dumps({k: v for k, v in report.items() if isinstance(v, list)}))


if __name__ == "__main__":
    main()
