"""Batch work beside interactive work (issue 23): does a batch job use the
capacity nobody else uses, and does it yield it?

(a) throughput: --num-requests chat requests of exactly --output-tokens
    tokens, sent --slots at a time on the interactive path (default
    priority), then the same requests as one `/v1/batches` job on the
    otherwise idle server; tokens/s of both and their ratio (the goal: the
    job at 0.95x or more), at every --slots value (default 8 and 16).
    The job's time runs from its upload to the moment its output file was
    written (the file's mtime in the server's data directory), and the bench
    looks at the job only every --poll-s (0.5 s): retrieving the batch 20
    times a second, as this bench once did, cost about 1-3 ms of CPU per look
    (client and server), a few percent of a 2-core machine taken from the
    model during the job only.
(b) isolation: streaming interactive requests, --rate per second (open
    loop) with --prompt-tokens-token prompts, on the idle server, then while
    a large batch job runs: TTFT p50/p95 and inter-token latency p50/p95, the
    ratios to idle (the goals: TTFT p95 within 1.5x, ITL p50 within 1.2x),
    and the batch's tokens/s meanwhile against the same job alone.

Each configuration runs `localserve serve` in a subprocess with its data in
a temporary LOCALSERVE_HOME; --server-root runs another checkout's server
(e.g. a `git worktree` of the previous policy) for a side-by-side run. The
1-minute load average is recorded before each phase, and a run that starts
above --max-load (0.5) is refused: figures from a busy machine are wrong.

    python bench/batch_isolation.py                       # (a) at 8 and 16 slots, then (b) at 8
    python bench/batch_isolation.py --only b --rate 1 --requests 60
    python bench/batch_isolation.py --server-root /tmp/localserve-before --out before.json
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai

ROOT = Path(__file__).resolve().parents[1]
NOTE_IDS = itertools.count()  # numbers every interactive prompt, in every phase
FILLER = "Please read this note about the harbour, the boats, the weather and the market today."


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def server(args: argparse.Namespace, slots: int) -> Iterator[tuple[openai.OpenAI, Path]]:
    """A fresh `localserve serve` with `slots` slots; yields a client of it and its data directory."""
    root = Path(args.server_root).resolve() if args.server_root else ROOT
    port = free_port()
    cmd = [sys.executable, "-m", "localserve", "serve", "--port", str(port), "--model", args.model,
           "--parallel", str(slots), "--threads", str(args.threads), "--ctx-size", "1024",
           "--log-level", "warning"]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="localserve-bench-") as home:
        env = {**os.environ, "LOCALSERVE_HOME": home, "PYTHONPATH": str(root)}
        proc = subprocess.Popen(cmd, cwd=root, env=env)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(proc, url)
            yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600), Path(home)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(60)


def wait_healthy(proc: subprocess.Popen[bytes], url: str) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("the server exited")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit("the server did not become healthy")


def record_load(report: dict[str, Any], phase: str) -> None:
    """The 1-minute load average before `phase` (the bench's own earlier phases count too)."""
    report.setdefault("load_1m_before", {})[phase] = round(os.getloadavg()[0], 2)


def batch_policy(client: openai.OpenAI) -> dict[str, Any]:
    """The server's batch policy snapshot (empty if the server has none)."""
    stats = httpx.get(str(client.base_url).replace("/v1/", "/api/v1/stats"), timeout=10).json()
    models = stats.get("models") or [{}]
    return dict(models[0].get("batch_policy") or {})


def wait_quiet(client: openai.OpenAI) -> None:
    """Until batch work would run alone again after the last interactive request."""
    time.sleep(batch_policy(client).get("quiet_after_s", 30.0) + 1.0)


def chat_body(args: argparse.Namespace, i: int) -> dict[str, Any]:
    return {
        "model": args.model,
        "messages": [{"role": "user", "content": f"Write a short story about the number {i}."}],
        "max_tokens": args.output_tokens,
        "ignore_eos": True,  # exactly output_tokens tokens each
    }


def send_direct(client: openai.OpenAI, args: argparse.Namespace, i: int) -> int:
    """Request `i` on the interactive path (default priority); its completion tokens."""
    body = chat_body(args, i)
    reply = client.chat.completions.create(
        model=body["model"], messages=body["messages"], max_tokens=body["max_tokens"], extra_body={"ignore_eos": True}
    )
    return reply.usage.completion_tokens if reply.usage else 0


def completion_tokens(output_line: str) -> int:
    response = json.loads(output_line).get("response") or {}
    return int(((response.get("body") or {}).get("usage") or {}).get("completion_tokens", 0))


def run_batch(client: openai.OpenAI, args: argparse.Namespace, num_lines: int) -> str:
    lines = "".join(
        json.dumps({"custom_id": f"l{i}", "method": "POST", "url": "/v1/chat/completions", "body": chat_body(args, i)})
        + "\n"
        for i in range(num_lines)
    )
    source = client.files.create(file=("bench.jsonl", lines.encode()), purpose="batch")
    return client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h").id


def wait_batch(client: openai.OpenAI, args: argparse.Namespace, batch_id: str, home: Path) -> dict[str, Any]:
    """Until the job ends, looking every --poll-s: the batch, when it ended
    (wall clock: its output file's mtime, else the last look), which of the
    two that is, and the number of looks."""
    looks = 1
    while (batch := client.batches.retrieve(batch_id)).status not in ("completed", "failed", "cancelled"):
        time.sleep(args.poll_s)
        looks += 1
    output = home / "jobs" / "files" / (batch.output_file_id or "")
    if batch.output_file_id and output.is_file():
        return {"batch": batch, "ended": output.stat().st_mtime, "end_from": "output_mtime", "looks": looks}
    return {"batch": batch, "ended": time.time(), "end_from": "last_look", "looks": looks}


def throughput(args: argparse.Namespace, slots: int, report: dict[str, Any]) -> dict[str, Any]:
    """Phase (a) at `slots` slots."""
    with server(args, slots) as (client, home):
        send_direct(client, args, -1)  # warm-up
        record_load(report, f"a{slots}-direct")
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=slots) as pool:
            direct_tokens = sum(pool.map(lambda i: send_direct(client, args, i), range(args.num_requests)))
        direct_s = time.perf_counter() - started
        wait_quiet(client)
        record_load(report, f"a{slots}-batch")
        started = time.time()
        job = wait_batch(client, args, run_batch(client, args, args.num_requests), home)
        batch, batch_s = job["batch"], job["ended"] - started
        output = client.files.content(batch.output_file_id).text.splitlines() if batch.output_file_id else []
        batch_tokens = sum(completion_tokens(line) for line in output)
    direct, alone = direct_tokens / direct_s, batch_tokens / batch_s
    return {"slots": slots, "requests": args.num_requests, "direct_tok_s": round(direct, 1),
            "batch_tok_s": round(alone, 1), "batch_over_direct": round(alone / direct, 3),
            "batch_status": batch.status, "batch_end_from": job["end_from"], "batch_looks": job["looks"]}  # fmt: skip


def calibrated_prompt(client: openai.OpenAI, args: argparse.Namespace) -> str:
    """A user message whose chat prompt is about --prompt-tokens tokens."""

    def prompt_tokens(num_words: int) -> int:
        text = " ".join((FILLER.split() * 100)[:num_words])
        reply = client.chat.completions.create(
            model=args.model, messages=[{"role": "user", "content": text}], max_tokens=1
        )
        return reply.usage.prompt_tokens if reply.usage else 0

    low, high = prompt_tokens(4), prompt_tokens(40)
    num_words = max(1, round(4 + (args.prompt_tokens - low) * 36 / max(1, high - low)))
    return " ".join((FILLER.split() * 100)[:num_words])


def stream_one(client: openai.OpenAI, args: argparse.Namespace, text: str) -> tuple[float, list[float]]:
    """TTFT and the gaps between tokens of one streaming interactive request."""
    started = time.perf_counter()
    stream = client.chat.completions.create(
        model=args.model, messages=[{"role": "user", "content": text}], max_tokens=args.max_tokens, stream=True,
        extra_body={"priority": "interactive", "ignore_eos": True},
    )  # fmt: skip
    times = [time.perf_counter() for chunk in stream if chunk.choices and chunk.choices[0].delta.content]
    if not times:
        raise RuntimeError("a streaming request returned no tokens")
    return times[0] - started, [b - a for a, b in zip(times, times[1:], strict=False)]


def interactive_phase(client: openai.OpenAI, args: argparse.Namespace, text: str) -> dict[str, float]:
    """--requests requests, one every 1/--rate s whatever the last one does (open loop)."""
    with ThreadPoolExecutor(max_workers=args.requests) as pool:
        futures = []
        for _ in range(args.requests):  # distinct prompts: only the chat template's prefix is cached
            futures.append(pool.submit(stream_one, client, args, f"Note {next(NOTE_IDS)}. {text}"))
            time.sleep(1.0 / args.rate)
        results = [f.result() for f in futures]
    ttft = [r[0] for r in results]
    itl = [gap for r in results for gap in r[1]]
    return {"ttft_p50_s": statistics.median(ttft), "ttft_p95_s": percentile(ttft, 95),
            "itl_p50_s": statistics.median(itl), "itl_p95_s": percentile(itl, 95)}  # fmt: skip


def isolation(args: argparse.Namespace, report: dict[str, Any]) -> dict[str, Any]:
    """Phase (b) at --slots-b slots."""
    with server(args, args.slots_b) as (client, _):
        text = calibrated_prompt(client, args)
        for _ in range(3):
            stream_one(client, args, text)  # warm-up
        record_load(report, "b-idle")
        idle = interactive_phase(client, args, text)
        record_load(report, "b-batch")
        batch_id = run_batch(client, args, args.lines)
        while client.batches.retrieve(batch_id).request_counts.completed < 1:  # running at full width
            time.sleep(0.1)
        done, started = client.batches.retrieve(batch_id).request_counts.completed, time.perf_counter()
        busy = interactive_phase(client, args, text)
        meanwhile = (client.batches.retrieve(batch_id).request_counts.completed - done) * args.output_tokens
        meanwhile_s = time.perf_counter() - started
        policy = batch_policy(client)
        wait_quiet(client)
        done, started = client.batches.retrieve(batch_id).request_counts.completed, time.perf_counter()
        time.sleep(args.alone_s)
        alone = (client.batches.retrieve(batch_id).request_counts.completed - done) * args.output_tokens
        alone_s = time.perf_counter() - started
        still_running = client.batches.retrieve(batch_id).status == "in_progress"
        if still_running:  # else the figures above undercount: use more --lines
            with contextlib.suppress(openai.BadRequestError):  # it may end meanwhile
                client.batches.cancel(batch_id)
    rounded = {f"idle_{k}": round(v, 4) for k, v in idle.items()} | {f"batch_{k}": round(v, 4) for k, v in busy.items()}
    return {
        "slots": args.slots_b, "rate_per_s": args.rate, "requests_per_phase": args.requests,
        **rounded,
        "ttft_p95_ratio": round(busy["ttft_p95_s"] / idle["ttft_p95_s"], 3),
        "itl_p50_ratio": round(busy["itl_p50_s"] / idle["itl_p50_s"], 3),
        "batch_tok_s_meanwhile": round(meanwhile / meanwhile_s, 1),
        "batch_tok_s_alone": round(alone / alone_s, 1),
        "batch_still_running_at_end": still_running,
        "batch_policy_at_end_of_phase": policy,
    }  # fmt: skip


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--threads", default="auto", help="the server's --threads (default: auto)")
    parser.add_argument(
        "--busy-cores", type=int, default=0, help="processes spinning on a core each for the whole run (issue 43)"
    )
    parser.add_argument("--server-root", help="run the server of this checkout (default: this one)")
    parser.add_argument("--only", choices=("a", "b"), help="run one phase")
    parser.add_argument("--max-load", type=float, default=0.5, help="refuse a run that starts above this load")
    parser.add_argument("--output-tokens", type=int, default=64, help="tokens of every batch line and (a) request")
    parser.add_argument("--slots", default="8,16", help="(a): slot counts to measure")
    parser.add_argument("--num-requests", type=int, default=64, help="(a): requests per job")
    parser.add_argument("--poll-s", type=float, default=0.5, help="(a): seconds between looks at the running job")
    parser.add_argument("--slots-b", type=int, default=8, help="(b): slots")
    parser.add_argument("--rate", type=float, default=1.0, help="(b): interactive requests per second")
    parser.add_argument("--requests", type=int, default=60, help="(b): interactive requests per phase")
    parser.add_argument("--prompt-tokens", type=int, default=64, help="(b): interactive prompt size")
    parser.add_argument("--max-tokens", type=int, default=32, help="(b): tokens per interactive answer")
    parser.add_argument("--lines", type=int, default=500, help="(b): lines of the background batch job")
    parser.add_argument("--alone-s", type=float, default=20.0, help="(b): then measure the job alone this long")
    parser.add_argument("--out", help="also write the report to this JSON file")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    report: dict[str, Any] = {"model": args.model, "threads": args.threads, "server_root": args.server_root}
    record_load(report, "start")
    if report["load_1m_before"]["start"] > args.max_load:
        load = report["load_1m_before"]["start"]
        raise SystemExit(f"refused: the 1-minute load average is {load} (> {args.max_load}); run on a quiet machine")
    report["busy_cores"] = args.busy_cores
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy_cores)]
    try:
        run_phases(args, report)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


def run_phases(args: argparse.Namespace, report: dict[str, Any]) -> None:
    if args.only != "b":
        report["throughput"] = [throughput(args, int(n), report) for n in args.slots.split(",")]
    if args.only != "a":
        report["isolation"] = isolation(args, report)


if __name__ == "__main__":
    main()
