"""The option table every command that serves a model shares (`serve`, `run`,
`batch run`): each flag, the `ServerSettings` field it fills, its
`LOCALSERVE_*` environment variable, how it is parsed; `CommandOption`, an
option of one command only (the command line alone); and `CliError`, a
user mistake said in one line. A light module below every command module
(cli/main.py imports the commands; they import this)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from localserve.backends.device_names import canonical_device, vocabulary
from localserve.backends.kv_types import FLASH_ATTN_MODES, KV_CACHE_TYPES
from localserve.cli.models import keep_alive_option, max_loaded_models_option
from localserve.config import MODEL_DEFAULTS, ServerSettings
from localserve.serving.builtin_templates import chat_template_source

ENV_PREFIX = "LOCALSERVE_"
LOG_LEVELS = ("debug", "info", "warning", "error")


class CliError(Exception):
    """A user mistake or missing prerequisite: one line on stderr, exit 1."""


# ---- option table (flag -> ServerSettings field -> LOCALSERVE_* variable) -----


def chat_template_option(text: str) -> str:
    """An argparse type: a built-in chat template name or a Jinja template."""
    try:
        chat_template_source(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number >= `minimum`."""

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
    value = int_at_least(0)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a port is 0..65535, got {value}")
    return value


def non_negative(text: str) -> float:
    """An argparse type: a number >= 0 (not NaN)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0:  # also rejects NaN
        raise argparse.ArgumentTypeError(f"must not be negative, got {text}")
    return value


def _latency_target(text: str) -> float:
    """A batch policy target: a ratio to the idle latency, 1 or more (1 = batch work only where it costs nothing)."""
    value = non_negative(text)
    if not 1.0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"a ratio to the idle latency, at least 1, got {text}")
    return value


SPECULATIVE_MODES = ("off", "ngram", "draft")
REASONING_MODES = ("on", "off", "auto")
POOLINGS = ("mean", "cls", "last", "none")  # --pooling (llama-server's; rank is a reranker's own)
_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def byte_size(text: str) -> int:
    """A size in bytes: 1234, 512M, 4G (powers of 1024), 0, or auto (-1)."""
    value = text.strip().upper().removesuffix("IB").removesuffix("B")
    if value == "AUTO":
        return -1
    unit = value[-1:] if value[-1:] in _SIZE_UNITS else ""
    try:
        number = float(value[: len(value) - len(unit)])
    except ValueError:
        raise argparse.ArgumentTypeError(f"a size is a number of bytes, 512M, 4G, 0 or auto; got {text!r}") from None
    if not 0 <= number < math.inf:
        raise argparse.ArgumentTypeError(f"a size is 0 or more; got {text!r}")
    return int(number * _SIZE_UNITS[unit])


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def boolean(text: str) -> bool:
    """An environment value of a switch: 1/true/yes/on or 0/false/no/off."""
    value = text.strip().lower()
    if value not in _TRUE + _FALSE:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(_TRUE + _FALSE)}; got {text!r}")
    return value in _TRUE


def _choice(choices: Sequence[str]) -> Callable[[str], str]:
    def convert(text: str) -> str:
        if text.lower() not in choices:
            raise argparse.ArgumentTypeError(f"choose one of {', '.join(choices)}; got {text!r}")
        return text.lower()

    return convert


def _device(text: str) -> str:
    try:
        return canonical_device(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _threads(text: str) -> int:
    """auto (-1), 0 (all cores) or N."""
    if text.strip().lower() == "auto":
        return -1
    try:
        return int_at_least(0)(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected auto, 0 (all cores) or a number of threads, got {text!r}") from None


def _ctx_size(text: str) -> int:
    value = int_at_least(0)(text)
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
    switch: bool = False  # a flag without a value that sets True; its env var takes 1/0, true/false, ...
    default: Any = None  # only for CLI-only options; settings fields take the dataclass default
    aliases: tuple[str, ...] = ()  # other spellings of the flag (llama-server's)

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.flag.lstrip("-").upper().replace("-", "_")

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


SERVE_OPTIONS: tuple[Option, ...] = (
    Option(
        "--host",
        "host",
        str,
        "address to listen on, or several comma-separated (127.0.0.1,::1); 0.0.0.0 opens the server to your network",
        "ADDR",
    ),
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
    Option("--max-queue", "max_queue", int_at_least(0), "waiting requests per model before 503 + Retry-After", "N"),
    Option("--parallel", "parallel", int_at_least(1), "sequences decoded together per model (KV slots)", "N"),
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
        int_at_least(0),
        "KV cache cells of a model; 0 = ctx-size x parallel (a stream per slot, fastest); fewer = one pool the slots share",
        "N",
    ),
    Option("--batch-tokens", "batch_tokens", int_at_least(1), "token budget of one engine step", "N"),
    Option(
        "--threads",
        "threads",
        _threads,
        "CPU threads per model: auto (default) = all cores, fewer while other programs keep cores busy; "
        "0 = all cores, fixed; N = N, fixed",
        "auto|N",
    ),
    Option(
        "--device",
        "device",
        _device,
        f"where to run models: {vocabulary()} (see `localserve devices`; auto = each backend's best)",
        "DEVICE",
    ),
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
        "flash attention for GGUF models: auto (off on the CPU with a KV stream per slot, else on where the device supports it), on, off",
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
    Option(
        "--cors-origin",
        "cors_origins",
        str,
        "extra browser origins allowed by CORS (comma-separated or repeated; * allows any)",
        "ORIGIN",
        repeat=True,
        aliases=("--cors-origins",),
    ),
    Option("--max-body-bytes", "max_body_bytes", int_at_least(1), "largest request body; larger gets 413", "N"),
    Option(
        "--body-timeout",
        "body_timeout_s",
        non_negative,
        "seconds a request body may send nothing before 408 and the connection closes; 0 = no limit",
        "S",
    ),
    Option("--aging", "aging_s", non_negative, "seconds of waiting that raise a request by one priority level", "S"),
    Option(
        "--reserved-slots",
        "reserved_slots",
        int_at_least(-1),
        "slots per model that are interactive requests' first claim: batch-priority work uses them only while "
        "it runs alone and gives one back at the next step when needed (-1 = parallel/8)",
        "N",
    ),
    Option(
        "--batch-itl-target",
        "batch_itl_target",
        _latency_target,
        "beside other requests, batch-priority work joins a step only while the step's predicted time (learnt "
        "from the model's measured steps) keeps their inter-token latency within this x of the step without it",
        "X",
    ),
    Option(
        "--batch-ttft-target",
        "batch_ttft_target",
        _latency_target,
        "beside other requests, batch-priority work joins a step only while a request that arrives meanwhile "
        "still gets its first token within this x of its time on an idle model",
        "X",
    ),
    Option(
        "--speculative",
        "speculative",
        _choice(SPECULATIVE_MODES),
        "speculative decoding on llama.cpp models: ngram drafts tokens by looking the output's last words up in "
        "the prompt and output so far (a win where output copies input: edits, rewrites, code); draft has "
        "--draft-model propose them (models of another vocabulary use ngram); drafts are verified in the shared "
        "step, as many as the step-time model says pay, and only where drafted steps are measured to yield more "
        "tokens a second than plain ones; off decodes one token a step",
        "MODE",
    ),
    Option(
        "--draft-model",
        "draft_model",
        str,
        "a smaller GGUF with the chat models' vocabulary (same family) that drafts tokens for --speculative draft",
        "PATH",
    ),
    Option("--draft-max", "draft_max", int_at_least(1), "drafted tokens one sequence may verify in a step", "N"),
    Option(
        "--reasoning",
        "reasoning",
        _choice(REASONING_MODES),
        "a reasoning model's think section when a request does not say (llama-server's --reasoning): on and auto "
        "render chat templates with enable_thinking=true, off closes the section in the prompt",
        "MODE",
    ),
    Option(
        "--reasoning-budget",
        "reasoning_budget",
        int_at_least(-1),
        "thinking tokens a reasoning model may write before its think section is closed for it "
        "(-1: no limit, 0: no thinking); a request's own budget (Anthropic's thinking.budget_tokens) is used instead",
        "N",
    ),
    Option(
        "--prefix-cache-disk",
        "prefix_cache_disk",
        byte_size,
        "KV state of prompt prefixes kept on disk (under the data directory) across slot reuse, unloads and "
        "restarts, restored instead of recomputed: a size (4G, 512M), 0 = off, auto = a tenth of the free disk, "
        "at most 4G",
        "SIZE",
    ),
    Option(
        "--batch-disk-timeout",
        "batch_disk_timeout_s",
        non_negative,
        "seconds a batch waits for a full or read-only data disk to take its results again (it pauses and "
        "retries meanwhile) before it fails with an error file saying why",
        "S",
    ),
    Option(
        "--no-ui",
        "no_ui",
        boolean,
        'do not serve the browser UI at / (Ollama\'s "Ollama is running" answers there either way)',
        "",
        switch=True,
    ),
    Option(
        "--strict-model-names",
        "strict_model_names",
        boolean,
        "a request without a model, or naming one not served, is a 400/404 even when one model of its kind runs",
        "",
        switch=True,
    ),
    Option(
        "--n-predict",
        "n_predict",
        int_at_least(-1),
        "tokens llama.cpp's /completion generates when a request sets no n_predict; -1 = until the context ends",
        "N",
    ),
    Option(
        "--temp",
        "temp",
        non_negative,
        "temperature of llama.cpp's /completion and /infill when a request sets none (llama-server's --temp)",
        "T",
    ),
    Option(
        "--seed",
        "seed",
        int_at_least(-1),
        "sampling seed of llama.cpp's /completion and /infill when a request sets none (llama-server's --seed); "
        "-1 = random",
        "N",
    ),
    Option(
        "--chat-template-file",
        "chat_template_file",
        str,
        "a Jinja chat template file that every chat model uses instead of its own",
        "FILE",
    ),
    Option(
        "--chat-template",
        "chat_template",
        chat_template_option,
        "a built-in chat template name (chatml, command-r, gemma, llama3, phi3, zephyr) or a Jinja template that "
        "every chat model uses instead of its own, as llama-server's --chat-template (--chat-template-file wins)",
        "NAME",
    ),
    Option("--no-slots", "no_slots", boolean, "GET /slots answers 501 (as llama-server's --no-slots)", "", switch=True),
    Option(
        "--verbose",
        "verbose",
        boolean,
        "chat answers carry llama-server's __verbose object (the prompt, the counts, the timings) unless a request "
        "sets verbose false, as llama-server's --verbose",
        "",
        switch=True,
    ),
    Option(
        "--no-metrics",
        "no_metrics",
        boolean,
        "GET /metrics answers 501 (as llama-server without --metrics)",
        "",
        switch=True,
    ),
    Option(
        "--slot-save-path",
        "slot_save_path",
        str,
        "folder where POST /slots/ID?action=save|restore keep prompt caches (unset: those actions are 501)",
        "DIR",
    ),
    Option(
        "--pooling",
        "pooling",
        _choice(POOLINGS),
        "how embeddings models pool their token vectors, as llama-server's --pooling: mean, cls or last load them "
        "on llama.cpp with that pooling; none gives one vector per token, which only llama.cpp's /embedding(s) "
        "return (unset: each model's own)",
        "MODE",
    ),
    Option("--shutdown-timeout", "shutdown_timeout_s", non_negative, "seconds to let requests finish on exit", "S"),
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
        if option.switch:
            parser.add_argument(
                option.flag,
                *option.aliases,
                dest=option.dest,
                action="store_const",
                const=True,
                default=None,
                help=help_text,
            )
            continue
        parser.add_argument(
            option.flag,
            *option.aliases,
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


#: The options of the commands that load a model in this process (`run`, `batch run`).
RUN_OPTIONS = tuple(
    o for o in SERVE_OPTIONS if o.flag in ("--ctx-size", "--threads", "--device", "--n-gpu-layers", "--flash-attn")
)


# ---- a command's own options (command line only) ------------------------------


@dataclass(frozen=True, slots=True)
class CommandOption:
    """An option of one command that reads no environment variable and fills
    no settings field (`bench`, `batch run`): its names, its help, and how
    argparse takes it (type, default, metavar, choices, action, dest, ...).
    The help says the default itself: it is shown as written."""

    names: tuple[str, ...]
    help: str
    argparse: Mapping[str, Any]


def command_option(*names: str, help: str, **argparse: Any) -> CommandOption:
    """A `CommandOption`: `names` as argparse takes them (`"-o", "--output"`, or a positional's)."""
    return CommandOption(names, help, argparse)


def add_command_options(parser: argparse.ArgumentParser, options: Sequence[CommandOption]) -> None:
    """Add a command's own `options` to `parser`, in order."""
    for option in options:
        parser.add_argument(*option.names, help=option.help, **option.argparse)
