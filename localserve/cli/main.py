"""The `localserve` command line: the parser, `serve` and `main`.

Every `serve` option can also come from a `LOCALSERVE_*` environment variable
(flags win; the option table is in cli/options.py, which the command modules
share). Heavy modules (llama.cpp, aiohttp, the server) are imported only
inside the command that needs them, so `--help` stays fast.

To add a subcommand, write one `add_<name>_command(subparsers)` function that
creates its parser and sets `handler`, and append it to `COMMANDS`.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any

from localserve import __version__
from localserve.cli.batch import add_batch_command
from localserve.cli.bench import add_bench_command
from localserve.cli.cache import add_cache_command
from localserve.cli.convert import add_convert_command
from localserve.cli.devices import add_devices_command
from localserve.cli.export import add_export_command
from localserve.cli.models import add_pull_command, add_rm_command
from localserve.cli.options import (
    SERVE_OPTIONS,
    CliError,
    add_options,
    build_serve_settings,
    resolve_options,
    settings_from_args,
)
from localserve.cli.run import add_run_command
from localserve.cli.status import add_list_command, add_top_command
from localserve.disk import is_storage_error
from localserve.errors import LocalServeError

__all__ = ["COMMANDS", "SERVE_OPTIONS", "CliError", "build_parser", "check_models", "main", "settings_from_args"]

# ---- serve ------------------------------------------------------------------


def add_serve_command(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="start the OpenAI-compatible HTTP server",
        description="Serve one or more models over an OpenAI-compatible API (/v1 and /api/v1). "
        "Every option can also be set with the LOCALSERVE_* environment variable named in its help; "
        "a flag wins over the variable. List values (--model, --allow-host, --cors-origin) are "
        "comma-separated in the environment.",
    )
    add_options(parser, SERVE_OPTIONS)
    parser.set_defaults(handler=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    values = resolve_options(args, SERVE_OPTIONS, os.environ)
    settings = build_serve_settings(values)
    setup_logging(values["log_level"])
    check_models(settings.models)
    for host in settings.hosts:
        check_port_free(host, settings.port)
    from localserve.server import serve  # heavy: aiohttp, the engine

    try:
        serve(settings)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise CliError(port_in_use_message(settings.host, settings.port)) from None
        raise
    return 0


def check_models(models: Sequence[str]) -> None:
    """Resolve every --model now, so a typo fails before anything starts."""
    from localserve.models.registry import resolve

    if not models:
        raise CliError("no model to serve: pass --model ID_OR_PATH or set LOCALSERVE_MODEL")
    seen: dict[str, str] = {}
    for text in models:
        spec = resolve(text)
        if spec.model_id in seen:
            raise CliError(
                f"two models would be served as {spec.model_id!r} ({seen[spec.model_id]!r} and {text!r}); "
                "name one with --model ID=PATH"
            )
        seen[spec.model_id] = text


def port_in_use_message(host: str, port: int) -> str:
    return (
        f"port {port} on {host} is already in use (another localserve?): stop that process, "
        "or pick another port with --port N / LOCALSERVE_PORT"
    )


def check_port_free(host: str, port: int) -> None:
    """Fail early with a clear message if `host:port` cannot be bound."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise CliError(
            f"cannot resolve --host {host!r} ({exc.strerror}): use an IP address such as 127.0.0.1"
        ) from None
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio's server does
            try:
                sock.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise CliError(port_in_use_message(host, port)) from None
                raise CliError(f"cannot listen on {host}:{port}: {exc.strerror}; check --host") from None


# ---- main -------------------------------------------------------------------


COMMANDS: list[Callable[[Any], None]] = [
    add_serve_command,
    add_run_command,
    add_list_command,
    add_pull_command,
    add_rm_command,
    add_top_command,
    add_convert_command,
    add_export_command,
    add_bench_command,
    add_batch_command,
    add_devices_command,
    add_cache_command,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="localserve",
        description="A local LLM server with an OpenAI-compatible API and continuous batching.",
        epilog="Run `localserve COMMAND --help` for the options of a command.",
    )
    parser.add_argument("--version", action="version", version=f"localserve {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add_command in COMMANDS:
        add_command(subparsers)
    return parser


def setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `localserve` script and `python -m localserve`."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        print("\nlocalserve: interrupted", file=sys.stderr)
        return 130
    except CliError as exc:
        print(f"localserve: error: {exc}", file=sys.stderr)
        return 1
    except LocalServeError as exc:
        print(f"localserve: error: {exc.message}", file=sys.stderr)
        return 1
    except ImportError as exc:
        print(f"localserve: error: {exc}; install the dependencies with `make install`", file=sys.stderr)
        return 1
    except OSError as exc:
        if not is_storage_error(exc):
            raise
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"localserve: error: {exc.strerror or exc}{where}: free some space (`localserve cache prune`)",
              file=sys.stderr)  # fmt: skip
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
