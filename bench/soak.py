"""Soak test: a mixed load for a long while, with the server's memory (RSS)
sampled every second. Reports requests, failures and p50/p95 latency per
kind, peak RSS, and RSS growth after the warm-up (total and per minute, from
a least-squares fit, also over the second half alone): a leak shows as a
steady slope in both, caches and allocator arenas filling up as a slope that
flattens, a bump as neither.

The load, from `--workers` clients each picking a kind at random:

* `chat` - non-streaming chat completions (16-64 new tokens);
* `stream` - streamed chat; one in ten is dropped after a few tokens (an abort);
* `embeddings` - 1-16 texts, when an embeddings model is loaded;
* `asr` - a short WAV (espeak-ng speech if installed, else a synthetic tone),
  when a speech model is loaded;
* `batch` - one small Batch API job (8 lines) at a time, in the background.

By default the script starts `localserve serve` with the built-in models that
are installed and stops it at the end; `--url` soaks a running server instead
(RSS then comes from its /api/v1/stats).

    python bench/soak.py [--duration 600] [--warmup 60] [--workers 4] [--json out.json]

CI does not run it (10 minutes); docs/reliability.md records its figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import wave
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil

CHAT_MODEL = "smollm2-135m-instruct"
EMBEDDING_MODEL = "all-minilm-l6-v2"
SPEECH_MODEL = "whisper-tiny.en"
WEIGHTS = {"chat": 4, "stream": 4, "embeddings": 2, "asr": 1}
TOPICS = ["a lighthouse", "the moon", "bread", "a river", "chess", "rain", "a violin", "the desert", "bees", "trains"]


@dataclass(slots=True)
class Tally:
    """Outcomes of one kind of request."""

    num_ok: int = 0
    num_failed: int = 0
    latencies_s: list[float] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def report(self) -> dict[str, Any]:
        lat = sorted(self.latencies_s)
        return {
            "requests": self.num_ok + self.num_failed,
            "failed": self.num_failed,
            "p50_s": round(_percentile(lat, 50), 3),
            "p95_s": round(_percentile(lat, 95), 3),
            "failures": dict(self.failures),
        }


def _percentile(values: list[float], pct: float) -> float:
    if not values:
        return 0.0
    return values[min(len(values) - 1, math.ceil(pct / 100 * len(values)) - 1)]


# ---- the server --------------------------------------------------------------------------


def installed(model_id: str) -> bool:
    from localserve.errors import LocalServeError
    from localserve.models.registry import resolve

    try:
        resolve(model_id)
    except LocalServeError:
        return False
    return True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(args: argparse.Namespace, home: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    models = [CHAT_MODEL] + [m for m in (EMBEDDING_MODEL, SPEECH_MODEL) if installed(m)]
    command = [sys.executable, "-m", "localserve", "serve", "--port", str(port), "--log-level", "warning"]
    command += [arg for model in models for arg in ("--model", model)]
    command += ["--parallel", str(args.parallel), "--ctx-size", "2048", "--threads", str(args.threads)]
    log = (home / "server.log").open("wb")
    proc = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "LOCALSERVE_HOME": str(home)}
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}; see {home / 'server.log'}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("the server did not become healthy in 300 s")


# ---- memory sampling ---------------------------------------------------------------------


class RssSampler:
    """RSS of the server every second: from psutil if the process is local,
    else from /api/v1/stats."""

    def __init__(self, client: httpx.AsyncClient, pid: int | None) -> None:
        self.client = client
        self.process = psutil.Process(pid) if pid is not None and psutil.pid_exists(pid) else None
        self.samples: list[tuple[float, int]] = []  # (seconds since start, bytes)

    async def run(self, started: float, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):
                self.samples.append((time.monotonic() - started, await self._rss()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)

    async def _rss(self) -> int:
        if self.process is not None:
            return int(self.process.memory_info().rss)
        stats = (await self.client.get("/api/v1/stats")).json()
        return int(stats["process"]["rss_bytes"])

    def report(self, warmup_s: float) -> dict[str, Any]:
        if not self.samples:
            return {}
        times = np.array([t for t, _ in self.samples])
        rss_mb = np.array([b for _, b in self.samples]) / 2**20
        after = times >= warmup_s
        report: dict[str, Any] = {
            "num_samples": len(self.samples),
            "start_mb": round(float(rss_mb[0]), 1),
            "peak_mb": round(float(rss_mb.max()), 1),
            "end_mb": round(float(np.median(rss_mb[-10:])), 1),
        }
        if after.sum() >= 10:
            t, y = times[after], rss_mb[after]
            slope_per_s = float(np.polyfit(t, y, 1)[0])
            report.update(
                after_warmup_mb=round(float(np.median(y[:10])), 1),
                growth_after_warmup_mb=round(float(np.median(y[-10:]) - np.median(y[:10])), 1),
                slope_mb_per_min=round(slope_per_s * 60, 3),
                max_minus_min_after_warmup_mb=round(float(y.max() - y.min()), 1),
            )
            late = t >= (t[0] + t[-1]) / 2  # a leak keeps its slope here; caches filling up flatten out
            if late.sum() >= 10:
                report["late_slope_mb_per_min"] = round(float(np.polyfit(t[late], y[late], 1)[0]) * 60, 3)
        return report


# ---- the load ----------------------------------------------------------------------------


def speech_wav() -> bytes:
    """A few seconds of speech (espeak-ng) or, without it, a tone."""
    if shutil.which("espeak-ng"):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "speech.wav"
            text = "The weather today is sunny and warm with a light breeze from the west"
            subprocess.run(["espeak-ng", "-v", "en-us", "-w", str(path), text], check=True, capture_output=True)
            return path.read_bytes()
    rate = 16000
    t = np.arange(int(3 * rate)) / rate
    samples = (0.3 * np.sin(2 * np.pi * 220 * t) * 32767).astype(np.int16)
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes(samples.tobytes())
    return buffer.getvalue()


class Load:
    """The clients' requests and what came of them."""

    def __init__(self, client: httpx.AsyncClient, kinds: list[str], seed: int) -> None:
        self.client = client
        self.kinds = kinds
        self.rng = random.Random(seed)
        self.tallies: dict[str, Tally] = defaultdict(Tally)
        self.audio = speech_wav() if "asr" in kinds else b""

    async def worker(self, deadline: float) -> None:
        weights = [WEIGHTS[k] for k in self.kinds]
        while time.monotonic() < deadline:
            kind = self.rng.choices(self.kinds, weights)[0]
            await self.timed(kind, getattr(self, kind))

    async def timed(self, kind: str, call: Any) -> None:
        started = time.monotonic()
        tally = self.tallies[kind]
        try:
            problem = await call()
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            problem = type(exc).__name__
        if problem:
            tally.num_failed += 1
            tally.failures[problem] += 1
        else:
            tally.num_ok += 1
            tally.latencies_s.append(time.monotonic() - started)

    def _messages(self) -> list[dict[str, str]]:
        topic = self.rng.choice(TOPICS)
        return [{"role": "user", "content": f"Write a few sentences about {topic} ({self.rng.randrange(10**6)})."}]

    async def chat(self) -> str | None:
        body = {"model": CHAT_MODEL, "messages": self._messages(), "max_tokens": self.rng.randint(16, 64)}
        response = await self.client.post("/v1/chat/completions", json=body)
        return None if response.status_code == 200 and response.json()["choices"] else f"HTTP {response.status_code}"

    async def stream(self) -> str | None:
        body = {
            "model": CHAT_MODEL,
            "messages": self._messages(),
            "max_tokens": self.rng.randint(16, 64),
            "stream": True,
        }
        drop_after = self.rng.randint(2, 6) if self.rng.random() < 0.1 else None
        num_chunks, done = 0, False
        async with self.client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                return f"HTTP {response.status_code}"
            async for line in response.aiter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    if '"error"' in line[:12]:
                        return "stream error event"
                    num_chunks += 1
                    if drop_after is not None and num_chunks >= drop_after:
                        return None  # dropped on purpose: the server aborts it
        return None if done else "stream without [DONE]"

    async def embeddings(self) -> str | None:
        texts = [f"{self.rng.choice(TOPICS)} {self.rng.randrange(10**6)}" for _ in range(self.rng.randint(1, 16))]
        response = await self.client.post("/v1/embeddings", json={"model": EMBEDDING_MODEL, "input": texts})
        ok = response.status_code == 200 and len(response.json()["data"]) == len(texts)
        return None if ok else f"HTTP {response.status_code}"

    async def asr(self) -> str | None:
        files = {"file": ("speech.wav", self.audio, "audio/wav")}
        response = await self.client.post("/v1/audio/transcriptions", files=files, data={"model": SPEECH_MODEL})
        return None if response.status_code == 200 and "text" in response.json() else f"HTTP {response.status_code}"

    async def batches(self, deadline: float) -> None:
        """One small batch at a time until the deadline; each counts as one request."""
        while time.monotonic() < deadline:
            await self.timed("batch", self.batch)

    async def batch(self) -> str | None:
        lines = [
            {
                "custom_id": f"soak-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": CHAT_MODEL, "messages": self._messages(), "max_tokens": 16},
            }
            for i in range(8)
        ]
        data = ("\n".join(json.dumps(line) for line in lines) + "\n").encode()
        upload = await self.client.post("/v1/files", files={"file": ("soak.jsonl", data)}, data={"purpose": "batch"})
        if upload.status_code != 200:
            return f"upload HTTP {upload.status_code}"
        body = {"input_file_id": upload.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
        created = await self.client.post("/v1/batches", json=body)
        if created.status_code != 200:
            return f"create HTTP {created.status_code}"
        batch_id = created.json()["id"]
        while True:
            await asyncio.sleep(1.0)
            batch = (await self.client.get(f"/v1/batches/{batch_id}")).json()
            if batch["status"] in ("completed", "failed", "cancelled", "expired"):
                break
        counts = batch["request_counts"]
        if batch["status"] != "completed" or counts["failed"]:
            return f"batch {batch['status']} ({counts['failed']} failed lines)"
        await self.client.delete(f"/v1/files/{upload.json()['id']}")
        return None


async def available_kinds(client: httpx.AsyncClient) -> tuple[list[str], bool]:
    """What this server can take: its loaded models, and whether it has the Batch API."""
    models = {m["id"] for m in (await client.get("/v1/models")).json()["data"]}
    stats = (await client.get("/api/v1/stats")).json()
    models |= set(stats.get("one_shot", {}))
    kinds = ["chat", "stream"]
    if EMBEDDING_MODEL in models:
        kinds.append("embeddings")
    if SPEECH_MODEL in models:
        kinds.append("asr")
    has_batches = (await client.get("/v1/batches")).status_code == 200
    return kinds, has_batches


async def soak(args: argparse.Namespace, url: str, pid: int | None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=args.workers + 4)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=300, limits=limits) as client:
        kinds, has_batches = await available_kinds(client)
        if pid is None:
            pid = (await client.get("/api/v1/stats")).json()["process"]["pid"]
        load = Load(client, kinds, args.seed)
        sampler = RssSampler(client, pid)
        stop = asyncio.Event()
        started = time.monotonic()
        deadline = started + args.duration
        sampling = asyncio.create_task(sampler.run(started, stop))
        tasks = [load.worker(deadline) for _ in range(args.workers)]
        if has_batches:
            tasks.append(load.batches(deadline))
        print(f"soaking {url} for {args.duration:.0f} s: {', '.join(kinds + ['batch'] * has_batches)}", flush=True)
        await asyncio.gather(*tasks)
        stop.set()
        await sampling
        elapsed = time.monotonic() - started
    return {
        "url": url,
        "duration_s": round(elapsed, 1),
        "warmup_s": args.warmup,
        "workers": args.workers,
        "requests": {kind: tally.report() for kind, tally in sorted(load.tallies.items())},
        "total_requests": sum(t.num_ok + t.num_failed for t in load.tallies.values()),
        "total_failed": sum(t.num_failed for t in load.tallies.values()),
        "rss": sampler.report(args.warmup),
        "rss_samples": [(round(t, 1), b) for t, b in sampler.samples],
    }


def print_report(report: dict[str, Any]) -> None:
    print(f"\n{report['total_requests']} requests in {report['duration_s']} s, {report['total_failed']} failed")
    print(f"{'kind':<12}{'requests':>10}{'failed':>8}{'p50 s':>9}{'p95 s':>9}")
    for kind, row in report["requests"].items():
        print(
            f"{kind:<12}{row['requests']:>10}{row['failed']:>8}{row['p50_s']:>9.2f}{row['p95_s']:>9.2f}  {row['failures'] or ''}"
        )
    rss = report["rss"]
    print(f"RSS: start {rss.get('start_mb')} MB, peak {rss.get('peak_mb')} MB, end {rss.get('end_mb')} MB")
    if "slope_mb_per_min" in rss:
        print(
            f"after the {report['warmup_s']:.0f} s warm-up: {rss['after_warmup_mb']} MB -> {rss['end_mb']} MB "
            f"(growth {rss['growth_after_warmup_mb']:+} MB, fit {rss['slope_mb_per_min']:+.3f} MB/min, "
            f"range {rss['max_minus_min_after_warmup_mb']} MB)"
        )
    if "late_slope_mb_per_min" in rss:
        print(f"fit over the second half of that: {rss['late_slope_mb_per_min']:+.3f} MB/min")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load (default: 600)")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds before growth is measured (default: 60)")
    parser.add_argument("--workers", type=int, default=4, help="concurrent clients (default: 4)")
    parser.add_argument("--url", default=None, help="soak this running server instead of starting one")
    parser.add_argument("--api-key", default=None, help="API key of the server at --url")
    parser.add_argument("--parallel", type=int, default=8, help="--parallel of the started server (default: 8)")
    parser.add_argument("--threads", type=int, default=0, help="--threads of the started server (default: all cores)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the load's random choices")
    parser.add_argument("--json", type=Path, default=None, help="also write the report (with every RSS sample) here")
    args = parser.parse_args()
    proc = None
    home = Path(tempfile.mkdtemp(prefix="localserve-soak-"))
    try:
        if args.url is None:
            proc, url = start_server(args, home)
            pid: int | None = proc.pid
        else:
            url, pid = args.url.rstrip("/"), None
        report = asyncio.run(soak(args, url, pid))
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(60)
            if proc.poll() is None:
                proc.kill()
        if proc is not None:
            shutil.rmtree(home, ignore_errors=True)
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0 if report["total_failed"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
