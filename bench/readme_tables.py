"""The README's benchmark tables, generated from bench/results/*.json.

    .venv/bin/python bench/readme_tables.py           # rewrite the tables in README.md
    .venv/bin/python bench/readme_tables.py --check   # exit 1 if a table differs from its JSON

A table lives between `<!-- table:NAME -->` and `<!-- /table:NAME -->` in
README.md; NAME picks the renderer and the JSON below. Every table says the
commit it measured and the machine's load. Never edit a table by hand: run
the benchmark, write its JSON, run this (tests/bench/test_readme_tables.py
fails when the README and the JSON disagree).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
README = ROOT / "README.md"


def _load(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / name).read_text())


def _sampling(temperature: float) -> str:
    return "greedy" if temperature <= 0 else f"temperature {temperature:g}"


def peers_llama_server() -> str:
    """localserve / llama-server, paired (bench/peers.py)."""
    data = _load("peers-llama-server.json")
    lines = [
        "| streams | sampling | localserve tok/s | llama-server tok/s | localserve / llama-server (median, range) "
        "| ITL p50 ms (localserve / llama-server) | TTFT p50 ms | load before |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for c in data["cells"]:
        ls, ll = c["localserve"], c["llama-server"]
        lines.append(
            f"| {c['streams']} | {_sampling(c['temperature'])} | {ls['tok_s']:.1f} | {ll['tok_s']:.1f} "
            f"| **{c['ratio_median']:.2f}** ({c['ratio_min']:.2f}-{c['ratio_max']:.2f}) "
            f"| {ls['itl_p50_ms']:.1f} / {ll['itl_p50_ms']:.1f} | {ls['ttft_p50_ms']:.0f} / {ll['ttft_p50_ms']:.0f} "
            f"| {c['loadavg_before']} |"
        )
    pairs = len(data["cells"][0]["runs"]) if data["cells"] else 0
    lines.append("")
    lines.append(
        f"Commit {data['commit']}, {data['started'][:10]}; {pairs} pairs per cell, `{data['settings']}`; "
        f"{data['servers']['llama-server']}"
        + (f"; localserve's llama.cpp: {data['localserve_llama_cpp']}" if "localserve_llama_cpp" in data else "")
        + ". Source: `bench/results/peers-llama-server.json`."
    )
    return "\n".join(lines)


def multiturn() -> str:
    """Conversations against llama-server (bench/multiturn.py)."""
    data = _load("multiturn.json")
    s = data["settings"]
    lines = [
        "| pair | later-turn TTFT p50 ms (localserve / llama-server) | llama-server / localserve | "
        "answer s after the first token, later turns (localserve / llama-server) | "
        "wall s (localserve / llama-server) | llama-server / localserve | load before |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def answer_s(server: dict[str, Any]) -> str:
        later = server.get("turn_decode_p50_ms", [])[1:]  # recorded since facd1f0
        return f"{statistics.mean(later) / 1e3:.1f}" if later else "-"

    for i, p in enumerate(data["pairs"], start=1):
        ls, ll = p["localserve"], p["llama-server"]
        lines.append(
            f"| {i} | {ls['later_turn_ttft_p50_ms']:.0f} / {ll['later_turn_ttft_p50_ms']:.0f} | "
            f"**{p['later_ttft_ratio']:.2f}x** | {answer_s(ls)} / {answer_s(ll)} | "
            f"{ls['wall_s']:.1f} / {ll['wall_s']:.1f} | **{p['wall_ratio']:.2f}x** | {p['loadavg_before']} |"
        )
    lines.append("")
    lines.append(
        f"Commit {data['commit']}, {data['started'][:10]}; {s['conversations']} conversations x {s['turns']} turns, "
        f"a {s['document_words']}-word opening document, {s['answer_tokens']}-token answers. "
        "Source: `bench/results/multiturn.json`."
    )
    return "\n".join(lines)


def busy_desktop() -> str:
    """localserve (--threads auto) and llama-server with other programs on the CPU (bench/busy_desktop.py)."""
    data = _load("busy-desktop.json")
    lines = [
        "| condition | streams | localserve tok/s | llama-server tok/s | localserve / llama-server (median, range) "
        "| localserve / its quiet | threads localserve chose | load before |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    own = data.get("localserve_over_its_quiet", {})
    conditions = [(name, result, "") for name, result in data["conditions"].items()]
    later = RESULTS / "busy-desktop-bursty.json"  # a rerun of one condition at a later commit
    if later.exists():
        rerun = json.loads(later.read_text())
        conditions += [(name, result, f" at {rerun['commit']}") for name, result in rerun["conditions"].items()]
    for name, result, at in conditions:
        chosen = result.get("localserve_threads", {})
        for c in result["cells"]:
            ls, ll = c["localserve"], c["llama-server"]
            of_quiet = own.get(name, {}).get(c["label"]) if not at else None
            load = c["loadavg_before"] if c["loadavg_before"] is not None else "-"
            lines.append(
                f"| {name}{at} | {c['streams']} | {ls['tok_s']:.1f} | {ll['tok_s']:.1f} "
                f"| **{c['ratio_median']:.2f}** ({c['ratio_min']:.2f}-{c['ratio_max']:.2f}) "
                f"| {f'{of_quiet:.2f}' if of_quiet is not None else '-'} "
                f"| {chosen.get('in_use', '?')} of {chosen.get('max', '?')} | {load} |"
            )
    pairs = len(next(iter(data["conditions"].values()))["cells"][0]["runs"])
    on_s, off_s = data["burst_s"]
    lines.append("")
    lines.append(
        f"Commit {data['commit']}, {data['started'][:10]}, {data['cores']} cores, load {data['loadavg_before']} at "
        f"the start; busy: {data['busy_cores']} process(es) spinning; bursty: spinning {on_s:g} s, idle {off_s:g} s; "
        f"{pairs} pairs per cell; {data['settings']}; greedy, 128 tokens. "
        "Source: `bench/results/busy-desktop.json`"
        + (", and `busy-desktop-bursty.json` for the rows of a later commit." if later.exists() else ".")
    )
    return "\n".join(lines)


def rerank_peers() -> str:
    """localserve / infinity-emb's /rerank on one cross-encoder, paired (bench/rerank_peers.py)."""
    data = _load("rerank-peers.json")
    lines = [
        "| clients | infinity engine | localserve pairs/s | infinity pairs/s | localserve / infinity (median, range) "
        "| p50 latency ms (localserve / infinity) | load before pairs |",
        "|---:|---|---:|---:|---:|---:|---|",
    ]
    for c in data["cells"]:
        ratio = f"{c['ratio_median']:.2f}"
        lines.append(
            f"| {c['clients']} | {c['peer'].removeprefix('infinity-')}{' (fastest)' if c['fastest'] else ''} "
            f"| {c['localserve_pairs_per_s']:.1f} | {c['peer_pairs_per_s']:.1f} "
            f"| {f'**{ratio}**' if c['fastest'] else ratio} ({c['ratio_min']:.2f}-{c['ratio_max']:.2f}) "
            f"| {c['localserve_p50_latency_ms']} / {c['peer_p50_latency_ms']} "
            f"| {', '.join(f'{x:.2f}' for x in c['loads_before_pairs'])} |"
        )
    args, served = data["args"], data["servers"]["localserve"]
    backend = served.get("served_as", {}).get("backend", "?")
    lines.append("")
    lines.append(
        f"Commit {data['commit']}, {data['started'][:10]}, {data['cpus']} cores; {args['pairs']} pairs per cell, "
        f"{args['requests']} requests per run, each a query and {data['request']['documents']} passages of "
        f"{data['request']['passage_tokens'][0]}-{data['request']['passage_tokens'][1]} tokens; localserve on "
        f"{backend}, {served.get('graph', '?')} (its default for a cross-encoder folder), --threads {served['threads']}; "
        f"infinity-emb 0.0.78, --batch-size {args['infinity_batch_size']}. Bold: against infinity's fastest "
        "engine at that client count. Source: `bench/results/rerank-peers.json`."
    )
    return "\n".join(lines)


def oneshot_rerank() -> str:
    """The one-shot queue against the cross-encoder's own best batched run()
    (bench/oneshot_bench.py --rerank): the served batching, and the runs
    before it (max_batch_tokens 8192; a request's pairs in arrival order)
    when their JSON is there."""
    orders = {
        "oneshot-rerank.json": "arrival",
        "oneshot-rerank-mbt1024.json": "arrival",
        "oneshot-rerank-shortest-first.json": "shortest first",
        "oneshot-rerank-shortest-first-mbt512.json": "shortest first",
    }
    files = [name for name in orders if (RESULTS / name).exists()]
    lines = [
        "| max_batch_tokens | a request's pairs | clients | queue (batching on) pairs/s | run() ceiling pairs/s (batch) "
        "| queue / ceiling (median, range) | batching off pairs/s | mean batch (on) | load before (on) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    notes, backends = [], []
    for name in files:
        data = _load(name)
        rounds: dict[tuple[str, int], dict[int, dict[str, dict[str, Any]]]] = {}
        for c in data["cells"]:
            if c.get("table") == "throughput" and c["backend"].startswith("cross-encoder"):
                rounds.setdefault((c["backend"], c["clients"]), {}).setdefault(c["round"], {})[c["batching"]] = c
        for (backend, clients), by_round in rounds.items():
            backends += [] if backend in backends else [backend]
            named = re.search(r"max_batch_tokens (\d+)", backend)  # the label names the budget it ran
            budget = named.group(1) if named else "8192"  # unnamed: the served default before febc841
            ons = [r["on"] for r in by_round.values()]
            offs = [r["off"] for r in by_round.values()]
            ratios = [on["items_per_s"] / on["ceiling_items_per_s"] for on in ons]
            sizes = "/".join(str(s) for s in sorted({on["ceiling_batch"] for on in ons}))
            lines.append(
                f"| {budget} | {orders[name]} | {clients} | {statistics.median([on['items_per_s'] for on in ons]):.1f} "
                f"| {statistics.median([on['ceiling_items_per_s'] for on in ons]):.1f} ({sizes}) "
                f"| **{statistics.median(ratios):.2f}** ({min(ratios):.2f}-{max(ratios):.2f}) "
                f"| {statistics.median([off['items_per_s'] for off in offs]):.1f} "
                f"| {statistics.median([on['mean_batch'] for on in ons]):.1f} "
                f"| {max(on['load_before'] for on in ons):.2f} |"
            )
        notes.append(f"`bench/results/{name}` (Commit {data['commit']}, {data['started'][:10]})")
        args, cpus = data["args"], data["cpus"]
    lines.append("")
    lines.append(
        f"{cpus} cores; {'; '.join(backends)}; "
        f"{args['rounds']} rounds per row, each {args['rerank_requests']} requests of a query and 32 passages; the "
        "ceiling is the best of run() on the same pairs, each client count's pairs in flight sorted by length and cut "
        "into batches of 4 to 256 (issue 41's goal: queue / ceiling >= 0.95); batching off runs each pair alone. "
        "A request's pairs go shortest first (one length per dispatch) since 27293f7, and 512 is the served "
        "setting since 8836f98 (1024 from febc841). The host differs between sources (the 2026-12-05 "
        "one ran the cross-encoder at about a third of the speed): compare ratios, not pairs/s. "
        f"Sources: {', '.join(notes)}."
    )
    return "\n".join(lines)


TABLES: dict[str, Callable[[], str]] = {
    "peers-llama-server": peers_llama_server,
    "multiturn": multiturn,
    "busy-desktop": busy_desktop,
    "rerank-peers": rerank_peers,
    "oneshot-rerank": oneshot_rerank,
}

_BLOCK = re.compile(r"(<!-- table:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(\n<!-- /table:(?P=name) -->)", re.DOTALL)


def render(text: str) -> str:
    """`text` with every table block regenerated from its JSON."""

    def replace(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in TABLES:
            raise SystemExit(f"README names an unknown table {name!r}; known: {', '.join(TABLES)}")
        return match.group(1) + TABLES[name]() + match.group(4)

    return _BLOCK.sub(replace, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md differs from the JSON")
    args = parser.parse_args(argv)
    text = README.read_text()
    new = render(text)
    if args.check:
        if new != text:
            print("README.md's benchmark tables differ from bench/results: run bench/readme_tables.py", file=sys.stderr)
            return 1
        return 0
    if new != text:
        README.write_text(new)
        print("README.md: tables regenerated")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
