"""`localserve bench`: load any OpenAI-compatible server and report latency,
throughput and goodput per load level and per priority class."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8400"


def _levels_arg(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"levels must not be negative, got {text!r}")
    return values


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def add_bench_command(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="load-test an OpenAI-compatible server (this one or a peer)",
        description="Send streamed completions with synthetic prompts to an OpenAI-compatible server, in "
        "closed-loop concurrency levels and/or open-loop Poisson rates, and report TTFT, inter-token latency, "
        "end-to-end latency (p50/p95/p99), requests/s, output tokens/s, goodput under SLOs and failures, per "
        "level and per priority class. Prints a markdown table; --json writes everything.",
    )
    add = parser.add_argument
    add("--url", default=DEFAULT_URL, metavar="URL", help=f"server base URL (default: {DEFAULT_URL})")
    add("--model", default=None, metavar="ID", help="model to ask for (default: the first of GET /v1/models)")
    add("--api-key", default=None, metavar="KEY", help="sent as a Bearer token (default: none)")
    add(
        "--endpoint",
        choices=("completions", "chat"),
        default="completions",
        help="/v1/completions with a raw prompt, or /v1/chat/completions (default: completions)",
    )
    add(
        "--concurrency",
        type=_levels_arg,
        default=None,
        metavar="N,N,...",
        help="closed-loop levels: N streams, each sends its next request when the last one ends; "
        "0 = no load besides the probe (default: 1 unless --rate is given)",
    )
    add(
        "--rate",
        type=_levels_arg,
        default=[],
        metavar="R,R,...",
        help="open-loop levels: Poisson arrivals at R requests/s (default: none)",
    )
    add(
        "--num-requests",
        type=int,
        default=0,
        metavar="N",
        help="requests per level (default: 0 = max(8, 4 x concurrency), or max(8, 20 s x rate))",
    )
    add(
        "--duration",
        type=float,
        default=0.0,
        metavar="S",
        help="end each level after S seconds instead, cutting off requests still running (default: 0 = off)",
    )
    add("--prompt-tokens", type=int, default=128, metavar="N", help="prompt length, about N words (default: 128)")
    add("--output-tokens", type=int, default=128, metavar="N", help="max_tokens of each request (default: 128)")
    add(
        "--no-fixed-output",
        dest="fixed_output",
        action="store_false",
        help="let answers end at EOS; by default every answer is --output-tokens long "
        "(ignore_eos + min_tokens, where the server honours them)",
    )
    add("--temperature", type=float, default=0.0, metavar="T", help="sampling temperature (default: 0, greedy)")
    add(
        "--priority-mix",
        default="none",
        metavar="CLASS=SHARE,...",
        help="priority classes and their shares, e.g. interactive=0.2,batch=0.8, each reported apart; "
        "'none' sends no priority field (default: none)",
    )
    add(
        "--probe-rate",
        type=float,
        default=0.0,
        metavar="R",
        help="also send probe requests at R/s (Poisson) beside each level, which then ends when they are "
        "done (default: 0 = no probe)",
    )
    add("--probe-requests", type=int, default=10, metavar="N", help="probe requests per level (default: 10)")
    add("--probe-priority", default="interactive", metavar="P", help="priority of the probe (default: interactive)")
    add("--probe-output-tokens", type=int, default=16, metavar="N", help="max_tokens of a probe (default: 16)")
    add("--probe-prompt-tokens", type=int, default=64, metavar="N", help="prompt length of a probe (default: 64)")
    add(
        "--probe-delay",
        type=float,
        default=2.0,
        metavar="S",
        help="head start of the main load before the first probe (default: 2)",
    )
    add("--slo-ttft-ms", type=float, default=1000.0, metavar="MS", help="goodput SLO on TTFT (default: 1000)")
    add(
        "--slo-itl-ms",
        type=float,
        default=100.0,
        metavar="MS",
        help="goodput SLO on the mean inter-token time of a request (default: 100)",
    )
    add("--warmup", type=int, default=1, metavar="N", help="unmeasured requests first (default: 1)")
    add("--pause", type=float, default=1.0, metavar="S", help="idle seconds between levels (default: 1)")
    add("--seed", type=int, default=0, metavar="S", help="seed of prompts and arrivals (default: 0)")
    add(
        "--extra-body",
        type=_json_object,
        default=None,
        metavar="JSON",
        help="fields merged into every request body (default: none)",
    )
    add("--timeout", type=float, default=600.0, metavar="S", help="limit of one request (default: 600)")
    add("--json", dest="json_path", default=None, metavar="PATH", help="write the full results here (default: none)")
    parser.set_defaults(handler=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    from localserve.bench.report import Slo, markdown_table
    from localserve.bench.runner import Probe
    from localserve.bench.workload import RequestClass, Workload, parse_mix

    try:
        classes = parse_mix(args.priority_mix)
    except ValueError as exc:
        raise SystemExit(f"localserve: error: --priority-mix: {exc}") from None
    model = args.model or first_model(args.url, args.api_key)
    workload = Workload(
        model,
        args.endpoint,
        args.prompt_tokens,
        args.output_tokens,
        args.fixed_output,
        args.temperature,
        args.extra_body or {},
    )
    probe = None
    if args.probe_rate > 0:
        probe_class = RequestClass(f"probe-{args.probe_priority}", parse_mix(args.probe_priority)[0].priority)
        probe = Probe(
            probe_class,
            args.probe_rate,
            args.probe_requests,
            args.probe_output_tokens,
            args.probe_prompt_tokens,
            args.probe_delay,
        )
    concurrency = args.concurrency if args.concurrency is not None else ([] if args.rate else [1.0])
    levels = build_levels(concurrency, args.rate, args.num_requests, args.duration, probe)
    slo = Slo(args.slo_ttft_ms / 1e3, args.slo_itl_ms / 1e3)
    document = asyncio.run(
        run_bench(
            args.url,
            workload,
            classes,
            levels,
            slo,
            api_key=args.api_key,
            seed=args.seed,
            warmup=args.warmup,
            pause_s=args.pause,
            timeout_s=args.timeout,
            on_level=_print_progress,
        )
    )
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(document, indent=1) + "\n")
    print(
        f"{args.url} · {model} · {describe(workload)} · SLO TTFT {args.slo_ttft_ms:g} ms, "
        f"ITL {args.slo_itl_ms:g} ms · load average {document['meta']['loadavg_start'][0]:.2f}\n"
    )
    print(markdown_table(document["levels"]))
    failed = sum(level["all"]["num_failed"] for level in document["levels"])
    return 1 if failed else 0


def build_levels(
    concurrency: Sequence[float], rates: Sequence[float], num_requests: int, duration_s: float, probe: Any = None
) -> list[Any]:
    """The levels of a run, closed-loop ones first."""
    from localserve.bench.runner import Level

    def count(auto: int) -> int:
        return 0 if (duration_s or probe) else (num_requests or auto)

    levels = [Level("concurrency", c, count(max(8, int(4 * c))), duration_s, probe) for c in concurrency]
    levels += [Level("rate", r, count(max(8, math.ceil(20 * r))), duration_s, probe) for r in rates if r > 0]
    if any(lv.value == 0 and lv.probe is None for lv in levels):
        raise SystemExit("localserve: error: a level of 0 needs a probe (--probe-rate)")
    return levels


def describe(workload: Any) -> str:
    fixed = "fixed" if workload.fixed_output else "up to"
    return (
        f"{workload.endpoint}, prompt ~{workload.prompt_tokens} tokens, {fixed} {workload.output_tokens} "
        f"output tokens, temperature {workload.temperature:g}"
    )


async def run_bench(
    base_url: str,
    workload: Any,
    classes: Sequence[Any],
    levels: Sequence[Any],
    slo: Any,
    *,
    api_key: str | None = None,
    seed: int = 0,
    warmup: int = 1,
    pause_s: float = 1.0,
    timeout_s: float = 600.0,
    on_level: Callable[[dict[str, Any]], None] | None = None,
    on_level_start: Callable[[Any], None] | None = None,
) -> dict[str, Any]:
    """Run `levels` one after another against `base_url`; the JSON document.
    `on_level_start(level)` and `on_level(summary)` bracket each level (the
    summary may be amended, e.g. with the server's CPU time)."""
    from localserve import __version__
    from localserve.bench.report import summarize_level
    from localserve.bench.runner import LoadRunner

    meta = {
        "url": base_url,
        "workload": dataclasses.asdict(workload),
        "classes": [dataclasses.asdict(c) for c in classes],
        "slo": dataclasses.asdict(slo),
        "seed": seed,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "loadavg_start": os.getloadavg(),
        "cpu_count": os.cpu_count(),
        "machine": f"{platform.machine()} {platform.processor() or ''} {platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "localserve": __version__,
    }
    summaries = []
    async with LoadRunner(base_url, workload, classes, api_key=api_key, seed=seed, timeout_s=timeout_s) as runner:
        warm = await runner.warmup(warmup)
        errors = [r.error for r in warm if r.error]
        if errors:
            raise SystemExit(f"localserve: error: warm-up request failed: {errors[0]}")
        for i, level in enumerate(levels):
            if i:
                # Requests cut off at the end of the last level may still hold the server
                # (a FIFO server runs queued ones until it notices); one tiny request waits that out.
                await runner.warmup(1, output_tokens=1)
                await asyncio.sleep(pause_s)
            if on_level_start is not None:
                on_level_start(level)
            summary = summarize_level(await runner.run(level), slo)
            summary["loadavg"] = os.getloadavg()[0]
            summaries.append(summary)
            if on_level is not None:
                on_level(summary)
    meta["loadavg_end"] = os.getloadavg()
    return {"meta": meta, "levels": summaries}


def first_model(base_url: str, api_key: str | None) -> str:
    """The first model a server lists, for when --model is not given."""
    import urllib.request

    request = urllib.request.Request(base_url.rstrip("/") + "/v1/models")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return str(json.load(response)["data"][0]["id"])
    except (OSError, ValueError, KeyError, IndexError) as exc:
        raise SystemExit(f"localserve: error: cannot list the models at {base_url} ({exc}); pass --model") from None


def _print_progress(summary: dict[str, Any]) -> None:
    s = summary["all"]
    print(
        f"  {summary['label']}: {s['num_completed']} done, {s['num_failed']} failed, "
        f"{s['output_tokens_per_s']:.1f} out tok/s, TTFT p95 {s['ttft_ms']['p95']} ms",
        file=sys.stderr,
    )
