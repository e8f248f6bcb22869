"""Speculative decoding, side by side: localserve with and without it against
llama-server (the same llama.cpp, built by `compare.py --build-llama-server`)
without speculation and with each of its n-gram types.

Workloads (SmolLM2-135M-Instruct Q4_1, temperature 0 for edit, 0.7 for chat):

* edit  a ~480-token Python file in the prompt, "rename one function and
        return the whole file", the answer started inside a code block
        (/v1/completions, the model's ChatML): ~320 tokens out, copied mostly
        from the prompt (what prompt-lookup drafts suit).
* chat  32-word questions, 128 tokens each: little to copy (the adaptive
        rule must keep speculation from costing anything).

Paired runs: every server is up at once; in each pair, every server runs the
cell once, in an order that rotates from pair to pair, so drift of the
machine's speed (±30% over minutes here) falls on all alike. A cell's figure
for a server is generated tokens / wall time of the cell; the table gives the
median over pairs of the per-pair ratio against each reference, with the
spread (min..max). Every cell starts after the 1-minute load average is below
0.5; the load before each pair is recorded.

    python bench/spec_bench.py --pairs 5 --out bench/results/spec.json
    python bench/spec_bench.py --cells edit:1 --servers localserve-ngram,llama-server --pairs 3   # a smaller run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.compare_servers import LLAMA_SERVER, MODEL_ID, RunningServer, ServerSpec, free_port, wait_for_quiet  # noqa: E402

LLAMA_SPEC_TYPES = ("ngram-simple", "ngram-map-k", "ngram-mod", "ngram-cache")

EDIT_SOURCE = """import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Item:
    name: str
    price: float
    quantity: int = 1
    tags: list[str] = field(default_factory=list)


def load_items(path: Path) -> list[Item]:
    records = json.loads(path.read_text())
    items = []
    for record in records:
        item = Item(record["name"], float(record["price"]), int(record.get("quantity", 1)))
        item.tags = list(record.get("tags", []))
        items.append(item)
    return items


def compute_total(items: list[Item], tax_rate: float) -> float:
    subtotal = 0.0
    for item in items:
        subtotal += item.price * item.quantity
    tax = subtotal * tax_rate
    return subtotal + tax


def cheapest(items: list[Item]) -> Item | None:
    best = None
    for item in items:
        if best is None or item.price < best.price:
            best = item
    return best


def by_tag(items: list[Item], tag: str) -> list[Item]:
    selected = []
    for item in items:
        if tag in item.tags:
            selected.append(item)
    return selected


def format_receipt(items: list[Item], tax_rate: float) -> str:
    lines = []
    for item in items:
        lines.append(f"{item.name}: {item.quantity} x {item.price:.2f}")
    total = compute_total(items, tax_rate)
    lines.append(f"Total: {total:.2f}")
    return "\\n".join(lines)


def main() -> None:
    items = load_items(Path("items.json"))
    print(format_receipt(items, 0.2))
    print(cheapest(items))


if __name__ == "__main__":
    main()
"""
# A raw ChatML prompt whose answer opens the code block (/v1/completions): asked in a chat message,
# SmolLM2-135M mostly describes the file instead of returning it; started inside the block, it copies it.
EDIT_PROMPT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nRename the function `cheapest` to `lowest_price` in this file and return the whole file:"
    f"\n\n```python\n{EDIT_SOURCE}```<|im_end|>\n<|im_start|>assistant\n```python\n"
)
CHAT_TOPICS = [
    "the history of the bicycle",
    "how bees make honey",
    "why the sky is blue",
    "the rules of chess",
    "how a refrigerator works",
    "the water cycle",
    "how to bake bread",
    "the life of a star",
    "what makes a good team",
    "how vaccines work",
    "the origin of the moon",
    "how trains run on time",
    "why cats purr",
    "how to plant a tree",
    "the invention of paper",
    "how rainbows form",
]


def chat_prompt(index: int) -> str:
    topic = CHAT_TOPICS[index % len(CHAT_TOPICS)]
    return (
        f"Please explain {topic} to a curious student in a few clear paragraphs, with one simple example, "
        "one surprising fact, and a short summary at the end that is easy to remember."
    )


# ---- servers -----------------------------------------------------------------------------------


def specs(args: argparse.Namespace, model_path: str, ports: dict[str, int]) -> dict[str, ServerSpec]:
    t, p, ctx = args.threads, args.parallel, args.ctx_size
    py = sys.executable
    out: dict[str, ServerSpec] = {}
    for mode in ("off", "ngram"):
        argv = f"-m localserve serve --model {MODEL_ID} --threads {t} --parallel {p} --ctx-size {ctx}"
        argv += f" --speculative {mode} --draft-max {args.draft_max}"
        out[f"localserve-{mode}"] = ServerSpec(f"localserve-{mode}", [py, *argv.split()], "/health")
    base = f"--host 127.0.0.1 -t {t} -tb {t} -np {p} -c {p * ctx} --cont-batching -a {MODEL_ID}"
    out["llama-server"] = ServerSpec(
        "llama-server", [str(args.llama_server), "-m", model_path, *base.split()], "/health"
    )
    for kind in LLAMA_SPEC_TYPES:
        extra = ["--spec-type", kind]  # its own draft lengths (this llama-server has no --draft-max)
        argv = [str(args.llama_server), "-m", model_path, *base.split(), *extra]
        out[f"llama-server-{kind}"] = ServerSpec(f"llama-server-{kind}", argv, "/health")
    for name, spec in out.items():
        spec.argv.extend(["--port", str(ports[name])])
    return out


# ---- one cell ----------------------------------------------------------------------------------


async def run_cell(url: str, workload: str, streams: int) -> dict[str, float]:
    """Every stream sends its requests one after another; tokens and seconds of the whole cell."""
    per_stream = 1 if workload == "edit" else 2
    body: dict[str, Any] = {"model": MODEL_ID, "stream": False}
    if workload == "edit":
        body |= {"max_tokens": 700, "temperature": 0.0, "stop": ["```"]}
    else:
        body |= {"max_tokens": 128, "temperature": 0.7, "seed": 1}
    timeout = aiohttp.ClientTimeout(total=900)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def stream(index: int) -> int:
            tokens = 0
            for r in range(per_stream):
                if workload == "edit":
                    path, payload = "/v1/completions", body | {"prompt": EDIT_PROMPT}
                else:
                    text = chat_prompt(index * per_stream + r)
                    path, payload = "/v1/chat/completions", body | {"messages": [{"role": "user", "content": text}]}
                async with session.post(f"{url}{path}", json=payload) as response:
                    data = await response.json()
                    if response.status != 200:
                        raise RuntimeError(f"{url}: {response.status} {data}")
                    tokens += int(data["usage"]["completion_tokens"])
            return tokens

        started = time.perf_counter()
        counts = await asyncio.gather(*(stream(i) for i in range(streams)))
        seconds = time.perf_counter() - started
    return {"tokens": sum(counts), "seconds": seconds, "tok_s": sum(counts) / seconds}


def summarize(runs: list[dict[str, Any]], cell: str, subject: str, references: list[str]) -> dict[str, Any]:
    pairs = [r for r in runs if r["cell"] == cell]
    out: dict[str, Any] = {}
    for name in {subject, *references}:
        values = [p["results"][name]["tok_s"] for p in pairs if name in p["results"]]
        if values:
            out[name] = {"tok_s_median": round(statistics.median(values), 1)}
    for ref in references:
        ratios = [
            p["results"][subject]["tok_s"] / p["results"][ref]["tok_s"]
            for p in pairs
            if subject in p["results"] and ref in p["results"]
        ]
        if ratios:
            out[f"{subject} / {ref}"] = {
                "median": round(statistics.median(ratios), 3),
                "min": round(min(ratios), 3),
                "max": round(max(ratios), 3),
                "pairs": len(ratios),
            }
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", default="edit:1,edit:4,edit:16,chat:1,chat:8,chat:16")
    parser.add_argument("--servers", default="", help="comma list (default: all, see --help of the module)")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--parallel", type=int, default=16)
    parser.add_argument("--ctx-size", type=int, default=2048)
    parser.add_argument("--draft-max", type=int, default=8)
    parser.add_argument("--llama-server", type=Path, default=LLAMA_SERVER)
    parser.add_argument("--no-quiet-wait", action="store_true", help="do not wait for a load average below 0.5")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "spec.json")
    args = parser.parse_args(argv)

    from localserve.models.registry import resolve

    model_path = str(resolve(MODEL_ID).path)
    names = [n for n in args.servers.split(",") if n] or None
    ports: dict[str, int] = {}
    all_specs = specs(args, model_path, ports := {n: free_port() for n in _all_names()})
    chosen = {n: s for n, s in all_specs.items() if names is None or n in names}
    cells = [(c.split(":")[0], int(c.split(":")[1])) for c in args.cells.split(",")]
    log_dir = ROOT / "bench" / "results" / "runs" / "spec"
    runs: list[dict[str, Any]] = []
    servers = [RunningServer(spec, ports[n], log_dir / f"{n}.log", {}) for n, spec in chosen.items()]
    for server in servers:
        server.__enter__()
    try:
        for workload, streams in cells:
            cell = f"{workload}:{streams}"
            # llama-server's n-gram types are peers for the edit workload at 1 and 4 streams.
            speculating_peers = workload == "edit" and streams <= 4
            members = [s for s in servers if speculating_peers or not s.spec.name.startswith("llama-server-")]
            load = os.getloadavg()[0] if args.no_quiet_wait else wait_for_quiet()  # the cell starts quiet
            for pair in range(args.pairs):
                load = os.getloadavg()[0] if pair else load
                order = members[pair % len(members) :] + members[: pair % len(members)]
                results = {}
                for server in order:
                    results[server.spec.name] = asyncio.run(run_cell(server.url, workload, streams))
                    time.sleep(1.0)  # let the last server's threads go idle
                runs.append({"cell": cell, "pair": pair, "load_before": round(load, 2), "results": results})
                line = "  ".join(f"{n} {r['tok_s']:.1f}" for n, r in results.items())
                print(f"{cell} pair {pair + 1}/{args.pairs} (load {load:.2f}): {line}", flush=True)
    finally:
        for server in servers:
            server.__exit__()
    summary = {}
    for workload, streams in cells:
        cell = f"{workload}:{streams}"
        present = {n for r in runs if r["cell"] == cell for n in r["results"]}
        refs = [
            n
            for n in ("localserve-off", "llama-server", *(f"llama-server-{k}" for k in LLAMA_SPEC_TYPES))
            if n in present
        ]
        summary[cell] = summarize(runs, cell, "localserve-ngram", refs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "args": vars(args) | {"out": str(args.out), "llama_server": str(args.llama_server)},
                "summary": summary,
                "runs": runs,
            },
            indent=1,
        )
    )
    print(json.dumps(summary, indent=1))


def _all_names() -> list[str]:
    return ["localserve-off", "localserve-ngram", "llama-server", *(f"llama-server-{k}" for k in LLAMA_SPEC_TYPES)]


if __name__ == "__main__":
    main()
