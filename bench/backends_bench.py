"""Aggregate generation throughput of the generative backends on SmolLM2,
each driven by the same Engine (scheduler + step thread), on this CPU.

* llamacpp: the shipped GGUF (Q4_1).
* onnx / openvino: the same weights exported to float32 (`localserve
  export`, cached like the tests' fixture); OpenVINO at f32 and at its
  default precision on this CPU (bf16 where the CPU has it).

For each number of concurrent sequences N, N requests of P prompt tokens
and G output tokens (greedy, EOS ignored) are submitted at once; the figure
is N*G / wall time from submit to the last token (prefill included), plus
the decode-only rate measured over the steps where all N are decoding.
Backends run interleaved per N, each repeat; the best of the repeats counts
(the machine is shared).

    python bench/backends_bench.py [--sizes 1,4,8] [--prompt 32] [--tokens 64] [--repeats 2] [--threads 2]
    python bench/backends_bench.py --padding   # one padded call per step vs split calls
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from localserve.engine.engine import Engine, EngineConfig  # noqa: E402
from localserve.engine.types import GenerateRequest, SamplingParams  # noqa: E402
from localserve.models.registry import resolve  # noqa: E402

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle. "


def open_backends(names: list[str], threads: int, num_slots: int):  # type: ignore[no-untyped-def]
    from tests.fixtures.export_smollm2 import export_smollm2

    gguf = resolve("smollm2-135m-instruct").path
    out = {}
    if "llamacpp" in names:
        from localserve.backends.llamacpp.backend import LlamaCppBackend, LlamaCppConfig

        out["llamacpp"] = LlamaCppBackend(
            LlamaCppConfig(str(gguf), n_ctx=1024, num_slots=num_slots, step_tokens=512, n_threads=threads)
        )
    folders = export_smollm2(gguf) if any(n != "llamacpp" for n in names) else {}
    if "onnx" in names:
        from localserve.backends.onnx.backend import OnnxBackend, OnnxConfig

        out["onnx"] = OnnxBackend(
            OnnxConfig(str(folders["onnx"]), n_ctx=1024, num_slots=num_slots, step_tokens=512, n_threads=threads)
        )
    for name, precision in (("openvino-f32", "f32"), ("openvino", "")):
        if name in names:
            from localserve.backends.openvino.backend import OpenVinoBackend, OpenVinoConfig

            config = OpenVinoConfig(
                str(folders["openvino"]),
                n_ctx=1024,
                num_slots=num_slots,
                step_tokens=512,
                n_threads=threads,
                device="CPU",
                precision=precision,
            )
            out[name] = OpenVinoBackend(config)
    return out


async def run_level(engine: Engine, model: str, n: int, n_prompt: int, n_gen: int) -> tuple[float, float]:
    """(aggregate tok/s including prefill, decode-only tok/s)."""
    tok = engine.tokenizer(model)
    params = SamplingParams(max_tokens=n_gen, temperature=0.0, ignore_eos=True)
    requests = [
        GenerateRequest(
            f"{model}-{n}-{i}-{time.monotonic_ns()}",
            tok.encode(f"{i}: " + PROMPT * 8, add_special=False)[:n_prompt],
            params,
        )
        for i in range(n)
    ]
    counts = [0] * n
    marks: dict[str, float] = {}

    async def one(i: int, req: GenerateRequest) -> None:
        async for event in engine.submit(model, req):
            counts[i] += len(event.token_ids)
            if counts[i] >= 2 and all(c >= 2 for c in counts) and "decode_start" not in marks:
                marks["decode_start"], marks["decode_tokens"] = time.perf_counter(), sum(counts)
            if event.finished and "decode_end" not in marks:
                marks["decode_end"], marks["end_tokens"] = time.perf_counter(), sum(counts)

    started = time.perf_counter()
    await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))
    total = time.perf_counter() - started
    decode_s = marks.get("decode_end", 0) - marks.get("decode_start", 0)
    decode_tokens = marks.get("end_tokens", 0) - marks.get("decode_tokens", 0)
    return n * n_gen / total, (decode_tokens / decode_s if decode_s > 0 else math.nan)


async def bench(args: argparse.Namespace) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    backends = open_backends(args.backends.split(","), args.threads, max(sizes))
    engine = Engine(EngineConfig())
    for name, backend in backends.items():
        engine.add_model(name, backend)
    try:
        for name in backends:  # warm-up: first calls compile kernels
            await run_level(engine, name, 2, 8, 4)
        best: dict[tuple[str, int], tuple[float, float]] = {}
        for _ in range(args.repeats):
            for n in sizes:
                for name in backends:
                    agg, dec = await run_level(engine, name, n, args.prompt, args.tokens)
                    old = best.get((name, n), (0.0, 0.0))
                    best[(name, n)] = (max(old[0], agg), max(old[1], dec))
        print(
            f"\nSmolLM2-135M, {args.threads} threads, prompt {args.prompt}, output {args.tokens}, best of {args.repeats}"
        )
        print("| backend | " + " | ".join(f"{n} seq tok/s (decode-only)" for n in sizes) + " |")
        print("|---|" + "---|" * len(sizes))
        for name in backends:
            cells = [f"{best[(name, n)][0]:.1f} ({best[(name, n)][1]:.1f})" for n in sizes]
            print(f"| {name} | " + " | ".join(cells) + " |")
    finally:
        await engine.close()


def bench_padding(args: argparse.Namespace) -> None:
    """One step of 7 decode tokens + a 64-token prompt chunk: one padded call
    against the default split (decodes together, the chunk alone)."""
    from localserve.engine.types import KvOp, SeqChunk, StepPlan

    backends = open_backends(args.backends.split(","), args.threads, 8)
    greedy = SamplingParams(temperature=0.0)
    for name, backend in backends.items():
        if not hasattr(backend, "max_padding"):
            continue
        tok = backend.tokenizer()
        ids = tok.encode(PROMPT * 8, add_special=False)
        for s in range(7):
            backend.execute(StepPlan(0, (), (SeqChunk(s, s, tuple(ids[:64]), 0, True, greedy),)))
        for label, factor in (("split", 1.25), ("one padded call", float("inf"))):
            backend.max_padding = factor
            times = []
            for _ in range(args.repeats * 3):
                keep = tuple(KvOp("keep", s, 64 if s < 7 else 0) for s in range(8))  # the same step each time
                chunks = [SeqChunk(s, s, (ids[64],), 64, True, greedy) for s in range(7)]
                chunks.append(SeqChunk(7, 7, tuple(ids[:64]), 0, True, greedy))
                started = time.perf_counter()
                backend.execute(StepPlan(0, keep, tuple(chunks)))
                times.append(time.perf_counter() - started)
            print(f"{name}: 7 decodes + 64-token chunk, {label}: {1000 * min(times):.0f} ms/step (best)")
        backend.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="llamacpp,onnx,openvino-f32,openvino")
    parser.add_argument("--sizes", default="1,4,8")
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--padding", action="store_true", help="measure the padded-call choice instead")
    args = parser.parse_args()
    if args.padding:
        bench_padding(args)
    else:
        asyncio.run(bench(args))


if __name__ == "__main__":
    main()
