"""`localserve bench`: load any OpenAI-compatible server and report latency,
throughput and goodput per load level and per priority class."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from localserve.cli.options import CommandOption, add_command_options, command_option
from localserve.config import DEFAULT_URL


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


#: `localserve bench`'s options, in --help's order.
BENCH_OPTIONS: tuple[CommandOption, ...] = (
    command_option("--url", default=DEFAULT_URL, metavar="URL", help=f"server base URL (default: {DEFAULT_URL})"),
    command_option(
        "--model", default=None, metavar="ID", help="model to ask for (default: the first of GET /v1/models)"
    ),
    command_option("--api-key", default=None, metavar="KEY", help="sent as a Bearer token (default: none)"),
    command_option(
        "--endpoint",
        choices=("completions", "chat"),
        default="completions",
        help="/v1/completions with a raw prompt, or /v1/chat/completions (default: completions)",
    ),
    command_option(
        "--concurrency",
        type=_levels_arg,
        default=None,
        metavar="N,N,...",
        help="closed-loop levels: N streams, each sends its next request when the last one ends; "
        "0 = no load besides the probe (default: 1 unless --rate is given)",
    ),
    command_option(
        "--rate",
        type=_levels_arg,
        default=[],
        metavar="R,R,...",
        help="open-loop levels: Poisson arrivals at R requests/s (default: none)",
    ),
    command_option(
        "--num-requests",
        type=int,
        default=0,
        metavar="N",
        help="requests per level (default: 0 = max(8, 4 x concurrency), or max(8, 20 s x rate))",
    ),
    command_option(
        "--duration",
        type=float,
        default=0.0,
        metavar="S",
        help="end each level after S seconds instead, cutting off requests still running (default: 0 = off)",
    ),
    command_option(
        "--prompt-tokens", type=int, default=128, metavar="N", help="prompt length, about N words (default: 128)"
    ),
    command_option(
        "--output-tokens", type=int, default=128, metavar="N", help="max_tokens of each request (default: 128)"
    ),
    command_option(
        "--no-fixed-output",
        dest="fixed_output",
        action="store_false",
        help="let answers end at EOS; by default every answer is --output-tokens long "
        "(ignore_eos + min_tokens, where the server honours them)",
    ),
    command_option(
        "--temperature", type=float, default=0.0, metavar="T", help="sampling temperature (default: 0, greedy)"
    ),
    command_option(
        "--priority-mix",
        default="none",
        metavar="CLASS=SHARE,...",
        help="priority classes and their shares, e.g. interactive=0.2,batch=0.8, each reported apart; "
        "'none' sends no priority field (default: none)",
    ),
    command_option(
        "--probe-rate",
        type=float,
        default=0.0,
        metavar="R",
        help="also send probe requests at R/s (Poisson) beside each level, which then ends when they are "
        "done (default: 0 = no probe)",
    ),
    command_option(
        "--probe-requests", type=int, default=10, metavar="N", help="probe requests per level (default: 10)"
    ),
    command_option(
        "--probe-priority", default="interactive", metavar="P", help="priority of the probe (default: interactive)"
    ),
    command_option(
        "--probe-output-tokens", type=int, default=16, metavar="N", help="max_tokens of a probe (default: 16)"
    ),
    command_option(
        "--probe-prompt-tokens", type=int, default=64, metavar="N", help="prompt length of a probe (default: 64)"
    ),
    command_option(
        "--probe-delay",
        type=float,
        default=2.0,
        metavar="S",
        help="head start of the main load before the first probe (default: 2)",
    ),
    command_option(
        "--slo-ttft-ms", type=float, default=1000.0, metavar="MS", help="goodput SLO on TTFT (default: 1000)"
    ),
    command_option(
        "--slo-itl-ms",
        type=float,
        default=100.0,
        metavar="MS",
        help="goodput SLO on the mean inter-token time of a request (default: 100)",
    ),
    command_option("--warmup", type=int, default=1, metavar="N", help="unmeasured requests first (default: 1)"),
    command_option("--pause", type=float, default=1.0, metavar="S", help="idle seconds between levels (default: 1)"),
    command_option("--seed", type=int, default=0, metavar="S", help="seed of prompts and arrivals (default: 0)"),
    command_option(
        "--extra-body",
        type=_json_object,
        default=None,
        metavar="JSON",
        help="fields merged into every request body (default: none)",
    ),
    command_option("--timeout", type=float, default=600.0, metavar="S", help="limit of one request (default: 600)"),
    command_option(
        "--json", dest="json_path", default=None, metavar="PATH", help="write the full results here (default: none)"
    ),
)


def add_bench_command(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="load-test an OpenAI-compatible server (this one or a peer)",
        description="Send streamed completions with synthetic prompts to an OpenAI-compatible server, in "
        "closed-loop concurrency levels and/or open-loop Poisson rates, and report TTFT, inter-token latency, "
        "end-to-end latency (p50/p95/p99), requests/s, output tokens/s, goodput under SLOs and failures, per "
        "level and per priority class. Prints a markdown table; --json writes everything.",
    )
    add_command_options(parser, BENCH_OPTIONS)
    parser.set_defaults(handler=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    from localserve.bench.session import BenchError
    from localserve.cli.options import CliError

    try:
        return _bench(args)
    except BenchError as exc:
        raise CliError(str(exc)) from None


def _bench(args: argparse.Namespace) -> int:
    from localserve.bench.report import Slo, markdown_table
    from localserve.bench.runner import Probe
    from localserve.bench.session import BenchError, build_levels, describe, first_model, print_progress, run_bench
    from localserve.bench.workload import RequestClass, Workload, parse_mix

    try:
        classes = parse_mix(args.priority_mix)
        probe_priority = parse_mix(args.probe_priority)[0].priority
    except ValueError as exc:
        raise BenchError(f"--priority-mix / --probe-priority: {exc}") from None
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
        probe = Probe(
            RequestClass(f"probe-{args.probe_priority}", probe_priority),
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
            on_level=print_progress,
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
