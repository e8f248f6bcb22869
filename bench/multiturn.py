"""Conversations, the load a chat server sees most: localserve against
llama-server, both up at once, runs alternating.

    .venv/bin/python bench/multiturn.py --json bench/results/multiturn.json

Each run: `--conversations` chats at once, each `--turns` turns long; the
first user message holds a ~`--document-words` word document and a
question, each later turn one more question; every answer is exactly
`--answer-tokens` tokens (`ignore_eos`) and goes back into the history, as
a chat client does. A later turn's prompt starts with the whole earlier
conversation, so a server that keeps it cached answers sooner. Reported per
run: TTFT p50 of the first turns and of the later turns, and the run's wall
time. Pairs alternate the order (A B, B A, ...); each pair uses new
documents, and every pair waits for a 1-minute load below 0.5.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.compare_servers import (  # noqa: E402
    LLAMA_SERVER,
    MODEL_ID,
    start_peers,
    wait_for_quiet,
)
from bench.paired import git_describe, now  # noqa: E402
from localserve.bench.workload import WORDS, synthetic_prompt  # noqa: E402

QUESTIONS = (
    "Summarize the document in one sentence.",
    "Which three words appear most often?",
    "Write a title for it.",
    "What would a reader ask next?",
    "Rewrite the first line as a question.",
    "Name one thing the document does not say.",
)


async def turn(
    session: aiohttp.ClientSession, url: str, messages: list[dict[str, str]], answer_tokens: int
) -> tuple[float, float, str]:
    """One streamed chat turn: its time to first token, its whole time and the answer's text."""
    body = {
        "model": MODEL_ID,
        "messages": messages,
        "max_tokens": answer_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
    }
    sent = time.perf_counter()
    first = 0.0
    parts: list[str] = []
    async with session.post(url + "/v1/chat/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"{url}: HTTP {response.status}: {(await response.text())[:200]}")
        async for line in response.content:
            if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                continue
            chunk = json.loads(line[5:])
            text = ((chunk.get("choices") or [{}])[0].get("delta") or {}).get("content") or ""
            if text:
                parts.append(text)
                first = first or time.perf_counter()
    return first - sent, time.perf_counter() - sent, "".join(parts)


async def conversation(
    session: aiohttp.ClientSession, url: str, seed: int, args: argparse.Namespace
) -> list[tuple[float, float]]:
    """Each turn's (time to first token, whole time)."""
    rng = random.Random(seed)
    document = synthetic_prompt(args.document_words, seed)
    messages = [{"role": "user", "content": f"Document: {document}\n\n{rng.choice(QUESTIONS)}"}]
    ttfts = []
    for index in range(args.turns):
        ttft, whole, answer = await turn(session, url, messages, args.answer_tokens)
        ttfts.append((ttft, whole))
        messages.append({"role": "assistant", "content": answer})
        messages.append({"role": "user", "content": f"{rng.choice(QUESTIONS)} ({rng.choice(WORDS)} {index})"})
    return ttfts


async def run(url: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        started = time.perf_counter()
        chats = await asyncio.gather(
            *(conversation(session, url, seed * 100 + c, args) for c in range(args.conversations))
        )
        wall = time.perf_counter() - started
    first = [c[0][0] for c in chats]
    later = [t[0] for c in chats for t in c[1:]]
    return {
        "wall_s": round(wall, 3),
        "first_turn_ttft_p50_ms": round(statistics.median(first) * 1e3, 1),
        "later_turn_ttft_p50_ms": round(statistics.median(later) * 1e3, 1),
        # Where the wall time goes: per turn, the medians over conversations
        # of the time to first token and of the answer's decode after it.
        "turn_ttft_p50_ms": [round(statistics.median(c[i][0] for c in chats) * 1e3, 1) for i in range(args.turns)],
        "turn_decode_p50_ms": [
            round(statistics.median(c[i][1] - c[i][0] for c in chats) * 1e3, 1) for i in range(args.turns)
        ],
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--conversations", type=int, default=8, help="conversations at once (default: 8)")
    add("--turns", type=int, default=4, help="turns per conversation (default: 4)")
    add("--document-words", type=int, default=300, help="words of the opening document (default: 300)")
    add("--answer-tokens", type=int, default=48, help="tokens of every answer (default: 48)")
    add("--pairs", type=int, default=2, help="pairs of runs, each with new documents (default: 2)")
    add("--threads", type=int, default=2, help="threads of both servers (default: 2)")
    add("--parallel", type=int, default=16, help="slots of both servers (default: 16)")
    add("--ctx-size", type=int, default=1024, help="context per slot (default: 1024)")
    add("--llama-server", type=Path, default=LLAMA_SERVER, help=f"llama-server binary (default: {LLAMA_SERVER})")
    add("--max-wait-quiet", type=float, default=420.0, help="seconds to wait for a load below 0.5 (default: 420)")
    add("--json", type=Path, default=None, help="write the result here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from localserve.models.registry import resolve

    model_path = str(resolve(MODEL_ID).path)
    pairs: list[dict[str, Any]] = []
    with ExitStack() as stack:
        urls = start_peers(stack, args, model_path, "multiturn")
        names = list(urls)
        for pair in range(args.pairs):
            load = wait_for_quiet(args.max_wait_quiet)
            order = names if pair % 2 == 0 else names[::-1]
            result: dict[str, Any] = {"loadavg_before": round(load, 2), "first": order[0]}
            for name in order:
                result[name] = asyncio.run(run(urls[name], 1 + pair, args))
            ls, ll = result["localserve"], result["llama-server"]
            result["later_ttft_ratio"] = round(ll["later_turn_ttft_p50_ms"] / ls["later_turn_ttft_p50_ms"], 3)
            result["wall_ratio"] = round(ll["wall_s"] / ls["wall_s"], 3)
            print(f"pair {pair + 1} (load {load:.2f}): {json.dumps(result)}", flush=True)
            pairs.append(result)
    out = {
        "kind": "multiturn",
        "commit": git_describe(ROOT),
        "started": now(),
        "settings": vars(args) | {"json": str(args.json), "llama_server": str(args.llama_server)},
        "pairs": pairs,
        "later_ttft_ratio_median": statistics.median(p["later_ttft_ratio"] for p in pairs),
        "wall_ratio_median": statistics.median(p["wall_ratio"] for p in pairs),
    }
    print(
        f"later-turn TTFT: llama-server / localserve {out['later_ttft_ratio_median']:.2f}x; "
        f"wall time: {out['wall_ratio_median']:.2f}x"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
