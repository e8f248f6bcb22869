"""llama.cpp's flash attention on the CPU, on and off: one `llama_decode` by
batch shape and context position, on the backend's context layout (16 split
KV streams of 1024, 2 threads, SmolLM2-135M Q4_1). Why `--flash-attn auto`
is off for a model on the CPU (`kv_types.resolve_flash_attn`).

`--pool` opens one KV pool the sequences share instead (8 sequences, 8192
cells, every sequence filled), where attention without flash attention
multiplies over every sequence's cells.

Each round times every shape with both contexts, one after the other, so
that the host's drift falls on both; the figure is the median over rounds of
each round's median of 3 steps. Run on a quiet machine.

    .venv/bin/python bench/flash_attn.py --json bench/results/flash-attn.json
    .venv/bin/python bench/flash_attn.py --pool --positions 100,350,700 --json bench/results/flash-attn-pool.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import llama_cpp  # noqa: E402

from bench.compare_servers import wait_for_quiet  # noqa: E402
from localserve.backends.llamacpp.devices import init_llama  # noqa: E402
from localserve.models.registry import resolve  # noqa: E402

SLOTS, SLOT_CTX, UBATCH = 16, 1024, 512
# (sequences, tokens each, logits of every token): decode steps, a speculative
# verify (1 x 4) and prompt chunks (4 x 32, no logits)
SHAPES = ((16, 1, True), (8, 1, True), (1, 1, True), (1, 4, True), (4, 32, False))
MODES = {"on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED, "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED}


class Context:
    def __init__(self, model: llama_cpp.llama_model_p, flash_attn: int, threads: int, pool: bool = False) -> None:
        self.slots = 8 if pool else SLOTS
        self.pool = pool
        params = llama_cpp.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch = self.slots * SLOT_CTX, UBATCH, UBATCH
        params.n_seq_max, params.kv_unified = self.slots, pool
        params.n_threads = params.n_threads_batch = threads
        params.no_perf = True
        params.flash_attn_type = flash_attn
        self.ctx = llama_cpp.llama_init_from_model(model, params)
        assert self.ctx, "llama.cpp could not create the context"
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.batch = llama_cpp.llama_batch_init(UBATCH, 0, 1)

    def _decode(self, items: list[tuple[int, int, int, bool]]) -> float:
        b = self.batch
        for k, (token, pos, seq, logits) in enumerate(items):
            b.token[k], b.pos[k], b.n_seq_id[k], b.logits[k] = token, pos, 1, int(logits)
            b.seq_id[k][0] = seq
        b.n_tokens = len(items)
        start = time.perf_counter()
        if llama_cpp.llama_decode(self.ctx, b) != 0:
            raise SystemExit("llama_decode failed")
        return (time.perf_counter() - start) * 1000

    def fill(self, position: int) -> None:
        """Every sequence holds `position` tokens (not timed)."""
        llama_cpp.llama_memory_clear(self.mem, True)
        for seq in range(self.slots if self.pool else 1):  # in a pool, cells of their own
            for start in range(0, position, UBATCH):
                n = min(UBATCH, position - start)
                self._decode([(100 + (start + i) % 50, start + i, seq, False) for i in range(n)])
        if not self.pool:
            for seq in range(1, SLOTS):
                llama_cpp.llama_memory_seq_cp(self.mem, 0, seq, -1, -1)

    def step_ms(self, shape: tuple[int, int, bool], position: int) -> float:
        """One step of `shape` at `position`, undone after (median of 3)."""
        n_seqs, per, logits = shape
        items = [(200 + i, position + i, seq, logits) for seq in range(n_seqs) for i in range(per)]
        times = []
        for _ in range(4):
            for seq in range(n_seqs):
                llama_cpp.llama_memory_seq_rm(self.mem, seq, position, -1)
            times.append(self._decode(items))
        return statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--positions", default="50,100,180,350,700")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pool", action="store_true", help="one KV pool of 8 sequences (8192 cells)")
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args()
    load = round(wait_for_quiet(), 2)
    init_llama()
    path = str(resolve("smollm2-135m-instruct").path)
    model = llama_cpp.llama_model_load_from_file(path.encode(), llama_cpp.llama_model_default_params())
    contexts = {name: Context(model, mode, args.threads, args.pool) for name, mode in MODES.items()}
    shapes = [shape for shape in SHAPES if shape[0] <= contexts["on"].slots]
    positions = [int(p) for p in args.positions.split(",")]
    ms: dict[str, list[float]] = {}
    for round_ in range(args.rounds):
        for position in positions:
            names = list(contexts) if round_ % 2 == 0 else list(contexts)[::-1]
            for name in names:
                contexts[name].fill(position)
                for shape in shapes:
                    key = f"{name}|{position}|{shape[0]}x{shape[1]}"
                    ms.setdefault(key, []).append(contexts[name].step_ms(shape, position))
    rows = []
    print(f"load before {load}; ms a token, flash attention on / off")
    for position in positions:
        for n_seqs, per, logits in shapes:
            shape = f"{n_seqs}x{per}"
            on, off = (statistics.median(ms[f"{name}|{position}|{shape}"]) / (n_seqs * per) for name in MODES)
            rows.append({"position": position, "shape": shape, "logits": logits, "on_ms": on, "off_ms": off})
            print(f"  @{position:4} {shape:5} {on:6.2f} / {off:6.2f}   on/off {on / off:4.2f}")
    if args.json:
        report = {
            "kind": "flash-attn",
            "cpu": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
            "threads": args.threads,
            "kv": "one pool of 8 sequences, 8192 cells" if args.pool else "a stream of 1024 cells per sequence, 16",
            "cores": os.cpu_count(),
            "load_before": load,
            "rounds": args.rounds,
            "rows": rows,
        }
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
