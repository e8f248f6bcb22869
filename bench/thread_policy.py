"""llama.cpp's thread wait policy, measured on both workloads it affects.

llama.cpp (built with OpenMP) meets its threads at a barrier after every
operation of the graph: hundreds of times per decode step. How a thread waits
there is libgomp's wait policy: spin (fast, but a spinning thread holds a
core the event loop and other models need) or sleep (every barrier pays a
futex wake-up). This bench starts one server per policy, interleaved over
repeats, and measures:

* chat decode: exactly N tokens per request (`ignore_eos`), closed loop at
  1, 8 and 16 streams: output tok/s and inter-token latency p50;
* embeddings alone, then embeddings while 4 chat streams decode: items/s
  (the workload that passive waiting was once chosen for).

Every run starts only on a quiet machine (1-minute load average below 0.5).

    python bench/thread_policy.py --policies passive,default,spin:20000 --repeats 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.compare_servers import RunningServer, ServerSpec, free_port, wait_for_quiet  # noqa: E402

CHAT_MODEL = "smollm2-135m-instruct"
WORDS = [
    "river",
    "stone",
    "light",
    "paper",
    "garden",
    "window",
    "silver",
    "music",
    "winter",
    "table",
    "orange",
    "bridge",
    "cloud",
    "forest",
]


def policy_env(policy: str) -> dict[str, str]:
    """`passive`, `active`, `default` (libgomp's: spin a while, then sleep) or
    `spin:N` (OMP_WAIT_POLICY unset, GOMP_SPINCOUNT=N). LOCALSERVE_THREAD_WAIT
    carries it to the server, which applies it before llama.cpp loads."""
    return {"LOCALSERVE_THREAD_WAIT": policy}


def prompt(rng: random.Random, num_words: int) -> str:
    return "Write about " + " ".join(rng.choice(WORDS) for _ in range(num_words))


async def chat_stream(session: aiohttp.ClientSession, url: str, text: str, max_tokens: int) -> tuple[int, list[float]]:
    body = {
        "model": CHAT_MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "temperature": 0,
    }
    times: list[float] = []
    async with session.post(url + "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.content:
            if line.startswith(b"data:") and b"[DONE]" not in line:
                chunk = json.loads(line[5:])
                if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    times.append(time.perf_counter())
    return len(times), times


async def chat_level(url: str, streams: int, requests: int, max_tokens: int, words: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    texts = [prompt(rng, words) for _ in range(requests)]
    itls: list[float] = []
    num_tokens = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        queue = list(texts)

        async def worker() -> None:
            nonlocal num_tokens
            while queue:
                n, times = await chat_stream(session, url, queue.pop(), max_tokens)
                num_tokens += n
                itls.extend(b - a for a, b in zip(times, times[1:], strict=False))

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(streams)))
        elapsed = time.perf_counter() - started
    return {
        "streams": streams,
        "tok_s": round(num_tokens / elapsed, 1),
        "itl_p50_ms": round(statistics.median(itls) * 1e3, 1) if itls else None,
    }


async def embed_for(session: aiohttp.ClientSession, url: str, model: str, clients: int, seconds: float) -> float:
    rng = random.Random(7)
    count = 0
    deadline = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal count
        while time.perf_counter() < deadline:
            body = {"model": model, "input": prompt(rng, 40)}
            async with session.post(url + "/v1/embeddings", json=body) as response:
                response.raise_for_status()
                await response.read()
            count += 1

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return round(count / (time.perf_counter() - started), 1)


async def embeddings(url: str, model: str, clients: int, seconds: float, chat_streams: int) -> dict[str, Any]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        await embed_for(session, url, model, 1, 1.0)  # warm-up: loads the model
        alone = await embed_for(session, url, model, clients, seconds)
        stop = asyncio.Event()
        chat_tokens = 0

        async def chatter(i: int) -> None:
            nonlocal chat_tokens
            rng = random.Random(100 + i)
            while not stop.is_set():
                n, _ = await chat_stream(session, url, prompt(rng, 32), 64)
                chat_tokens += n

        chats = [asyncio.create_task(chatter(i)) for i in range(chat_streams)]
        await asyncio.sleep(2.0)
        started, tokens_before = time.perf_counter(), chat_tokens
        loaded = await embed_for(session, url, model, clients, seconds)
        chat_tok_s = (chat_tokens - tokens_before) / (time.perf_counter() - started)
        stop.set()
        await asyncio.gather(*chats)
    return {"alone_items_s": alone, "under_chat_items_s": loaded, "chat_tok_s_meanwhile": round(chat_tok_s, 1)}


def rss_mib(pid: int) -> tuple[float, float]:
    """(current, peak) resident memory of `pid` in MiB, after the chat levels."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return tuple(round(int(fields[k].split()[0]) / 1024, 1) for k in ("VmRSS", "VmHWM"))  # type: ignore[return-value]


def run_one(args: argparse.Namespace, policy: str, repeat: int) -> dict[str, Any]:
    load = wait_for_quiet(args.max_wait_quiet)
    port = free_port()
    argv = [sys.executable, "-m", "localserve", "serve", "--port", str(port), "--model", CHAT_MODEL]
    argv += ["--threads", str(args.threads), "--parallel", str(args.parallel), "--ctx-size", str(args.ctx_size)]
    argv += args.serve_args
    env = {**policy_env(policy), **args.env}
    log_path = Path.home() / ".cache" / "localserve-bench" / "logs" / f"thread-policy-{policy}-r{repeat}.log"
    result: dict[str, Any] = {"policy": policy, "repeat": repeat, "loadavg_before": round(load, 2)}
    with RunningServer(ServerSpec("localserve", argv, "/health"), port, log_path, env) as server:
        url = server.url
        asyncio.run(chat_level(url, 1, 1, 16, 8, 0))  # warm-up
        result["chat"] = [
            asyncio.run(chat_level(url, c, args.requests_per_stream * c, args.output_tokens, args.prompt_words, c))
            for c in args.streams
        ]
        result["rss_mib"], result["peak_rss_mib"] = rss_mib(server.process.pid if server.process else 0)
        if args.embed_model:
            result["embeddings"] = asyncio.run(
                embeddings(url, args.embed_model, args.embed_clients, args.embed_seconds, args.chat_streams)
            )
    print(json.dumps(result), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--policies", default="passive,default", help="comma-separated: passive, active, default, spin:N")
    add("--repeats", type=int, default=2)
    add("--threads", type=int, default=2)
    add("--parallel", type=int, default=16)
    add("--ctx-size", type=int, default=1024)
    add("--streams", default="1,8,16", help="closed-loop chat levels (default: 1,8,16)")
    add("--requests-per-stream", type=int, default=4)
    add("--output-tokens", type=int, default=128)
    add("--prompt-words", type=int, default=32)
    add("--embed-model", default="all-minilm-l6-v2", help="embeddings model id ('' to skip)")
    add("--embed-clients", type=int, default=8)
    add("--embed-seconds", type=float, default=10.0)
    add("--chat-streams", type=int, default=4, help="chat streams beside the embeddings (default: 4)")
    add("--serve-arg", dest="serve_args", action="append", default=[], help="extra `serve` argument (repeatable)")
    add("--env", action="append", default=[], metavar="KEY=VALUE", help="server environment (repeatable)")
    add("--max-wait-quiet", type=float, default=420.0)
    add("--out", type=Path, default=ROOT / "bench" / "results" / "thread-policy.jsonl")
    args = parser.parse_args()
    args.streams = [int(s) for s in args.streams.split(",")]
    args.env = dict(item.split("=", 1) for item in args.env)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    results = []
    for repeat in range(args.repeats):
        for policy in policies:
            results.append(run_one(args, policy, repeat))
            with args.out.open("a") as out:
                out.write(json.dumps({**results[-1], "time": time.strftime("%Y-%m-%d %H:%M:%S")}) + "\n")
    print(
        "\npolicy        "
        + "  ".join(f"{c:>2} streams tok/s (ITL ms)" for c in args.streams)
        + "  embed alone / under chat"
    )
    for policy in policies:
        rows = [r for r in results if r["policy"] == policy]
        cells = []
        for i, _c in enumerate(args.streams):
            tok = statistics.median(r["chat"][i]["tok_s"] for r in rows)
            itl = statistics.median(r["chat"][i]["itl_p50_ms"] for r in rows)
            cells.append(f"{tok:>10.1f} ({itl:5.1f})        ")
        emb = ""
        if args.embed_model:
            alone = statistics.median(r["embeddings"]["alone_items_s"] for r in rows)
            under = statistics.median(r["embeddings"]["under_chat_items_s"] for r in rows)
            emb = f"{alone:.1f} / {under:.1f}"
        print(f"{policy:<14}" + "  ".join(cells) + emb)
    print(f"RSS MiB after the chat levels: {[(r['policy'], r['rss_mib']) for r in results]}")
    print(f"load average before each run: {[r['loadavg_before'] for r in results]}")


if __name__ == "__main__":
    main()
