"""Medians over the repeats of a comparison, the issue's targets as ratios,
and the markdown tables of the summary."""

from __future__ import annotations

import statistics
from typing import Any

SERVERS = ("localserve", "llama-server", "llama_cpp.server")

METRICS = {  # name -> path into a class summary
    "output_tokens_per_s": ("output_tokens_per_s",),
    "requests_per_s": ("requests_per_s",),
    "ttft_p50_ms": ("ttft_ms", "p50"),
    "ttft_p95_ms": ("ttft_ms", "p95"),
    "itl_p50_ms": ("itl_ms", "p50"),
    "itl_p95_ms": ("itl_ms", "p95"),
    "tpot_p50_ms": ("tpot_ms", "p50"),
    "latency_p50_ms": ("latency_ms", "p50"),
    "latency_p95_ms": ("latency_ms", "p95"),
    "goodput_requests_per_s": ("goodput_requests_per_s",),
    "mean_output_tokens": ("mean_output_tokens",),
    "num_failed": ("num_failed",),
    "server_cpu_ms_per_output_token": ("server_cpu_ms_per_output_token",),
}


def _get(summary: dict[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = summary
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _median_of(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for metric, path in METRICS.items():
        values = [v for v in (_get(s, path) for s in summaries) if v is not None]
        out[metric] = round(statistics.median(values), 2) if values else None
        out[metric + "_range"] = [min(values), max(values)] if values else None
    out["num_runs"] = len(summaries)
    return out


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians (and ranges) per server, per sweep level and per batch load."""
    servers: dict[str, Any] = {}
    for name in sorted({r["server"]["name"] for r in runs}, key=lambda n: SERVERS.index(n) if n in SERVERS else 9):
        mine = [r for r in runs if r["server"]["name"] == name]
        sweep: dict[str, list[dict[str, Any]]] = {}
        probe: dict[str, list[dict[str, Any]]] = {}
        for run in mine:
            for level in run["sweep"]["levels"]:
                cpu = {"server_cpu_ms_per_output_token": level.get("server_cpu_ms_per_output_token")}
                sweep.setdefault(f"{level['value']:g}", []).append({**level["all"], **cpu})
            for level in run["priority"]["levels"]:
                probe.setdefault(f"{level['value']:g}", []).append(level["classes"].get("interactive", {}))
        loads = [r["sweep"]["meta"]["loadavg_start"][0] for r in mine]
        servers[name] = {
            "version": mine[0]["server"]["version"],
            "argv": mine[0]["server"]["argv"],
            "loadavg_median": round(statistics.median(loads), 2),
            "sweep": {k: _median_of(v) for k, v in sweep.items()},
            "interactive_under_batch": {k: _median_of(v) for k, v in probe.items()},
        }
    return {"servers": servers, "meta": runs[0]["sweep"]["meta"] if runs else {}}


def targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets as ratios (reported, never asserted)."""
    s = summary["servers"]
    ls, ref, lcp = s.get("localserve"), s.get("llama-server"), s.get("llama_cpp.server")
    out: list[dict[str, Any]] = []

    def ratio(a: Any, b: Any) -> float | None:
        return round(a / b, 3) if a is not None and b else None

    def add(what: str, value: float | None, bound: float, at_least: bool) -> None:
        met = None if value is None else (value >= bound if at_least else value <= bound)
        out.append({"target": what, "ratio": value, "bound": ("≥ " if at_least else "≤ ") + f"{bound:g}", "met": met})

    for c in ("8", "16"):
        tps = lambda srv, c=c: (srv or {}).get("sweep", {}).get(c, {}).get("output_tokens_per_s")  # noqa: E731
        add(f"out tok/s at {c} streams vs llama-server", ratio(tps(ls), tps(ref)), 0.9, True)
        add(f"out tok/s at {c} streams vs llama_cpp.server", ratio(tps(ls), tps(lcp)), 2.0, True)
    one = lambda srv, m: (srv or {}).get("sweep", {}).get("1", {}).get(m)  # noqa: E731
    add("single-stream TTFT p50 vs llama-server", ratio(one(ls, "ttft_p50_ms"), one(ref, "ttft_p50_ms")), 1.15, False)
    add("single-stream ITL p50 vs llama-server", ratio(one(ls, "itl_p50_ms"), one(ref, "itl_p50_ms")), 1.15, False)
    for name, srv in (("localserve", ls), ("llama-server (FIFO, for contrast)", ref)):
        probe = (srv or {}).get("interactive_under_batch", {})
        idle = probe.get("0", {}).get("ttft_p95_ms")
        for load, values in probe.items():
            if load != "0":
                what = f"{name}: interactive TTFT p95 under {load} batch streams vs idle"
                add(what, ratio(values.get("ttft_p95_ms"), idle), 1.5, False)
    return out


def markdown_summary(summary: dict[str, Any], checks: list[dict[str, Any]]) -> str:
    lines = [
        "| server | streams | out tok/s | req/s | TTFT p50 / p95 ms | ITL p50 / p95 ms | E2E p50 / p95 s "
        "| server CPU ms / out token |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, srv in summary["servers"].items():
        for c, m in srv["sweep"].items():
            lat = [m["latency_p50_ms"], m["latency_p95_ms"]]
            lines.append(
                f"| {name} | {c} | {m['output_tokens_per_s']} | {m['requests_per_s']} "
                f"| {m['ttft_p50_ms']} / {m['ttft_p95_ms']} | {m['itl_p50_ms']} / {m['itl_p95_ms']} "
                f"| {' / '.join('-' if v is None else f'{v / 1e3:.2f}' for v in lat)} "
                f"| {m['server_cpu_ms_per_output_token']} |"
            )
    if _loads(summary):
        lines += _probe_table(summary)
    lines += ["", "| target | ratio | bound | met |", "|---|---:|---:|---|"]
    lines += [f"| {c['target']} | {c['ratio']} | {c['bound']} | {c['met']} |" for c in checks]
    return "\n".join(lines) + "\n"


def _probe_table(summary: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "Interactive requests (probe) under a batch-priority load, TTFT p50 / p95 ms:",
        "",
        "| server | " + " | ".join(f"{b} batch streams" for b in _loads(summary)) + " |",
        "|---|" + "---:|" * len(_loads(summary)),
    ]
    for name, srv in summary["servers"].items():
        if not srv["interactive_under_batch"]:
            continue
        cells = [srv["interactive_under_batch"].get(b, {}) for b in _loads(summary)]
        lines.append(
            f"| {name} | " + " | ".join(f"{c.get('ttft_p50_ms')} / {c.get('ttft_p95_ms')}" for c in cells) + " |"
        )
    return lines


def _loads(summary: dict[str, Any]) -> list[str]:
    return sorted({b for s in summary["servers"].values() for b in s["interactive_under_batch"]}, key=float)
