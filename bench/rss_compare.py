"""Memory of `localserve serve` with no flags against llama-server at its own
defaults, for the same GGUF file (issue 18: at most 1.2x).

Each server starts alone on a quiet machine (1-minute load average below
0.5, recorded), answers one short chat request, and its resident memory is
read from /proc/PID/smaps_rollup: RSS, and how much of it is anonymous
(heap, KV cache, compute buffers) and file-backed (the mapped weights and
libraries). Repeats alternate the servers; the report gives medians.

    python bench/rss_compare.py [--repeats 2] [--json bench/results/rss.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.compare_servers import (  # noqa: E402
    LLAMA_SERVER,
    MODEL_ID,
    RunningServer,
    ServerSpec,
    free_port,
    wait_for_quiet,
)
from localserve.models.registry import resolve  # noqa: E402

FIELDS = {"Rss": "rss_mb", "Anonymous": "anon_mb", "Pss_File": "file_mb"}


def specs(port: int, model_path: str, llama_server: Path) -> dict[str, ServerSpec]:
    """Both servers with no sizing flags: each picks its own default context and slots."""
    return {
        "localserve": ServerSpec(
            "localserve", [sys.executable, "-m", "localserve", "serve", "--port", str(port)], "/health"
        ),
        "llama-server": ServerSpec(
            "llama-server", [str(llama_server), "-m", model_path, "--host", "127.0.0.1", "--port", str(port)], "/health"
        ),
    }


def chat_once(url: str) -> None:
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "Say hi in five words."}], "max_tokens": 16}
    request = urllib.request.Request(
        url + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        response.read()


def memory(pid: int) -> dict[str, float]:
    """RSS, anonymous and file-backed resident memory of `pid`, in MiB."""
    found = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in FIELDS:
            found[FIELDS[name]] = round(int(rest.split()[0]) / 1024, 1)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--llama-server", type=Path, default=LLAMA_SERVER)
    parser.add_argument("--max-wait-quiet", type=float, default=420.0)
    parser.add_argument("--json", type=Path, help="also write the runs and medians here")
    args = parser.parse_args()
    if not args.llama_server.is_file():
        parser.error(f"{args.llama_server} not found; build it with `python bench/compare.py --build-llama-server`")
    model_path = str(resolve(MODEL_ID).path)
    runs: dict[str, list[dict[str, float]]] = {"localserve": [], "llama-server": []}
    with tempfile.TemporaryDirectory(prefix="localserve-rss-") as home:
        env = {"LOCALSERVE_HOME": home}
        for repeat in range(args.repeats):
            for name in runs:
                load = wait_for_quiet(args.max_wait_quiet)
                port = free_port()
                spec = specs(port, model_path, args.llama_server)[name]
                with RunningServer(spec, port, Path(home) / f"{name}-{repeat}.log", env) as server:
                    chat_once(server.url)
                    assert server.process is not None
                    runs[name].append({**memory(server.process.pid), "load_before": round(load, 2)})
                print(f"[{repeat + 1}/{args.repeats}] {name}: {runs[name][-1]}", file=sys.stderr, flush=True)
    medians = {name: {k: statistics.median(r[k] for r in rs) for k in FIELDS.values()} for name, rs in runs.items()}
    ratio = medians["localserve"]["rss_mb"] / medians["llama-server"]["rss_mb"]
    print("| server | RSS MiB | anonymous MiB | file-backed MiB |\n|---|---:|---:|---:|")
    for name, m in medians.items():
        print(f"| {name} | {m['rss_mb']:.1f} | {m['anon_mb']:.1f} | {m['file_mb']:.1f} |")
    print(f"\nlocalserve / llama-server RSS: {ratio:.3f} (issue 18 bound: 1.2)")
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "medians": medians, "rss_ratio": round(ratio, 3)}, indent=1))


if __name__ == "__main__":
    main()
