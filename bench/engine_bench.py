"""Aggregate decode throughput of the engine against a raw llama.cpp loop.

Both run in this process, with the same llama-cpp-python build, the same
model, threads and batch sizes:

* raw: one context (one KV stream per sequence), N sequences prefilled with the same-length prompts, then
  a plain loop of `llama_decode` over N tokens + greedy sampling per sequence.
* engine: N requests submitted at once to localserve's Engine (scheduler +
  step thread + asyncio dispatch), greedy, fixed output length.

Decode tok/s counts only the window where all N sequences are decoding.
The host's speed drifts by up to 30% within minutes, so each size runs
`--rounds` pairs, raw and engine alternating which goes first, and reports
the median of the per-pair ratios and their range.

    python bench/engine_bench.py [--model PATH] [--sizes 1,4,8,16] [--tokens 128] [--rounds 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import llama_cpp

from localserve.backends.llamacpp.backend import LlamaCppBackend, LlamaCppConfig
from localserve.backends.llamacpp.devices import init_llama
from localserve.engine.engine import Engine, EngineConfig
from localserve.engine.types import GenerateRequest, SamplingParams
from localserve.models.registry import resolve

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle. "


def prompt_tokens(tokenizer, n: int, i: int) -> list[int]:  # type: ignore[no-untyped-def]
    base = tokenizer.encode(f"{i}: " + PROMPT * 20, add_special=False)
    return base[:n]


def raw_decode_tps(model_path: str, n_seqs: int, n_prompt: int, n_gen: int, threads: int) -> float:
    init_llama()
    mparams = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(model_path.encode(), mparams)
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = max(n_seqs, 1) * max(n_prompt + n_gen + 8, 256)
    cparams.n_batch = 512
    cparams.n_ubatch = 512
    cparams.n_seq_max = max(n_seqs, 1)
    cparams.kv_unified = n_seqs == 1  # one KV stream per sequence, as llama-server and our backend
    cparams.n_threads = cparams.n_threads_batch = threads
    cparams.no_perf = True
    cparams.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED  # as the backend opens a CPU model
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    from localserve.backends.llamacpp.tokenizer import LlamaTokenizer

    tok = LlamaTokenizer(model)
    batch = llama_cpp.llama_batch_init(512, 0, 1)
    chains = [llama_cpp.llama_sampler_init_greedy() for _ in range(n_seqs)]
    last = []
    for s in range(n_seqs):  # prefill one sequence per decode call
        toks = prompt_tokens(tok, n_prompt, s)
        for k, t in enumerate(toks):
            batch.token[k], batch.pos[k], batch.n_seq_id[k], batch.logits[k] = t, k, 1, 0
            batch.seq_id[k][0] = s
        batch.logits[len(toks) - 1] = 1
        batch.n_tokens = len(toks)
        assert llama_cpp.llama_decode(ctx, batch) == 0
        last.append(llama_cpp.llama_sampler_sample(chains[s], ctx, len(toks) - 1))
    started = time.perf_counter()
    for step in range(n_gen):
        for s in range(n_seqs):
            batch.token[s], batch.pos[s], batch.n_seq_id[s], batch.logits[s] = last[s], n_prompt + step, 1, 1
            batch.seq_id[s][0] = s
        batch.n_tokens = n_seqs
        assert llama_cpp.llama_decode(ctx, batch) == 0
        last = [llama_cpp.llama_sampler_sample(chains[s], ctx, s) for s in range(n_seqs)]
    elapsed = time.perf_counter() - started
    for c in chains:
        llama_cpp.llama_sampler_free(c)
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    return n_seqs * n_gen / elapsed


async def engine_decode_tps(backend: LlamaCppBackend, n_seqs: int, n_prompt: int, n_gen: int) -> float:
    engine = Engine(EngineConfig())
    engine.add_model("m", backend)
    tok = backend.tokenizer()
    params = SamplingParams(max_tokens=n_gen, temperature=0.0, ignore_eos=True)
    stamps: list[list[float]] = [[] for _ in range(n_seqs)]

    async def one(i: int) -> None:
        request = GenerateRequest(f"bench-{n_seqs}-{i}-{time.monotonic_ns()}", prompt_tokens(tok, n_prompt, i), params)
        async for event in engine.submit("m", request):
            stamps[i].extend([time.perf_counter()] * len(event.token_ids))

    await asyncio.gather(*(one(i) for i in range(n_seqs)))
    await engine.unload_model("m", close_backend=False)
    window_start = max(s[0] for s in stamps)  # every sequence is decoding from here
    window_end = min(s[-1] for s in stamps)  # ... until the first one ends
    tokens = sum(sum(1 for t in s if window_start < t <= window_end) for s in stamps)
    return tokens / max(window_end - window_start, 1e-9)


def in_own_thread(fn, *args):  # type: ignore[no-untyped-def]
    """Call `fn` in a thread that ends afterwards. llama.cpp's OpenMP threads
    form a team per calling thread, and a team lives as long as its thread:
    a raw loop (or a model's warm-up) on the main thread would leave a team
    behind, and with more OpenMP threads than cores libgomp stops spinning at
    barriers, which slowed the engine's step thread to 0.6x at one sequence.
    The server loads models and steps them on their own threads likewise."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args).result()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="GGUF path (default: smollm2-135m-instruct)")
    parser.add_argument("--sizes", default="1,4,8,16", help="concurrent sequences, comma-separated")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=128, help="generated tokens per sequence")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=3, help="raw/engine pairs per size, order alternating")
    parser.add_argument("--json", default=None, help="also write the result here (e.g. bench/results/engine.json)")
    args = parser.parse_args()
    path = args.model or str(resolve("smollm2-135m-instruct").path)
    sizes = [int(s) for s in args.sizes.split(",")]
    # One KV stream of the raw loop's length per slot (kv_size=0): a smaller
    # kv_size would make the backend share one pool, which decodes slower.
    n_ctx = max(args.prompt_tokens + args.tokens + 8, 256)
    config = LlamaCppConfig(model_path=path, n_ctx=n_ctx, num_slots=max(sizes), n_threads=args.threads)
    backend = in_own_thread(LlamaCppBackend, config)
    print(f"model {path}\nthreads {args.threads}, prompt {args.prompt_tokens}, generated {args.tokens}\n")
    load = os.getloadavg()[0]
    rows = []
    for n in sizes:
        pairs = []
        for r in range(args.rounds):
            measured = {}
            for side in ("raw", "engine") if r % 2 == 0 else ("engine", "raw"):
                if side == "raw":
                    measured[side] = in_own_thread(
                        raw_decode_tps, path, n, args.prompt_tokens, args.tokens, args.threads
                    )
                else:
                    measured[side] = asyncio.run(engine_decode_tps(backend, n, args.prompt_tokens, args.tokens))
            pairs.append(measured)
            print(
                f"  {n} seqs, pair {r + 1}: raw {measured['raw']:.1f}, engine {measured['engine']:.1f} tok/s",
                flush=True,
            )
        ratios = [p["engine"] / p["raw"] for p in pairs]
        rows.append(
            {
                "seqs": n,
                "raw_tps": round(statistics.median(p["raw"] for p in pairs), 1),
                "engine_tps": round(statistics.median(p["engine"] for p in pairs), 1),
                "ratio_median": round(statistics.median(ratios), 3),
                "ratio_min": round(min(ratios), 3),
                "ratio_max": round(max(ratios), 3),
            }
        )
    backend.close()
    print(f"\n1-minute load {load:.2f} at the start, {args.rounds} alternating pairs per size\n")
    print("| seqs | raw llama_decode tok/s | engine tok/s | engine / raw (median) | range |")
    print("|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['seqs']} | {row['raw_tps']} | {row['engine_tps']} | {row['ratio_median']:.2f} "
            f"| {row['ratio_min']:.2f}-{row['ratio_max']:.2f} |"
        )
    if args.json:
        result = {
            "kind": "engine_bench",
            "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "loadavg_before": round(load, 2),
            "threads": args.threads,
            "prompt_tokens": args.prompt_tokens,
            "tokens": args.tokens,
            "rows": rows,
        }
        with open(args.json, "w") as f:
            f.write(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
