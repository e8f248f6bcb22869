"""What verifying drafted tokens costs on this CPU: one `llama_decode` of n
tokens of one sequence (logits at every position, as a speculative step
verifies them), after a 500-token context, for n = 1, 2, 4, ... 64.

Speculation pays only if a step of 1 + k tokens costs much less than k + 1
steps of one token. This prints the time per step and its ratio to the
one-token step, and the most a step could gain if every draft were
accepted: (k + 1) * t(1) / t(k + 1). Each model starts at a 1-minute load below 0.5. GGUF files other than the default model
(e.g. requantized with llama.cpp's quantize) are compared with --model.

    python bench/verify_cost.py [--model PATH ...] [--json bench/results/verify-cost.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.compare_servers import wait_for_quiet  # noqa: E402

SIZES = (1, 2, 4, 8, 16, 32, 64)
CONTEXT = 500


def measure(model_path: str, threads: int, repeats: int) -> list[dict[str, float]]:
    import llama_cpp

    from localserve.backends.llamacpp.backend import LlamaCppBackend, LlamaCppConfig

    backend = LlamaCppBackend(LlamaCppConfig(model_path, n_ctx=2048, num_slots=1, step_tokens=512, n_threads=threads))
    ctx, mem, batch = backend._native()

    def decode(tokens: list[int], start: int) -> float:
        batch.n_tokens = len(tokens)
        for i, token in enumerate(tokens):
            batch.token[i] = token
            batch.pos[i] = start + i  # type: ignore[call-overload]
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1
        started = time.perf_counter()
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        return time.perf_counter() - started

    decode([100 + i for i in range(CONTEXT)], 0)
    rows = []
    for n in SIZES:
        times = []
        for _ in range(repeats):
            times.append(decode([200 + i for i in range(n)], CONTEXT))
            llama_cpp.llama_memory_seq_rm(mem, 0, CONTEXT, -1)
        rows.append({"tokens": n, "ms": round(1000 * statistics.median(times), 2)})
    backend.close()
    one = rows[0]["ms"]
    for row in rows:
        row["over_one"] = round(row["ms"] / one, 2)
        row["best_gain"] = round(row["tokens"] * one / row["ms"], 2)  # every draft accepted
    return rows


def main() -> None:
    from localserve.models.registry import resolve

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", help="GGUF files (default: the default chat model)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    models = args.model or [str(resolve("smollm2-135m-instruct").path)]
    report: dict[str, Any] = {"threads": args.threads, "load_before": [], "models": {}}
    for model in models:
        report["load_before"].append(round(wait_for_quiet(), 2))
        rows = measure(model, args.threads, args.repeats)
        report["models"][Path(model).name] = rows
        print(Path(model).name)
        print("  tokens   ms/step   x one-token step   gain if all accepted")
        for row in rows:
            print(f"  {row['tokens']:6d} {row['ms']:9.1f} {row['over_one']:18.2f} {row['best_gain']:22.2f}")
    report["load_after"] = round(os.getloadavg()[0], 2)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
