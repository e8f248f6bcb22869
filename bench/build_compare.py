"""Two llama-cpp-python builds side by side: raw `llama_decode` throughput.

Each wheel is unpacked once; every run is a child process with that build
first on its PYTHONPATH, decoding with `engine_bench.raw_decode_tps` (the
same model, threads, prompt and output lengths). Runs alternate A, B, A, B
so that the machine's drift falls on both, and each waits for a 1-minute
load average below 0.5. Used for issue 28: native without AMX (what
`make install` keeps) against portable (`-DGGML_NATIVE=OFF`).

    python bench/build_compare.py --a native-no-amx=WHEEL --b portable=WHEEL --sizes 1,16 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.compare_servers import wait_for_quiet  # noqa: E402

CHILD = """
import json, sys
sys.path.insert(0, {root!r})
from bench.engine_bench import raw_decode_tps
from localserve.models.registry import resolve
import llama_cpp
path = str(resolve("smollm2-135m-instruct").path)
print(json.dumps({{"tok_s": raw_decode_tps(path, {n}, 128, 128, {threads}), "lib": llama_cpp.__file__}}))
"""


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def run(unpacked: str, n: int, threads: int) -> float:
    env = dict(os.environ, PYTHONPATH=unpacked, LOCALSERVE_LLAMA_CHECK="0")
    code = CHILD.format(root=str(ROOT), n=n, threads=threads)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["lib"].startswith(unpacked), result["lib"]  # the build under test, not the installed one
    return float(result["tok_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", required=True, help="NAME=WHEEL")
    parser.add_argument("--b", required=True, help="NAME=WHEEL")
    parser.add_argument("--sizes", default="1,16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "build-compare.json")
    args = parser.parse_args()
    builds = dict(spec.split("=", 1) for spec in (args.a, args.b))
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {}
        for name, wheel in builds.items():
            dirs[name] = str(Path(tmp) / name)
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(dirs[name])
        results: dict[str, dict[str, list[float]]] = {n: {s: [] for s in args.sizes.split(",")} for n in builds}
        loads = []
        for repeat in range(args.repeats):
            for size in args.sizes.split(","):
                for name in list(builds) if repeat % 2 == 0 else list(builds)[::-1]:
                    loads.append(round(wait_for_quiet(), 2))
                    tok_s = run(dirs[name], int(size), args.threads)
                    results[name][size].append(tok_s)
                    print(f"repeat {repeat + 1} {name} {size} seqs: {tok_s:.1f} tok/s (load {loads[-1]})", flush=True)
    a, b = list(builds)
    summary = {
        size: {
            a: round(statistics.median(results[a][size]), 1),
            b: round(statistics.median(results[b][size]), 1),
            "ratio": round(statistics.median(results[a][size]) / statistics.median(results[b][size]), 3),
        }
        for size in args.sizes.split(",")
    }
    report = {"cpu": cpu_name(), "threads": args.threads, "loads": loads, "runs": results, "summary": summary}
    args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
