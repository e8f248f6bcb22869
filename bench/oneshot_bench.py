"""Throughput of one-shot models through the micro-batcher, batching on vs off.

Clients (1, 8, 32 at once) each send single-input requests until a shared
pool is used up; `on` is the server's batching (see models/oneshot.py),
`off` is the same batcher with max_batch_size=1. A second table shows the
padding ratio (padded slots / real tokens or audio frames) a padded backend
computed, with length grouping on vs off, at 32 clients.

* embeddings: all-MiniLM-L6-v2 as GGUF on llama.cpp (padding-free: it packs
  sequences) and as ONNX on ONNX Runtime (padded rectangles); texts of 2 to
  120 words.
* speech: faster-whisper tiny.en (int8) on espeak-ng sentences of 1 to 12 s,
  decoded and cut as the API does (PyAV, VAD) on worker threads.

    python bench/oneshot_bench.py [--threads N] [--texts 256] [--clips 32] [--skip-asr]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from localserve.backends.base import OneShotBackend  # noqa: E402
from localserve.engine.batcher import Batcher, BatcherConfig  # noqa: E402
from localserve.models.oneshot import BATCHING, EMBEDDINGS, TRANSCRIPTION  # noqa: E402
from localserve.models.registry import resolve  # noqa: E402

CONCURRENCY = (1, 8, 32)
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
    cpu_ms_per_item: float  # this process's CPU time: fair even when other processes load the machine
    mean_batch: float
    p50_latency_s: float
    padding_ratio: float


async def drive(
    batcher: Batcher, jobs: list, run_one: Callable[[Batcher, object], Awaitable[None]], clients: int
) -> Cell:  # type: ignore[type-arg]
    """`clients` tasks take jobs from a shared pool until it is empty."""
    pool = list(reversed(jobs))
    latencies: list[float] = []

    async def client() -> None:
        while pool:
            job = pool.pop()
            started = time.monotonic()
            await run_one(batcher, job)
            latencies.append(time.monotonic() - started)

    started, cpu_started = time.monotonic(), time.process_time()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed, cpu = time.monotonic() - started, time.process_time() - cpu_started
    stats = batcher.stats()
    return Cell(
        len(jobs) / elapsed,
        1000 * cpu / len(jobs),
        stats["mean_batch_size"],
        statistics.median(latencies),
        stats["padding_ratio"],
    )


async def measure(backend: OneShotBackend, config: BatcherConfig, jobs: list, run_one, clients: int) -> Cell:  # type: ignore[no-untyped-def,type-arg]
    batcher = Batcher("bench", backend, config)
    try:
        await drive(batcher, jobs[: min(4, len(jobs))], run_one, 4)  # warm up (graphs, caches)
        batcher.close()
        batcher = Batcher("bench", backend, config)
        return await drive(batcher, jobs, run_one, clients)
    finally:
        await asyncio.to_thread(batcher.close)


# ---- workloads ------------------------------------------------------------------------


def texts(count: int) -> list[str]:
    rng = np.random.default_rng(3)
    return [" ".join(rng.choice(VOCAB, size=int(rng.integers(2, 121)))) for _ in range(count)]


async def embed_one(batcher: Batcher, tokens: object) -> None:  # type: ignore[type-arg]
    await batcher.submit([tokens])


def speech_clips(count: int, workdir: Path) -> list[bytes]:
    from tests.fixtures.speech import speak

    wavs = [speak(text, workdir / f"clip{i}.wav").read_bytes() for i, text in enumerate(SPEECH)]
    return [wavs[i % len(wavs)] for i in range(count)]


def transcribe_one(backend):  # type: ignore[no-untyped-def]
    from localserve.backends.speech import TranscribeOptions, decode_audio

    async def run(batcher: Batcher, data: bytes) -> None:  # type: ignore[type-arg]
        audio = await asyncio.to_thread(decode_audio, data, max_seconds=600)
        plan = await asyncio.to_thread(backend.plan, audio, TranscribeOptions())
        results = await batcher.submit(plan.windows)
        backend.assemble(plan, results, "transcribe")

    return run


# ---- tables --------------------------------------------------------------------------------


def throughput_table(name: str, unit: str, backend, jobs, run_one, base: BatcherConfig) -> list[str]:  # type: ignore[no-untyped-def]
    rows = []
    for clients in CONCURRENCY:
        cells = {}
        for mode, config in (("off", replace(base, max_batch_size=1)), ("on", base)):
            cells[mode] = asyncio.run(measure(backend, config, jobs, run_one, clients))
        on, off = cells["on"], cells["off"]
        rows.append(
            f"| {name} | {clients} | {off.items_per_s:.1f} | {on.items_per_s:.1f} | {on.items_per_s / off.items_per_s:.2f}x "
            f"| {off.cpu_ms_per_item:.0f} / {on.cpu_ms_per_item:.0f} | {on.mean_batch:.1f} "
            f"| {off.p50_latency_s * 1000:.0f} / {on.p50_latency_s * 1000:.0f} |"
        )
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def padding_row(name: str, backend, jobs, run_one, base: BatcherConfig) -> str:  # type: ignore[no-untyped-def]
    cells = {
        g: asyncio.run(measure(backend, replace(base, group_by_length=g), jobs, run_one, 32)) for g in (False, True)
    }
    off, on = cells[False], cells[True]
    return (
        f"| {name} | {off.padding_ratio:.3f} | {on.padding_ratio:.3f} | {off.items_per_s:.1f} / {on.items_per_s:.1f} "
        f"| {off.cpu_ms_per_item:.0f} / {on.cpu_ms_per_item:.0f} | {off.mean_batch:.1f} / {on.mean_batch:.1f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=0, help="threads per backend (0: all cores)")
    parser.add_argument("--texts", type=int, default=256, help="embedding requests per cell")
    parser.add_argument("--clips", type=int, default=32, help="transcription requests per cell")
    parser.add_argument("--skip-asr", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("LOCALSERVE_HOME", tempfile.mkdtemp(prefix="localserve-bench-"))

    from localserve.backends.embeddings_llamacpp import LlamaEmbeddingBackend, LlamaEmbeddingConfig
    from localserve.backends.onnx_embeddings import OnnxEmbeddingBackend, OnnxEmbeddingConfig
    from localserve.models.convert import cached_gguf
    from localserve.models.convert_onnx import cached_onnx

    source = resolve("all-minilm-l6-v2").path
    llama = LlamaEmbeddingBackend(
        LlamaEmbeddingConfig(str(cached_gguf(source, "all-minilm-l6-v2")), n_threads=args.threads)
    )
    onnx = OnnxEmbeddingBackend(
        OnnxEmbeddingConfig(str(cached_onnx(source, "all-minilm-l6-v2")), n_threads=args.threads)
    )
    tokens = [llama.tokenize(t) for t in texts(args.texts)]
    embed_config = BatcherConfig(**BATCHING[EMBEDDINGS])  # type: ignore[arg-type]
    load = os.getloadavg()[0]
    print(
        f"# one-shot bench: {os.cpu_count()} CPUs, load average {load:.1f} at start, threads={args.threads or 'all'}, "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}"
    )
    print(
        f"\nembeddings: {len(tokens)} single-text requests per cell, {np.mean([len(t) for t in tokens]):.0f} tokens on average"
    )
    header = [
        "| backend | clients | off: items/s | on: items/s | speed-up | CPU ms/item off / on | mean batch (on) "
        "| p50 latency ms off / on |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows = throughput_table("llama.cpp GGUF", "texts", llama, tokens, embed_one, embed_config)
    rows += throughput_table("ONNX Runtime", "texts", onnx, tokens, embed_one, embed_config)
    padding = [
        padding_row("ONNX Runtime (embeddings)", onnx, tokens, embed_one, embed_config),
        padding_row("llama.cpp GGUF (padding-free)", llama, tokens, embed_one, embed_config),
    ]
    asr_rows: list[str] = []
    if not args.skip_asr:
        from localserve.backends.whisper import FasterWhisperBackend, WhisperConfig

        whisper = FasterWhisperBackend(WhisperConfig(str(resolve("whisper-tiny.en").path), n_threads=args.threads))
        with tempfile.TemporaryDirectory() as tmp:
            clips = speech_clips(args.clips, Path(tmp))
        asr_config = BatcherConfig(**BATCHING[TRANSCRIPTION])  # type: ignore[arg-type]
        asr_rows = throughput_table(
            "faster-whisper tiny.en", "clips", whisper, clips, transcribe_one(whisper), asr_config
        )
        padding.append(
            padding_row(
                "faster-whisper tiny.en (fixed 30 s windows)", whisper, clips, transcribe_one(whisper), asr_config
            )
        )
    print("\n".join(header + rows))
    if asr_rows:
        print(f"\nspeech: {args.clips} transcriptions per cell (espeak-ng clips of 1-12 s); items/s = requests/s")
        print("\n".join(header + asr_rows))
    print("\npadding at 32 clients, batching on: padded slots / real tokens (or audio frames)")
    print(
        "| backend | padding, grouping off | padding, grouping on | items/s off / on | CPU ms/item off / on "
        "| mean batch off / on |"
    )
    print("|---|---|---|---|---|---|")
    print("\n".join(padding))
    print(f"\nload average at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
