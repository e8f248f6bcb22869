"""The `localserve` command line: the parser, the shared option helpers and `serve`.

Every `serve` option can also come from a `LOCALSERVE_*` environment variable
(flags win). Heavy modules (llama.cpp, aiohttp, the server) are imported only
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from localserve import __version__
from localserve.backends.kv_types import FLASH_ATTN_MODES, KV_CACHE_TYPES
from localserve.config import MODEL_DEFAULTS, ServerSettings
from localserve.errors import LocalServeError
from localserve.models.models_cli import keep_alive_option, max_loaded_models_option

ENV_PREFIX = "LOCALSERVE_"
LOG_LEVELS = ("debug", "info", "warning", "error")
DEVICES = ("auto", "cpu", "gpu")


class CliError(Exception):
    """A user mistake or missing prerequisite: one line on stderr, exit 1."""


# ---- option table (flag -> ServerSettings field -> LOCALSERVE_* variable) -----


def _int_at_least(minimum: int) -> Callable[[str], int]:
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return convert


def _port(text: str) -> int:
    value = _int_at_least(0)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a port is 0..65535, got {value}")
    return value


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0:  # also rejects NaN
        raise argparse.ArgumentTypeError(f"must not be negative, got {text}")
    return value


def _choice(choices: Sequence[str]) -> Callable[[str], str]:
    def convert(text: str) -> str:
        if text.lower() not in choices:
            raise argparse.ArgumentTypeError(f"choose one of {', '.join(choices)}; got {text!r}")
        return text.lower()

    return convert


def _ctx_size(text: str) -> int:
    value = _int_at_least(0)(text)
    if 0 < value < 16:
        raise argparse.ArgumentTypeError(f"must be 0 (the model's) or at least 16, got {value}")
    return value


def _gpu_layers(text: str) -> int | str:
    from localserve.models.catalog import parse_gpu_layers

    try:
        return parse_gpu_layers(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@dataclass(frozen=True, slots=True)
class Option:
    """One `serve` option: its flag, the settings field it fills, how to parse it."""

    flag: str
    field: str  # a ServerSettings field, or "" for a CLI-only option
    convert: Callable[[str], Any]
    help: str
    metavar: str
    repeat: bool = False  # flag may be given several times; env var is comma-separated
    default: Any = None  # only for CLI-only options; settings fields take the dataclass default

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.flag.lstrip("-").upper().replace("-", "_")

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


SERVE_OPTIONS: tuple[Option, ...] = (
    Option("--host", "host", str, "address to listen on; 0.0.0.0 opens the server to your network", "ADDR"),
    Option("--port", "port", _port, "TCP port to listen on", "N"),
    Option(
        "--model",
        "models",
        str,
        "model to serve: a catalog ID, org/repo[:QUANT] from the Hugging Face cache or LM Studio, an Ollama "
        "name[:tag] (see `localserve list`), a PATH to a .gguf file (served under its file stem), or ID=PATH; "
        "repeat to serve several",
        "ID_OR_PATH",
        repeat=True,
    ),
    Option("--api-key", "api_key", str, "require `Authorization: Bearer KEY` on every route but /health", "KEY"),
    Option("--max-queue", "max_queue", _int_at_least(0), "waiting requests per model before 503 + Retry-After", "N"),
    Option("--parallel", "parallel", _int_at_least(1), "sequences decoded together per model (KV slots)", "N"),
    Option(
        "--ctx-size",
        "ctx_size",
        _ctx_size,
        "longest sequence (prompt + output) of a slot in tokens; 0 = the model's training context; "
        "shortened to what fits in free memory",
        "N",
    ),
    Option(
        "--kv-size",
        "kv_size",
        _int_at_least(0),
        "KV cache cells of a model; 0 = ctx-size x parallel (a stream per slot, fastest); fewer = one pool the slots share",
        "N",
    ),
    Option("--batch-tokens", "batch_tokens", _int_at_least(1), "token budget of one engine step", "N"),
    Option("--threads", "threads", _int_at_least(0), "CPU threads per model; 0 = all cores", "N"),
    Option("--device", "device", _choice(DEVICES), f"where to run models: {', '.join(DEVICES)}", "DEVICE"),
    Option(
        "--n-gpu-layers",
        "n_gpu_layers",
        _gpu_layers,
        "layers of a GGUF model offloaded to the GPU: auto (as many as free GPU memory holds; 0 without a GPU "
        "build), all, or N",
        "N",
    ),
    Option(
        "--cache-type-k",
        "cache_type_k",
        _choice(tuple(KV_CACHE_TYPES)),
        f"KV cache element type of K for GGUF models: {', '.join(KV_CACHE_TYPES)} (default f16; q8_0 halves the "
        "KV memory)",
        "TYPE",
    ),
    Option(
        "--cache-type-v",
        "cache_type_v",
        _choice(tuple(KV_CACHE_TYPES)),
        "KV cache element type of V, as --cache-type-k (a quantized V needs flash attention)",
        "TYPE",
    ),
    Option(
        "--flash-attn",
        "flash_attn",
        _choice(FLASH_ATTN_MODES),
        "flash attention for GGUF models: auto (where the device supports it), on, off",
        "MODE",
    ),
    Option(
        "--allow-host",
        "allow_hosts",
        str,
        "extra Host header name to accept (DNS-rebinding guard)",
        "NAME",
        repeat=True,
    ),
    Option("--cors-origin", "cors_origins", str, "extra browser origin allowed by CORS", "ORIGIN", repeat=True),
    Option("--max-body-bytes", "max_body_bytes", _int_at_least(1), "largest request body; larger gets 413", "N"),
    Option(
        "--body-timeout",
        "body_timeout_s",
        _non_negative,
        "seconds a request body may send nothing before 408 and the connection closes; 0 = no limit",
        "S",
    ),
    Option("--aging", "aging_s", _non_negative, "seconds of waiting that raise a request by one priority level", "S"),
    Option(
        "--reserved-slots",
        "reserved_slots",
        _int_at_least(-1),
        "slots per model that are interactive requests' first claim: batch-priority work uses them only while "
        "it runs alone and gives one back at the next step when needed (-1 = parallel/8)",
        "N",
    ),
    Option("--shutdown-timeout", "shutdown_timeout_s", _non_negative, "seconds to let requests finish on exit", "S"),
    Option(
        "--max-loaded-models",
        "max_loaded_models",
        max_loaded_models_option,
        "models loaded at once per kind, N or chat=N,embeddings=N,asr=N (0 = no limit); the least recently "
        "used idle one is unloaded to make room",
        "N",
    ),
    Option(
        "--keep-alive",
        "keep_alive",
        keep_alive_option,
        "how long an idle model stays loaded: 5m, 30s, 0 (unload after each request), -1 (forever); "
        "unset = 5m for models loaded on demand, forever for --model ones",
        "DURATION",
    ),
    Option("--log-level", "", _choice(LOG_LEVELS), f"logging level: {', '.join(LOG_LEVELS)}", "LEVEL", default="info"),
)


def _default_of(option: Option) -> Any:
    if not option.field:
        return option.default
    return getattr(ServerSettings(), option.field)


def _describe_option_default(option: Option) -> str:
    if option.field in MODEL_DEFAULTS:  # per model: request > flag > config file > catalog > this
        return f"the model's (config file, catalog), else {MODEL_DEFAULTS[option.field]}"
    return _describe_default(_default_of(option))


def _describe_default(value: Any) -> str:
    if value is None or value == [] or value == "":
        return "none"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


def add_options(parser: argparse.ArgumentParser, options: Sequence[Option]) -> None:
    """Add `options` to `parser`; defaults stay None so env vars can fill the gaps."""
    for option in options:
        help_text = f"{option.help} (env {option.env}; default: {_describe_option_default(option)})"
        parser.add_argument(
            option.flag,
            dest=option.dest,
            type=option.convert,
            metavar=option.metavar,
            action="append" if option.repeat else "store",
            default=None,
            help=help_text,
        )


def resolve_options(args: argparse.Namespace, options: Sequence[Option], env: Mapping[str, str]) -> dict[str, Any]:
    """Flag if given, else the env var if set and not empty, else the default; keyed by dest."""
    values: dict[str, Any] = {}
    for option in options:
        value = getattr(args, option.dest)
        if value is None and env.get(option.env, "").strip():
            raw = env[option.env].strip()
            try:
                if option.repeat:
                    value = [option.convert(part.strip()) for part in raw.split(",") if part.strip()]
                else:
                    value = option.convert(raw)
            except argparse.ArgumentTypeError as exc:
                raise CliError(f"{option.env}={raw!r}: {exc}") from None
        values[option.dest] = _default_of(option) if value is None else value
    return values


def build_serve_settings(values: Mapping[str, Any]) -> ServerSettings:
    fields = {option.field: values[option.dest] for option in SERVE_OPTIONS if option.field}
    return ServerSettings(**fields)


def settings_from_args(argv: Sequence[str], env: Mapping[str, str]) -> ServerSettings:
    """ServerSettings from `serve` arguments (with or without the leading
    "serve") and an environment mapping. Starts nothing; flags win over env."""
    argv = list(argv)
    if argv[:1] == ["serve"]:
        argv = argv[1:]
    parser = argparse.ArgumentParser(prog="localserve serve")
    add_options(parser, SERVE_OPTIONS)
    return build_serve_settings(resolve_options(parser.parse_args(argv), SERVE_OPTIONS, env))


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
    check_port_free(settings.host, settings.port)
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


# ---- run --------------------------------------------------------------------

RUN_OPTIONS = tuple(o for o in SERVE_OPTIONS if o.flag in ("--ctx-size", "--threads", "--device", "--n-gpu-layers"))


# ---- main -------------------------------------------------------------------

from localserve.batch_cli import add_batch_command  # noqa: E402 - light module
from localserve.bench.command import add_bench_command  # noqa: E402 - light module
from localserve.devices_cli import add_devices_command  # noqa: E402 - light module
from localserve.models.convert_cli import add_convert_command  # noqa: E402 - light module
from localserve.models.export_cli import add_export_command  # noqa: E402 - light module
from localserve.models.models_cli import add_pull_command, add_rm_command  # noqa: E402 - light module
from localserve.run_cli import add_run_command  # noqa: E402 - light module
from localserve.status_cli import add_list_command, add_top_command  # noqa: E402 - light module

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


if __name__ == "__main__":
    raise SystemExit(main())
