"""ONNX Runtime embeddings: graph variants and session settings, A/B on the
shapes the one-shot queue hands the backend.

Each configuration runs in its own process (a session's spinning threads
would otherwise steal the next session's cores), in alternating order round
after round; the table gives each one's median items/s and the median of its
per-round ratio to the first configuration, with the 1-minute load average
before each round. A configuration is GRAPH or GRAPH@SETTINGS, GRAPH one of
bert_onnx's variants (plain, fused, int8) or a path to an .onnx file, SETTINGS
`+`-joined of spin:0|1, stop:0|1 (session.force_spinning_stop), arena:0|1,
mem_pattern:0|1, threads:N.

    .venv/bin/python bench/onnx_settings.py --configs fused,fused@spin:0,fused@arena:0,fused@mem_pattern:0
    .venv/bin/python bench/onnx_settings.py --configs fused,plain,int8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CHILD = r"""
import json, sys, time
import numpy as np, onnxruntime as ort
path, shapes, settings, threads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
options = ort.SessionOptions()
options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
for item in filter(None, settings.split("+")):
    key, value = item.split(":")
    if key == "spin":
        options.add_session_config_entry("session.intra_op.allow_spinning", value)
    elif key == "arena":
        options.enable_cpu_mem_arena = value == "1"
    elif key == "mem_pattern":
        options.enable_mem_pattern = value == "1"
    elif key == "threads":
        options.intra_op_num_threads = int(value)
    elif key == "stop":
        options.add_session_config_entry("session.force_spinning_stop", value)
session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
names = {i.name for i in session.get_inputs()}
rng, rates = np.random.default_rng(0), {}
for shape in shapes.split(","):
    rows, tokens = map(int, shape.split("x"))
    ids = rng.integers(1000, 30000, size=(rows, tokens))
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    feeds = {k: v.astype(np.int64) for k, v in feeds.items() if k in names}
    session.run(None, feeds)
    runs = max(3, 4000 // (rows * tokens))
    started = time.perf_counter()
    for _ in range(runs):
        session.run(None, feeds)
    rates[shape] = runs * rows / (time.perf_counter() - started)
print(json.dumps(rates))
"""


def graph_path(graph: str) -> str:
    """A bert_onnx variant of all-MiniLM-L6-v2 (built into the store on first use), or a path."""
    if graph.endswith(".onnx"):
        return graph
    from localserve.models.convert.bert_onnx import cached_onnx
    from localserve.models.registry import resolve

    return str(cached_onnx(resolve("all-minilm-l6-v2").path, "all-minilm-l6-v2", variant=graph))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="fused,fused@spin:0,fused@arena:0,fused@mem_pattern:0")
    parser.add_argument("--shapes", default="1x15,8x15,32x15,1x200,8x200", help="ROWSxTOKENS, comma-separated")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--json", type=Path, help="write every round's rates and loads to this file")
    args = parser.parse_args()
    os.environ.setdefault("LOCALSERVE_HOME", tempfile.mkdtemp(prefix="localserve-bench-"))
    configs = args.configs.split(",")
    paths = {c: graph_path(c.partition("@")[0]) for c in configs}
    rates: dict[str, list[dict[str, float]]] = {c: [] for c in configs}
    loads = []
    for r in range(args.rounds):
        loads.append(os.getloadavg()[0])
        for config in configs[r % len(configs) :] + configs[: r % len(configs)]:
            argv = [
                sys.executable,
                "-c",
                CHILD,
                paths[config],
                args.shapes,
                config.partition("@")[2],
                str(args.threads),
            ]
            out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
            rates[config].append(json.loads(out.strip().splitlines()[-1]))
    base = configs[0]
    print(f"load average before each round: {', '.join(f'{x:.2f}' for x in loads)}")
    print("| shape | " + " | ".join(configs) + " |")
    print("|---|" + "---:|" * len(configs))
    for shape in args.shapes.split(","):
        cells = []
        for config in configs:
            median = statistics.median(r[shape] for r in rates[config])
            ratio = statistics.median(a[shape] / b[shape] for a, b in zip(rates[config], rates[base], strict=True))
            cells.append(f"{median:.0f}/s" + ("" if config == base else f" ({ratio:.2f}x)"))
        print(f"| {shape} | " + " | ".join(cells) + " |")
    if args.json:
        args.json.write_text(json.dumps({"configs": configs, "loads": loads, "rates": rates}, indent=1))


if __name__ == "__main__":
    main()
