"""One-shot models through the one-shot queue, batching on vs off.

Clients (1 and 32 at once by default) each send single-input requests until
a shared pool is used up; `on` is the server's batching (models/oneshot.py),
`off` the same queue with max_batch_size=1. Each backend is opened as the
server opens it (models/oneshot.py), so the conversions and settings are the
served ones:

* embeddings: all-MiniLM-L6-v2 on ONNX Runtime (`all-minilm-l6-v2-onnx`,
  padded rectangles) and on llama.cpp (`all-minilm-l6-v2-gguf`, padding-free);
  the row of the backend `all-minilm-l6-v2` itself picks here says
  "(default)". Texts of 2 to 120 words.
* speech (`--speech`): faster-whisper tiny.en on espeak-ng sentences of 1
  to 12 s, decoded and cut as the API does (PyAV, VAD) on worker threads;
  `--device gpu` runs it on a GPU where CTranslate2 has CUDA.
* rerank (`--rerank`): bench/rerank_peers.py's random-weight cross-encoder
  (ms-marco-MiniLM-L-6's shape, built once with torch and transformers) on
  the backend the server opens for `--model ce=DIR` (the fused float32 ONNX
  graph on ONNX Runtime), `--rerank-requests` requests of a query and 32
  passages of 90-110 tokens, each request one `submit` of its 32 pairs as
  the rerank endpoint makes it (serving/rerank.py), from `--rerank-clients`
  clients. Its items are pairs: items/s = pairs/s.

Each row also holds the ceiling for its load: the best items/s the backend's
own `run()` gives on the same texts taken as N clients hand them over (pool
order, N at a time), each N sorted by length and cut into batches of 1, 2, 4,
... up to N (no queue, the least padding), and
the one-shot queue's items/s against it ("on / ceiling"). For rerank, the N
requests in flight are N x 32 pairs, cut into batches of 4, 8, 16, ... up to
256 (issue 41's goal: on / ceiling >= 0.95). Speech has no ceiling. Each client count
runs `--rounds` rounds of ceiling, off and on, the order rotating round by
round; ratios are taken within a round (the host's speed drifts by tens of
percent within minutes) and the row gives their median and range.

A second table shows the padding ratio (padded slots / real tokens or audio
frames) a padded backend computed at 32 clients, length grouping off vs on.

Figures are only worth recording on a quiet machine: every cell first waits
until the 1-minute load average is below `--max-load` (the bench's own
previous cell raises it) and records it; a machine that stays busy ends the
run without figures, unless `--allow-busy`, which marks every such cell BUSY.
Each cell also records the CPU that other processes used while it ran.

    python bench/oneshot_bench.py [--threads 2] [--texts 256] [--clients 1,4,8,32] [--speech] [--json out.json]

The rerank figures alone (issue 41: the micro-batcher against the backend's own best batched run()):

    .venv/bin/python bench/oneshot_bench.py --backends none --rerank --json bench/results/oneshot-rerank.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.compare_servers import wait_for_quiet  # noqa: E402
from localserve.config import ServerSettings  # noqa: E402
from localserve.engine.backend import OneShotBackend  # noqa: E402
from localserve.engine.oneshot.queue import OneShotQueue, OneShotQueueConfig  # noqa: E402
from localserve.models.kinds import ModelKind  # noqa: E402
from localserve.models.oneshot import BATCHING, open_oneshot  # noqa: E402

EMBEDDINGS, TRANSCRIPTION = ModelKind.EMBEDDINGS, ModelKind.TRANSCRIPTION
from localserve.models.registry import resolve  # noqa: E402

DEFAULT_ID = "all-minilm-l6-v2"
EMBEDDING_IDS = {
    "onnx": ("all-minilm-l6-v2-onnx", "ONNX Runtime"),
    "int8": ("all-minilm-l6-v2-onnx-int8", "ONNX Runtime int8"),
    "gguf": ("all-minilm-l6-v2-gguf", "llama.cpp GGUF"),
}
KEY_OF = {
    "onnx": "onnx",
    "int8": "int8",
    "gguf": "gguf",
    "llamacpp": "gguf",
}  # --backends names and backend names -> EMBEDDING_IDS
VOCAB = [
    "the",
    "a",
    "man",
    "woman",
    "child",
    "dog",
    "cat",
    "is",
    "was",
    "eating",
    "reading",
    "playing",
    "bread",
    "food",
    "drums",
    "music",
    "in",
    "at",
    "park",
    "home",
]
SPEECH = [
    "Good morning",
    "The weather today is sunny and warm",
    "The weather today is sunny and warm with a light breeze from the west",
    "Please call Stella and ask her to bring these things with her from the store. "
    "Six spoons of fresh snow peas and a big toy frog for her brother",
]


@dataclass(slots=True)
class Cell:
    items_per_s: float
    cpu_ms_per_item: float  # this process's CPU time per item
    mean_batch: float
    p50_latency_ms: float
    padding_ratio: float
    load_before: float  # 1-minute load average when the cell started
    others_cores: float  # CPU other processes used during the cell, in cores
    busy: bool  # started above --max-load (only with --allow-busy)


@dataclass(slots=True)
class Bench:
    """The run's settings and every cell measured, for the JSON record."""

    max_load: float
    allow_busy: bool
    max_wait_quiet_s: float
    cells: list[dict[str, Any]]

    def quiet(self) -> tuple[float, bool]:
        """(load average, busy) once the machine is quiet enough for a cell."""
        if self.allow_busy:
            load = os.getloadavg()[0]
            if load >= self.max_load:
                print(f"!!! BUSY: load average {load:.2f} >= {self.max_load}; this cell is no figure", file=sys.stderr)
            return load, load >= self.max_load
        return wait_for_quiet(self.max_wait_quiet_s, self.max_load), False


async def drive(queue: OneShotQueue, jobs: list, run_one: Callable[[OneShotQueue, Any], Awaitable[None]], clients: int):  # type: ignore[no-untyped-def,type-arg]
    """`clients` tasks take jobs from a shared pool until it is empty: (seconds, latencies)."""
    pool = list(reversed(jobs))
    latencies: list[float] = []

    async def client() -> None:
        while pool:
            job = pool.pop()
            started = time.monotonic()
            await run_one(queue, job)
            latencies.append(time.monotonic() - started)

    started = time.monotonic()
    await asyncio.gather(*(client() for _ in range(clients)))
    return time.monotonic() - started, latencies


async def measure(
    bench: Bench,
    backend: OneShotBackend,
    config: OneShotQueueConfig,
    jobs: list,
    run_one,
    clients: int,
    items_per_job: int = 1,
) -> Cell:  # type: ignore[no-untyped-def,type-arg]
    warm = OneShotQueue("warm-up", backend, config)  # graphs, caches, thread pools
    try:
        await drive(warm, jobs[: min(4, len(jobs))], run_one, 4)
    finally:
        await asyncio.to_thread(warm.close)
    load, busy = await asyncio.to_thread(bench.quiet)
    queue = OneShotQueue("bench", backend, config)
    me = psutil.Process()
    try:
        cpu0, own0 = psutil.cpu_times(), me.cpu_times()
        elapsed, latencies = await drive(queue, jobs, run_one, clients)
        cpu1, own1 = psutil.cpu_times(), me.cpu_times()
    finally:
        await asyncio.to_thread(queue.close)
    own = (own1.user + own1.system) - (own0.user + own0.system)
    stats = queue.stats()
    if not isinstance(stats, dict):  # a typed snapshot (engine/oneshot/stats.py) where the tree has it
        stats = {name: getattr(stats, name) for name in ("mean_batch_size", "padding_ratio")}
    items = len(jobs) * items_per_job
    return Cell(
        items_per_s=items / elapsed,
        cpu_ms_per_item=1000 * own / items,
        mean_batch=stats["mean_batch_size"],
        p50_latency_ms=1000 * statistics.median(latencies),
        padding_ratio=stats["padding_ratio"],
        load_before=load,
        others_cores=max(0.0, (_busy_s(cpu1) - _busy_s(cpu0) - own) / elapsed),
        busy=busy,
    )


def _busy_s(times: Any) -> float:
    """CPU seconds all processes spent, from psutil's system-wide times (guest time is inside user)."""
    return sum(getattr(times, field, 0.0) for field in ("user", "nice", "system", "irq", "softirq", "steal"))


# ---- workloads ------------------------------------------------------------------------


def texts(count: int) -> list[str]:
    rng = np.random.default_rng(3)
    return [" ".join(rng.choice(VOCAB, size=int(rng.integers(2, 121)))) for _ in range(count)]


async def embed_one(queue: OneShotQueue, tokens: object) -> None:  # type: ignore[type-arg]
    await queue.submit([tokens])


async def rerank_one(queue: OneShotQueue, pairs: list) -> None:  # type: ignore[type-arg]
    """One rerank request: its pairs in one submit, as serving/rerank.py sends them."""
    await queue.submit(pairs)


def rerank_jobs(backend, count: int) -> list[list]:  # type: ignore[no-untyped-def,type-arg]
    """`count` rerank requests of bench/rerank_peers.py, each its pairs as the backend encodes them."""
    from bench.rerank_peers import MODEL_DIR, open_tokenizer, workload

    requests = workload(0, count, open_tokenizer(MODEL_DIR))
    return [
        [backend.encode(r.query, doc, truncate=True, param="documents")[0] for doc in r.documents] for r in requests
    ]


def speech_clips(count: int, workdir: Path) -> list[bytes]:
    from tests.fixtures.speech import speak

    wavs = [speak(text, workdir / f"clip{i}.wav").read_bytes() for i, text in enumerate(SPEECH)]
    return [wavs[i % len(wavs)] for i in range(count)]


def transcribe_one(backend):  # type: ignore[no-untyped-def]
    from localserve.backends.speech.common import TranscribeOptions, decode_audio

    async def run(queue: OneShotQueue, data: bytes) -> None:  # type: ignore[type-arg]
        audio = await asyncio.to_thread(decode_audio, data, max_seconds=600)
        plan = await asyncio.to_thread(backend.plan, audio, TranscribeOptions())
        results = await queue.submit(plan.windows)
        backend.assemble(plan, results, "transcribe")

    return run


# ---- tables --------------------------------------------------------------------------------

THROUGHPUT_HEADER = [
    "| backend | clients | off items/s | on items/s | on / off (range) | ceiling items/s (batch) | on / ceiling (range) "
    "| p50 latency ms off / on | mean batch (on) | CPU ms/item off / on | max load avg before off / on "
    "| max others' cores off / on |",
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
]
PADDING_HEADER = [
    "| backend | padding, grouping off | padding, grouping on | items/s off / on | mean batch off / on |",
    "|---|---:|---:|---:|---:|",
]


def throughput_rows(
    bench: Bench,
    name: str,
    backend,
    jobs,
    run_one,
    base: OneShotQueueConfig,
    clients: list[int],
    rounds: int,
    ceiling_of: Callable[[int], tuple[float, int]] | None = None,
    items_per_job: int = 1,
):  # type: ignore[no-untyped-def]
    """Per client count, `rounds` rounds of the ceiling, batching off and
    batching on, in an order that rotates round by round (the host's speed
    drifts by tens of percent within minutes, so a ratio is only taken
    within a round); the row gives the medians and the range of the ratios.
    `ceiling_of(clients)`: (items/s, batch size) of the backend's own best, or
    None for none (NaN in the row)."""
    rows = []
    for n in clients:
        rounds_seen: list[dict[str, Any]] = []
        for r in range(rounds):
            seen: dict[str, Any] = {}
            for step in ("ceiling", "off", "on")[r % 3 :] + ("ceiling", "off", "on")[: r % 3]:
                if step == "ceiling":
                    seen[step] = ceiling_of(n) if ceiling_of is not None else (float("nan"), 0)
                else:
                    config = replace(base, max_batch_size=1) if step == "off" else base
                    seen[step] = asyncio.run(measure(bench, backend, config, jobs, run_one, n, items_per_job))
            rounds_seen.append(seen)
            (ceiling, size), off, on = seen["ceiling"], seen["off"], seen["on"]
            for mode, cell in (("off", off), ("on", on)):
                bench.cells.append(
                    {
                        "table": "throughput",
                        "backend": name,
                        "clients": n,
                        "round": r,
                        "batching": mode,
                        "ceiling_items_per_s": ceiling,
                        "ceiling_batch": size,
                        **asdict(cell),
                    }
                )

        def med(values: list[float]) -> float:
            return statistics.median(values)

        def spread(values: list[float]) -> str:
            return f"{med(values):.2f} ({min(values):.2f}-{max(values):.2f})"

        offs, ons = [s["off"] for s in rounds_seen], [s["on"] for s in rounds_seen]
        ceilings = [s["ceiling"][0] for s in rounds_seen]
        sizes = sorted({s["ceiling"][1] for s in rounds_seen})
        flag = " **BUSY**" if any(c.busy for c in offs + ons) else ""
        rows.append(
            f"| {name}{flag} | {n} | {med([c.items_per_s for c in offs]):.1f} | {med([c.items_per_s for c in ons]):.1f} "
            f"| {spread([b.items_per_s / a.items_per_s for a, b in zip(offs, ons, strict=True)])} "
            f"| {med(ceilings):.1f} ({'/'.join(map(str, sizes))}) "
            f"| {spread([b.items_per_s / c for b, c in zip(ons, ceilings, strict=True)])} "
            f"| {med([c.p50_latency_ms for c in offs]):.0f} / {med([c.p50_latency_ms for c in ons]):.0f} "
            f"| {med([c.mean_batch for c in ons]):.1f} "
            f"| {med([c.cpu_ms_per_item for c in offs]):.1f} / {med([c.cpu_ms_per_item for c in ons]):.1f} "
            f"| {max(c.load_before for c in offs):.2f} / {max(c.load_before for c in ons):.2f} "
            f"| {max(c.others_cores for c in offs):.2f} / {max(c.others_cores for c in ons):.2f} |"
        )
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def pool_ceiling(backend, tokens: list, max_size: int, sizes: tuple[int, ...] | None = None) -> tuple[float, int]:  # type: ignore[no-untyped-def,type-arg]
    """The backend's own best on these items with `max_size` of them in
    flight: the items in pool order in windows of `max_size` (what can be in
    flight at once), each window sorted by length and cut into batches of one
    size of `sizes` (CEILING_SIZES) up to `max_size`; items/s of `run()` over
    all of them, no queue and no asyncio. (best items/s, its batch size)."""
    windows = [sorted(tokens[i : i + max_size], key=backend.item_size) for i in range(0, len(tokens), max_size)]
    rates = {}
    for size in (s for s in (sizes or CEILING_SIZES) if s <= max_size):
        batches = [window[i : i + size] for window in windows for i in range(0, len(window), size)]
        backend.run(batches[len(batches) // 2])  # warm-up at about this shape
        started = time.perf_counter()
        for batch in batches:
            backend.run(batch)
        rates[size] = len(tokens) / (time.perf_counter() - started)
    best = max(rates, key=lambda k: rates[k])
    return rates[best], best


def padding_row(
    bench: Bench, name: str, backend, jobs, run_one, base: OneShotQueueConfig, clients: int = 32, items_per_job: int = 1
) -> str:  # type: ignore[no-untyped-def]
    cells = {
        g: asyncio.run(measure(bench, backend, replace(base, group_by_length=g), jobs, run_one, clients, items_per_job))
        for g in (False, True)
    }
    for grouping, cell in cells.items():
        bench.cells.append(
            {"table": "padding", "backend": name, "clients": clients, "grouping": grouping, **asdict(cell)}
        )
    off, on = cells[False], cells[True]
    flag = " **BUSY**" if off.busy or on.busy else ""
    return (
        f"| {name}{flag} | {off.padding_ratio:.3f} | {on.padding_ratio:.3f} | {off.items_per_s:.1f} / {on.items_per_s:.1f} "
        f"| {off.mean_batch:.1f} / {on.mean_batch:.1f} |"
    )


CEILING_SIZES = (1, 2, 4, 8, 16, 32)
#: No 1 or 2: a rerank request brings its 32 pairs at once, and those sizes take minutes to try.
RERANK_CEILING_SIZES = (4, 8, 16, 32, 64, 128, 256)
RERANK_PAIRS = 32  # documents per rerank request (bench/rerank_peers.py)


def ceiling_row(bench: Bench, name: str, backend, tokens: list) -> str:  # type: ignore[no-untyped-def,type-arg]
    """What the runtime itself gains from a batch: `backend.run` on batches of
    one text repeated (the median length: no padding, no queue, no asyncio),
    items/s at each size against size 1. Batching the server's requests can
    approach this bound, never pass it."""
    item = sorted(tokens, key=len)[len(tokens) // 2]
    load, busy = bench.quiet()
    rates = {}
    for size in CEILING_SIZES:
        batch = [item] * size
        backend.run(batch)  # warm-up at this shape
        runs, started = max(2, 64 // size), time.perf_counter()
        for _ in range(runs):
            backend.run(batch)
        rates[size] = runs * size / (time.perf_counter() - started)
    bench.cells.append(
        {
            "table": "ceiling",
            "backend": name,
            "tokens": len(item),
            "items_per_s": rates,
            "load_before": load,
            "busy": busy,
        }
    )
    best = max(rates, key=lambda k: rates[k])
    cells = " | ".join(f"{rates[k]:.1f}" for k in CEILING_SIZES)
    flag = " **BUSY**" if busy else ""
    return f"| {name}{flag} | {len(item)} | {cells} | {rates[best] / rates[1]:.2f} (at {best}) | {load:.2f} |"


def rerank_tables(bench: Bench, args: argparse.Namespace, settings: ServerSettings) -> list[str]:
    """The cross-encoder's throughput table (printed) and its padding row
    (returned for the padding table): pairs/s, against the ceiling."""
    from bench.rerank_peers import MODEL_DIR, MODEL_NAME

    opened = open_oneshot(ModelKind.RERANK, MODEL_NAME, MODEL_DIR, settings)
    backend, config = opened.backend, opened.batching  # what the server queues it with
    if args.rerank_max_padding is not None:
        config = replace(config, max_padding=args.rerank_max_padding)
    if args.rerank_max_batch_tokens is not None:
        config = replace(config, max_batch_tokens=args.rerank_max_batch_tokens)
    jobs = rerank_jobs(backend, args.rerank_requests)
    pairs = [pair for job in jobs for pair in job]
    clients = [int(c) for c in args.rerank_clients.split(",")]
    label = (
        f"cross-encoder ({backend.info().backend}, {Path(opened.source).name}, max_padding {config.max_padding:g}, "
        f"max_batch_tokens {config.max_batch_tokens})"
    )

    def ceiling(n: int) -> tuple[float, int]:
        return pool_ceiling(backend, pairs, n * RERANK_PAIRS, RERANK_CEILING_SIZES)

    rows = throughput_rows(bench, label, backend, jobs, rerank_one, config, clients, args.rounds, ceiling, RERANK_PAIRS)
    sizes = [backend.item_size(p) for p in pairs]
    print(
        f"\nrerank: {len(jobs)} requests of a query and {RERANK_PAIRS} passages per cell, {np.mean(sizes):.0f} "
        f"tokens a pair on average ({min(sizes)}-{max(sizes)}); items/s = pairs/s; ceiling batches up to "
        f"{RERANK_CEILING_SIZES[-1]} pairs; queue: max_batch_size {config.max_batch_size}, "
        f"max_batch_tokens {config.max_batch_tokens}, max_padding {config.max_padding:g}"
    )
    print("\n".join(THROUGHPUT_HEADER + rows))
    if args.no_padding:
        return []
    row = padding_row(
        bench, f"{label}, {max(clients)} clients", backend, jobs, rerank_one, config, max(clients), RERANK_PAIRS
    )
    return [row]


def open_model(model_id: str, kind: str, settings: ServerSettings) -> OneShotBackend:  # type: ignore[type-arg]
    """The backend the server would load for `model_id`."""
    return open_oneshot(kind, model_id, resolve(model_id).path, settings).backend


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--threads", type=int, default=0, help="threads per backend (0: all cores)")
    add("--device", default="auto", choices=("auto", "cpu", "gpu"), help="the models' device (default: auto)")
    add(
        "--backends",
        default="onnx,gguf",
        help="embeddings backends: onnx, int8, gguf, default (what auto picks), or none (default: onnx,gguf)",
    )
    add("--clients", default="1,4,8,32", help="concurrent clients per cell, comma-separated (default: 1,4,8,32)")
    add("--texts", type=int, default=256, help="embedding requests per cell")
    add(
        "--rounds",
        type=int,
        default=3,
        help="rounds of ceiling / off / on per client count, order rotating (default: 3)",
    )
    add("--no-padding", action="store_true", help="skip the padding table")
    add("--no-ceiling", action="store_true", help="skip the table of what a batch gains inside the runtime")
    add("--speech", action="store_true", help="also measure faster-whisper tiny.en (whisper-tiny.en)")
    add("--clips", type=int, default=32, help="transcription requests per cell (with --speech)")
    add("--rerank", action="store_true", help="also measure the cross-encoder of bench/rerank_peers.py")
    add("--rerank-requests", type=int, default=16, help="rerank requests (32 pairs each) per cell (default: 16)")
    add("--rerank-clients", default="1,8", help="concurrent rerank clients per cell, comma-separated (default: 1,8)")
    add(
        "--rerank-max-padding",
        type=float,
        help="the rerank queue's max_padding instead of the served one (models/oneshot.py BATCHING)",
    )
    add(
        "--rerank-max-batch-tokens",
        type=int,
        help="the rerank queue's max_batch_tokens instead of the served one (models/oneshot.py BATCHING)",
    )
    add("--max-load", type=float, default=0.5, help="the 1-minute load average a cell may start at")
    add("--max-wait-quiet", type=float, default=420.0, help="seconds to wait for that before giving up")
    add("--allow-busy", action="store_true", help="measure on a busy machine anyway; such cells are marked BUSY")
    add("--json", type=Path, help="also write every cell (with load and others' CPU) to this file")
    args = parser.parse_args()
    if args.speech and shutil.which("espeak-ng") is None:
        parser.error("--speech says its clips with espeak-ng: install it (apt-get install espeak-ng)")
    os.environ.setdefault("LOCALSERVE_HOME", tempfile.mkdtemp(prefix="localserve-bench-"))
    clients = [int(c) for c in args.clients.split(",")]
    bench = Bench(args.max_load, args.allow_busy, args.max_wait_quiet, [])
    bench.quiet()  # refuse a busy machine before loading anything
    settings = ServerSettings(threads=args.threads, device=args.device)
    from bench.paired import git_describe, now

    commit, started_at = git_describe(), now()
    if args.rerank:
        from bench.rerank_peers import ensure_cross_encoder

        ensure_cross_encoder()  # before any timing: torch and transformers, once

    from localserve.models.catalog import catalog_backend, catalog_variant
    from localserve.models.oneshot_embeddings import choose_embeddings_backend

    default = choose_embeddings_backend(resolve(DEFAULT_ID).path, catalog_backend(DEFAULT_ID)).backend
    default_key = KEY_OF[default]
    if default_key == "onnx" and catalog_variant(DEFAULT_ID) == "int8":
        default_key = "int8"  # the graph the default id runs on ONNX Runtime
    backends = {}
    keys = [] if args.backends == "none" else args.backends.split(",")
    for key in dict.fromkeys(default_key if b == "default" else KEY_OF[b] for b in keys):
        model_id, label = EMBEDDING_IDS[key]
        backends[label + (" (default)" if key == default_key else "")] = open_model(model_id, EMBEDDINGS, settings)
    first = next(iter(backends.values()), None)
    tokens = [first.tokenize(t) for t in texts(args.texts)] if first else []  # type: ignore[attr-defined]  # one WordPiece vocabulary
    embed_config = OneShotQueueConfig(**BATCHING[EMBEDDINGS])  # type: ignore[arg-type]
    print(
        f"# one-shot bench: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start (max {args.max_load}"
        f"{', BUSY ALLOWED' if args.allow_busy else ''}), threads={args.threads or 'all'}, device={args.device}, "
        f"`{DEFAULT_ID}` runs on {default} here"
    )
    if backends:
        print(
            f"\nembeddings: {len(tokens)} single-text requests per cell, "
            f"{np.mean([len(t) for t in tokens]):.0f} tokens on average"
        )
    rows, padding = [], []
    for label, backend in backends.items():
        ceiling = partial(pool_ceiling, backend, tokens)
        rows += throughput_rows(bench, label, backend, tokens, embed_one, embed_config, clients, args.rounds, ceiling)
        if not args.no_padding and not backend.padding_free:
            padding.append(padding_row(bench, label, backend, tokens, embed_one, embed_config))
    if backends:
        print("\n".join(THROUGHPUT_HEADER + rows))
    if args.rerank:
        padding += rerank_tables(bench, args, settings)
    if backends and not args.no_ceiling:
        sizes = " | ".join(f"batch {k}" for k in CEILING_SIZES)
        print("\nthe ceiling: items/s of the backend's own run() on equal texts, by batch size (no padding, no queue)")
        print(f"| backend | tokens | {sizes} | best / batch 1 | load avg before |")
        print("|---|---:|" + "---:|" * len(CEILING_SIZES) + "---:|---:|")
        for label, backend in backends.items():
            print(ceiling_row(bench, label, backend, tokens), flush=True)
    if args.speech:
        whisper = open_model("whisper-tiny.en", TRANSCRIPTION, settings)
        with tempfile.TemporaryDirectory() as tmp:
            clips = speech_clips(args.clips, Path(tmp))
        asr_config = OneShotQueueConfig(**BATCHING[TRANSCRIPTION])  # type: ignore[arg-type]
        label = f"faster-whisper tiny.en ({whisper.info().device})"
        asr_rows = throughput_rows(
            bench, label, whisper, clips, transcribe_one(whisper), asr_config, clients, args.rounds
        )
        print(f"\nspeech: {args.clips} transcriptions per cell (espeak-ng clips of 1-12 s); items/s = requests/s")
        print("\n".join(THROUGHPUT_HEADER + asr_rows))
        if not args.no_padding:
            padding.append(
                padding_row(bench, f"{label}, fixed 30 s windows", whisper, clips, transcribe_one(whisper), asr_config)
            )
    if padding:
        print(
            "\npadding at 32 clients (unless the row says), batching on: padded slots / real tokens (or audio frames)"
        )
        print("\n".join(PADDING_HEADER + padding))
    busy = sum(1 for c in bench.cells if c["busy"])
    print(f"\nload average at end {os.getloadavg()[0]:.2f}" + (f"; {busy} cells BUSY: not figures" if busy else ""))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "commit": commit,
                    "started": started_at,
                    "cpus": os.cpu_count(),
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "cells": bench.cells,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
