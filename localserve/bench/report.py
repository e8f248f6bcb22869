"""Turn request timings into the numbers a benchmark reports: percentiles,
rates, goodput under SLOs; as JSON-ready dicts and a markdown table."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from localserve.bench.client import RequestResult
from localserve.bench.runner import LevelResult

PERCENTILES = (50, 95, 99)


@dataclass(frozen=True, slots=True)
class Slo:
    """A request is good when its first token and its mean inter-token time
    (time per output token after the first) are both within bounds."""

    ttft_s: float = 1.0
    itl_s: float = 0.1

    def met_by(self, result: RequestResult) -> bool:
        return result.ok and result.ttft <= self.ttft_s and result.tpot <= self.itl_s


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _stats_ms(values: Sequence[float]) -> dict[str, float | None]:
    out: dict[str, float | None] = {"mean": _round(sum(values) / len(values) * 1e3) if values else None}
    for q in PERCENTILES:
        out[f"p{q}"] = _round(percentile(values, q) * 1e3)
    return out


def _round(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 2)


def summarize(results: Iterable[RequestResult], duration_s: float, slo: Slo) -> dict[str, Any]:
    """Everything reported for one class (or all classes) of one level."""
    results = list(results)
    done = [r for r in results if r.ok]
    duration_s = max(duration_s, 1e-9)
    num_output_tokens = sum(r.num_output_tokens for r in results if r.error is None)  # partials of cut-off ones too
    num_good = sum(1 for r in done if slo.met_by(r))
    return {
        "num_requests": len(results),
        "num_completed": len(done),
        "num_failed": sum(1 for r in results if r.error is not None),
        "num_cut_off": sum(1 for r in results if r.cancelled),
        "errors": sorted({r.error for r in results if r.error})[:5],
        "duration_s": round(duration_s, 3),
        "requests_per_s": round(len(done) / duration_s, 4),
        "output_tokens_per_s": round(num_output_tokens / duration_s, 2),
        "mean_prompt_tokens": round(sum(r.num_prompt_tokens for r in done) / len(done), 1) if done else None,
        "mean_output_tokens": round(sum(r.num_output_tokens for r in done) / len(done), 1) if done else None,
        "ttft_ms": _stats_ms([r.ttft for r in done]),
        "itl_ms": _stats_ms([gap for r in done for gap in r.itls()]),
        "tpot_ms": _stats_ms([r.tpot for r in done if r.num_output_tokens > 1]),
        "latency_ms": _stats_ms([r.latency for r in done]),
        "goodput_requests_per_s": round(num_good / duration_s, 4),
        "slo_attainment": round(num_good / len(done), 4) if done else None,
    }


def summarize_level(outcome: LevelResult, slo: Slo) -> dict[str, Any]:
    """The level's summary overall and per class, plus every request's record."""
    names = sorted({r.class_name for r in outcome.results})
    level = outcome.level
    return {
        "label": level.label,
        "kind": level.kind,
        "value": level.value,
        "probe": None
        if level.probe is None
        else {
            "class": level.probe.request_class.name,
            "priority": level.probe.request_class.priority,
            "rate": level.probe.rate,
            "num_requests": level.probe.num_requests,
            "output_tokens": level.probe.output_tokens,
            "prompt_tokens": level.probe.prompt_tokens,
        },
        "all": summarize(outcome.results, outcome.duration_s, slo),
        "classes": {
            name: summarize((r for r in outcome.results if r.class_name == name), outcome.duration_s, slo)
            for name in names
        },
        "requests": [r.record() for r in outcome.results],
    }


def _fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


TABLE_HEADER = (
    "| load | class | ok/fail/cut | req/s | out tok/s | TTFT p50/p95/p99 ms | ITL p50/p95/p99 ms "
    "| TPOT p50 ms | E2E p50/p95/p99 s | goodput req/s (SLO %) |\n"
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def table_row(label: str, name: str, s: dict[str, Any]) -> str:
    ttft, itl, tpot, lat = s["ttft_ms"], s["itl_ms"], s["tpot_ms"], s["latency_ms"]
    e2e = "/".join(_fmt(lat[f"p{q}"] / 1e3 if lat[f"p{q}"] is not None else None, 2) for q in PERCENTILES)
    slo = "-" if s["slo_attainment"] is None else f"{s['slo_attainment'] * 100:.0f}"
    return (
        f"| {label} | {name} | {s['num_completed']}/{s['num_failed']}/{s['num_cut_off']} "
        f"| {s['requests_per_s']:.2f} | {s['output_tokens_per_s']:.1f} "
        f"| {'/'.join(_fmt(ttft[f'p{q}']) for q in PERCENTILES)} "
        f"| {'/'.join(_fmt(itl[f'p{q}'], 1) for q in PERCENTILES)} | {_fmt(tpot['p50'], 1)} "
        f"| {e2e} | {s['goodput_requests_per_s']:.2f} ({slo}) |"
    )


def markdown_table(levels: Sequence[dict[str, Any]]) -> str:
    """One row per level and class ("all" first when there are several classes)."""
    rows = [TABLE_HEADER]
    for level in levels:
        classes = level["classes"]
        if len(classes) > 1:
            rows.append(table_row(level["label"], "all", level["all"]))
        rows.extend(table_row(level["label"], name, summary) for name, summary in classes.items())
    return "\n".join(rows)
