"""`localserve run MODEL PROMPT`: load a model in this process, generate once
and stream the answer to stdout, with a stats line on stderr (no server)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localserve.cli import options as cli_options
from localserve.config import ServerSettings

if TYPE_CHECKING:
    from localserve.serving.answer import Answer


def add_run_command(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "run",
        help="generate once in the terminal, streaming (no server)",
        description="Load MODEL in this process, generate a reply to PROMPT and stream it to stdout; "
        "a stats line goes to stderr. The prompt goes through the model's chat template unless --raw.",
    )
    parser.add_argument("model", metavar="MODEL", help="a built-in ID, a PATH to a .gguf file, or ID=PATH")
    parser.add_argument("prompt", metavar="PROMPT", help='the prompt text; "-" reads it from stdin')
    parser.add_argument(
        "--max-tokens",
        type=cli_options.int_at_least(1),
        default=256,
        metavar="N",
        help="most tokens to generate (default: 256)",
    )
    parser.add_argument(
        "--temperature",
        type=cli_options.non_negative,
        default=0.8,
        metavar="T",
        help="sampling temperature; 0 = greedy (default: 0.8)",
    )
    parser.add_argument(
        "--seed", type=int, default=None, metavar="S", help="sampling seed, for repeatable output (default: random)"
    )
    parser.add_argument(
        "--system",
        default=None,
        metavar="TEXT",
        help="a system message before the prompt, ignored with --raw (default: none)",
    )
    parser.add_argument(
        "--raw", action="store_true", help="send PROMPT as is, without the chat template (plain completion)"
    )
    cli_options.add_options(parser, cli_options.RUN_OPTIONS)
    parser.set_defaults(handler=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    import asyncio

    values = cli_options.resolve_options(args, cli_options.RUN_OPTIONS, os.environ)
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    settings = ServerSettings(
        models=[args.model],
        parallel=1,
        ctx_size=values["ctx_size"],
        threads=values["threads"],
        device=values["device"],
        n_gpu_layers=values["n_gpu_layers"],
        flash_attn=values["flash_attn"],
    )
    return asyncio.run(_generate(args, prompt, settings))


def resolve_chat_model(text: str) -> Any:
    """The spec of a model `run` can generate with; one line naming the chat
    models for an unknown name, and the right route for an embeddings or
    speech model."""
    from localserve.config import DEFAULT_MODEL
    from localserve.errors import ModelNotFoundError
    from localserve.models.catalog import load_catalog
    from localserve.models.kinds import ROUTES
    from localserve.models.oneshot import oneshot_kind
    from localserve.models.registry import resolve

    try:
        spec = resolve(text)
    except ModelNotFoundError as exc:
        if not exc.message.startswith("unknown model"):
            raise
        chat_ids = ", ".join(sorted(i for i, entry in load_catalog().items() if not oneshot_kind(entry.labels)))
        raise cli_options.CliError(
            f"unknown model {text!r}: `run` takes a chat model: a catalog id ({chat_ids}), a .gguf path, ID=PATH, "
            "or a name `localserve list` shows"
        ) from None
    kind = oneshot_kind(spec.labels)
    if kind is not None:
        route = ROUTES[kind]
        raise cli_options.CliError(
            f"{spec.model_id!r} is {'an' if kind[0] in 'aeiou' else 'a'} {kind} model; `run` generates text with a "
            f"chat model (such as {DEFAULT_MODEL}). "
            f"Serve it (`localserve serve --model {text}`) and use {route}"
        )
    return spec


async def _generate(args: argparse.Namespace, prompt: str, settings: ServerSettings) -> int:
    from localserve.engine.engine import Engine
    from localserve.engine.types import SamplingParams
    from localserve.models.registry import ModelRegistry
    from localserve.serving.completions import start_text
    from localserve.serving.models import LocalModels
    from localserve.serving.types import Options, TextRequest

    spec = resolve_chat_model(args.model)
    engine = Engine()
    sampling = SamplingParams(temperature=args.temperature, seed=args.seed)
    request = TextRequest(
        spec.model_id, prompt, Options(sampling=sampling, max_tokens=args.max_tokens), system=args.system, raw=args.raw
    )
    try:
        registry = ModelRegistry(engine, settings)
        loaded = await registry.load(spec)
        async with LocalModels(registry).call() as host:
            answer = await start_text(host, request, answer_id=engine.new_request_id("run"))
            stats = await _stream_to_stdout(answer)
    finally:
        await engine.close()
    if stats.error:
        raise cli_options.CliError(f"generation failed: {stats.error}")
    print(stats.summary(loaded.load_seconds), file=sys.stderr)
    return 0


@dataclass(slots=True)
class RunStats:
    """What `localserve run` reports on stderr when it is done."""

    started: float
    first_token_at: float = 0.0
    finished: float = 0.0
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    finish_reason: str = ""
    error: str | None = None

    def summary(self, load_s: float) -> str:
        decode_s = self.finished - self.first_token_at if self.first_token_at else 0.0
        # The first token comes from the prefill; the rate counts the tokens decoded after it.
        rate = (self.num_output_tokens - 1) / decode_s if self.num_output_tokens > 1 and decode_s > 0 else 0.0
        ttft = self.first_token_at - self.started if self.first_token_at else 0.0
        return (
            f"[{self.num_output_tokens} tokens, {rate:.1f} tok/s | prompt {self.num_prompt_tokens} tokens, "
            f"first token after {ttft:.2f} s | model load {load_s:.2f} s | finish: {self.finish_reason}]"
        )


async def _stream_to_stdout(answer: Answer) -> RunStats:
    from localserve.serving.types import ChoiceEnd, TextDelta

    stats = RunStats(started=time.monotonic())
    async with answer:
        async for delta in answer.deltas():
            if isinstance(delta, TextDelta) and delta.text:
                sys.stdout.write(delta.text)
                sys.stdout.flush()
            elif isinstance(delta, ChoiceEnd):
                stats.num_prompt_tokens = delta.usage.num_prompt_tokens
                stats.num_output_tokens = delta.usage.num_output_tokens
                stats.finish_reason = delta.finish_reason
                stats.error = delta.error.message if delta.error is not None else None
    stats.finished = time.monotonic()
    if answer.first_token_ns(0):
        stats.first_token_at = stats.started + (answer.first_token_ns(0) - answer.submitted_ns) / 1e9
    sys.stdout.write("\n")
    sys.stdout.flush()
    return stats
