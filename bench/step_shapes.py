"""The cost of one llama_decode by batch shape, on the backend's context (16
split KV streams of 1024, 2 threads, no flash attention, SmolLM2): prompt chunks of one or
several sequences, and decode steps of 1-16 sequences at position 350.
Median of 3 runs per shape, in ms per token. Run on a quiet machine.

    .venv/bin/python bench/step_shapes.py
"""

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from concurrent.futures import ThreadPoolExecutor

import llama_cpp

from localserve.backends.llamacpp.devices import init_llama
from localserve.models.registry import resolve


def main():
    init_llama()
    path = str(resolve("smollm2-135m-instruct").path)
    model = llama_cpp.llama_model_load_from_file(path.encode(), llama_cpp.llama_model_default_params())
    cp = llama_cpp.llama_context_default_params()
    NB = 512
    cp.n_ctx = 16 * 1024
    cp.n_batch = NB
    cp.n_ubatch = 512
    cp.n_seq_max = 16
    cp.kv_unified = False
    cp.n_threads = cp.n_threads_batch = 2
    cp.no_perf = True
    cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED  # as the backend opens a CPU model
    ctx = llama_cpp.llama_init_from_model(model, cp)
    mem = llama_cpp.llama_get_memory(ctx)
    batch = llama_cpp.llama_batch_init(NB, 0, 1)

    def run(chunks):  # list of (seq, start_pos, n)
        llama_cpp.llama_memory_clear(mem, True)
        # fill prefix positions first (not timed): for chunks starting at pos>0
        for s, p0, _n in chunks:
            pos = 0
            while pos < p0:
                k = min(512, p0 - pos)
                for i in range(k):
                    batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = 100 + (i % 50), pos + i, 1, 0
                    batch.seq_id[i][0] = s
                batch.n_tokens = k
                assert llama_cpp.llama_decode(ctx, batch) == 0
                pos += k
        k = 0
        for s, p0, n in chunks:
            for i in range(n):
                batch.token[k], batch.pos[k], batch.n_seq_id[k], batch.logits[k] = (
                    200 + (i % 50),
                    p0 + i,
                    1,
                    int(i == n - 1),
                )
                batch.seq_id[k][0] = s
                k += 1
        batch.n_tokens = k
        t = time.perf_counter()
        assert llama_cpp.llama_decode(ctx, batch) == 0
        return time.perf_counter() - t, k

    shapes = {
        "1x512": [(0, 0, 512)],
        "2: 345+167": [(0, 0, 345), (1, 0, 167)],
        "8x64": [(s, 0, 64) for s in range(8)],
        "7x73": [(s, 0, 73) for s in range(7)],
        "4x128": [(s, 0, 128) for s in range(4)],
        "1x256": [(0, 0, 256)],
        "1x128": [(0, 0, 128)],
        "8x1@350": [(s, 350, 1) for s in range(8)],
        "16x1@350": [(s, 350, 1) for s in range(16)],
        "8x2@350": [(s, 350, 2) for s in range(8)],
        "8x4@350": [(s, 350, 4) for s in range(8)],
        "1x1@350": [(0, 350, 1)],
    }
    res = {k: [] for k in shapes}
    for _r in range(3):
        for name, ch in shapes.items():
            dt, n = run(ch)
            res[name].append((dt, n))
    for name, v in res.items():
        dt = statistics.median(d for d, _ in v)
        n = v[0][1]
        print(f"{name:12s} {n:4d} tok  {dt * 1e3:8.1f} ms  {dt / n * 1e3:6.2f} ms/token")


with ThreadPoolExecutor(1) as p:
    p.submit(main).result()
