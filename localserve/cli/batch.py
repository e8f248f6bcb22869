"""`localserve batch run INPUT -o OUTPUT`: run an OpenAI batch input file in
this process, without a server (see `localserve.jobs.offline`)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from localserve.cli import options as cli_options
from localserve.jobs.types import BATCH_ENDPOINTS

DEFAULT_CONCURRENCY = 8


#: `localserve batch run`'s own options, in --help's order (then the model options of `run`).
BATCH_RUN_OPTIONS: tuple[cli_options.CommandOption, ...] = (
    cli_options.command_option("input", metavar="INPUT", help="the batch input file (path or URL)"),
    cli_options.command_option(
        "-o",
        "--output",
        required=True,
        metavar="OUTPUT",
        help="where the answers go (path or URL; required, no default)",
    ),
    cli_options.command_option(
        "--model",
        default=None,
        metavar="ID_OR_PATH",
        help="model to use for every request (default: the model named in the file)",
    ),
    cli_options.command_option(
        "--endpoint",
        default=None,
        choices=BATCH_ENDPOINTS,
        help="endpoint every line must name (default: the first line's url)",
    ),
    cli_options.command_option(
        "--concurrency",
        type=cli_options.int_at_least(1),
        default=DEFAULT_CONCURRENCY,
        metavar="N",
        help=f"requests in flight, and the model's parallel slots (default: {DEFAULT_CONCURRENCY})",
    ),
    cli_options.command_option(
        "--quiet", action="store_true", help="no progress bar (default: a progress bar on stderr)"
    ),
    cli_options.command_option(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="answer the lines on a Ray cluster (needs the ray extra): ADDRESS as for ray.init, e.g. auto, "
        "HOST:6379 or ray://HOST:10001; none: $RAY_ADDRESS, else a new local Ray instance. "
        "Give it after INPUT, or as --ray=ADDRESS",
    ),
    cli_options.command_option(
        "--replicas",
        type=cli_options.int_at_least(1),
        default=None,
        metavar="N",
        help="with --ray: engine replicas, one model each, with --concurrency slots and --threads threads "
        "(default: one per node)",
    ),
)


def add_batch_command(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "batch",
        help="run OpenAI batch files offline (the server has /v1/batches)",
        description="Work with OpenAI Batch API input files without a server.",
    )
    commands = parser.add_subparsers(dest="batch_command", metavar="COMMAND", required=True)
    run = commands.add_parser(
        "run",
        help="run a batch input file in this process",
        description="Load the model in this process and answer every request of INPUT (JSONL lines "
        '{"custom_id", "method": "POST", "url", "body"}) through the same code as the server\'s endpoints. '
        "INPUT and OUTPUT are local paths or s3://, gs://, az:// URLs (fsspec; credentials from the usual "
        "environment). Failed requests go to OUTPUT with .errors.jsonl. Run it again after an interruption: "
        "requests already answered are skipped. With --ray, a pool of engine replicas on a Ray cluster "
        "answers the lines (Ray Data; see docs/scale-out.md).",
    )
    cli_options.add_command_options(run, BATCH_RUN_OPTIONS)
    cli_options.add_options(run, cli_options.RUN_OPTIONS)
    run.set_defaults(handler=cmd_batch_run)


def cmd_batch_run(args: argparse.Namespace) -> int:
    import asyncio

    from localserve.config import ServerSettings

    if args.replicas is not None and args.ray is None:
        raise cli_options.CliError("--replicas needs --ray")

    values = cli_options.resolve_options(args, cli_options.RUN_OPTIONS, os.environ)
    settings = ServerSettings(
        models=[],
        parallel=args.concurrency,
        ctx_size=values["ctx_size"],
        threads=values["threads"],
        device=values["device"],
        n_gpu_layers=values["n_gpu_layers"],
        flash_attn=values["flash_attn"],
    )
    return asyncio.run(_run(args, settings))


async def _run(args: argparse.Namespace, settings: Any) -> int:
    import functools

    from localserve.jobs.offline import BatchFileError, run_file
    from localserve.jobs.progress import Progress
    from localserve.serving.openai.batch_lines import local_model

    # A partial, not a closure: with --ray it is pickled to every replica.
    open_model = functools.partial(local_model, settings, concurrency=args.concurrency)
    work_dir = settings.data_path() / "jobs" / "offline"
    try:
        if args.ray is None:
            summary = await run_file(
                args.input,
                args.output,
                open_model,
                work_dir=work_dir,
                endpoint=args.endpoint,
                model=args.model,
                concurrency=args.concurrency,
                progress=None if args.quiet else Progress(sys.stderr),
            )
        else:
            from localserve.jobs.ray_progress import ReplicaProgress
            from localserve.jobs.ray_run import RayOptions, run_file_on_ray

            options = RayOptions(args.ray or None, args.replicas or 0, args.concurrency, settings.cpu_threads)
            summary = await run_file_on_ray(
                args.input,
                args.output,
                open_model,
                options,
                work_dir=work_dir,
                endpoint=args.endpoint,
                model=args.model,
                progress=None if args.quiet else ReplicaProgress(sys.stderr),
            )
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as exc:
        where = f": {exc.filename}" if exc.filename else ""
        raise cli_options.CliError(f"{exc.strerror or exc}{where} (INPUT {args.input}, OUTPUT {args.output})") from None
    except BatchFileError as exc:
        for error in exc.validation.errors[:20]:
            where = f"line {error.line}: " if error.line else ""
            print(f"localserve: {where}{error.message} [{error.code}]", file=sys.stderr)
        if exc.validation.num_errors > 20:
            print(f"localserve: ... and {exc.validation.num_errors - 20} more errors", file=sys.stderr)
        return 1
    errors = f"; errors in {summary.errors_url}" if summary.num_failed else ""
    skipped = f", {summary.num_skipped} done before" if summary.num_skipped else ""
    print(
        f"{summary.num_total} requests{skipped}: {summary.num_completed} answered, {summary.num_failed} failed "
        f"-> {summary.output_url}{errors}",
        file=sys.stderr,
    )
    return 0
