"""`localserve pull`, `localserve rm`, and the rows of `localserve list`.

Light at import (the CLI's `--help` stays fast): the catalog, the store and
the downloader are imported by the commands themselves.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from localserve.errors import LocalServeError
from localserve.models.policy import parse_keep_alive, parse_max_loaded_models

BAR_WIDTH = 24


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
        help="download a model into the model store (resumable, checksum-verified)",
        description="Fetch a catalog model (see `localserve list`) or any hub file into the model store "
        "($LOCALSERVE_HOME/models, else the user data directory), with a progress bar. An interrupted pull "
        "resumes where it stopped. Honours HF_ENDPOINT (a mirror), HF_TOKEN (gated repositories) and "
        "HF_HUB_OFFLINE.",
    )
    parser.add_argument("model", metavar="ID_OR_HF_URI", help="a catalog id, or hf://OWNER/REPO[@REVISION]/FILE")
    parser.add_argument("--name", default=None, metavar="ID", help="store an hf:// pull under this id (default: derived from the repo and file name)")
    parser.add_argument("--force", action="store_true", help="download again even if the store has it")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(handler=cmd_pull)


def cmd_pull(args: argparse.Namespace) -> int:
    from localserve.models.pull import plan_pull, pull

    plan = plan_pull(args.model, name=args.name)
    bar = ProgressBar(sys.stderr, quiet=args.quiet)
    try:
        manifest = pull(plan, progress=bar.update, force=args.force)
    except KeyboardInterrupt:
        bar.finish()
        print(f"interrupted; `localserve pull {args.model}` resumes the download", file=sys.stderr)
        raise
    bar.finish()
    print(f"{manifest.model_id}: {human_bytes(manifest.size_bytes)} in the model store ({manifest.source})")
    return 0


class ProgressBar:
    """One line per file on a terminal (redrawn), a few lines otherwise."""

    def __init__(self, out: TextIO, *, quiet: bool = False) -> None:
        self.out, self.quiet = out, quiet
        self.tty = out.isatty()
        self.open_line = False
        self.last_quarter: dict[str, int] = {}

    def update(self, progress: Any) -> None:
        if self.quiet:
            return
        if progress.status == "downloading":
            self._downloading(progress)
        elif progress.status == "exists":
            self._line(f"{progress.model_id} is already in the model store")
        elif progress.status == "resolving":
            self._line(f"resolving {progress.num_files} file(s) of {progress.model_id}")

    def _downloading(self, p: Any) -> None:
        fraction = p.completed / p.total if p.total else 0.0
        eta = "-" if p.eta_s is None else format_seconds(p.eta_s)
        text = (
            f"{p.file} [{'#' * int(fraction * BAR_WIDTH):<{BAR_WIDTH}}] {100 * fraction:5.1f}% "
            f"{human_bytes(p.completed)}/{human_bytes(p.total)} {human_bytes(p.rate_bytes_per_s)}/s ETA {eta}"
        )
        if self.tty:
            self.out.write("\r\x1b[K" + text)
            self.out.flush()
            self.open_line = True
            return
        quarter = int(fraction * 4)
        if self.last_quarter.get(p.file) != quarter:
            self.last_quarter[p.file] = quarter
            self._line(text)

    def _line(self, text: str) -> None:
        self.finish()
        print(text, file=self.out, flush=True)

    def finish(self) -> None:
        if self.open_line:
            self.out.write("\n")
            self.out.flush()
            self.open_line = False


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
        help="delete a pulled model from the model store",
        description="Delete a model's folder from the model store (its downloads and converted copies). "
        "A running server that has it loaded keeps serving it until it unloads it; "
        "DELETE /api/v1/models/ID unloads and deletes in one go.",
    )
    parser.add_argument("model", metavar="ID", help="the model id")
    parser.set_defaults(handler=cmd_rm)


def cmd_rm(args: argparse.Namespace) -> int:
    from localserve.models.store import ModelStore

    freed = ModelStore().remove(args.model)
    print(f"removed {args.model} ({human_bytes(freed)} freed)")
    return 0


# ---- list -------------------------------------------------------------------------------


def catalog_rows() -> list[dict[str, Any]]:
    """A row per catalog model and per pulled model: where it is, its size."""
    from localserve.models.catalog import load_catalog, local_path, missing_message
    from localserve.models.store import ModelStore

    store, catalog = ModelStore(), load_catalog()
    rows = []
    for entry in sorted(catalog.values(), key=lambda e: e.id):
        row = _row(entry.id, entry.labels, entry.size_bytes)
        row["description"] = entry.description
        row["default_options"] = entry.options.given()  # the catalog's (with the config file's)
        for source in entry.sources:
            path, origin = local_path(entry, source, store)
            if path is not None:
                row.update(installed=True, path=str(path), size_bytes=_disk_size(path), status=_status(origin))
                row["downloaded"] = origin == "store"
                break
        else:
            row["status"] = "not downloaded" if entry.hub_source() else "not installed"
            row["note"] = missing_message(entry).split(": ", 1)[1]
        rows.append(row)
    for model_id in store.model_ids():
        manifest = store.manifest(model_id)
        path = store.model_path(model_id)
        if model_id in catalog or manifest is None or path is None:
            continue
        row = _row(model_id, manifest.labels, manifest.size_bytes)
        row.update(installed=True, downloaded=True, path=str(path), status="downloaded", description=manifest.source)
        rows.append(row)
    return rows


def _row(model_id: str, labels: Any, size_bytes: int) -> dict[str, Any]:
    return {
        "id": model_id,
        "labels": list(labels),
        "status": "",
        "installed": False,  # on this machine, ready to load
        "downloaded": False,  # in the model store
        "path": None,
        "size_bytes": size_bytes,  # on disk, else the catalog's estimate
        "note": "",
        "description": "",
    }


def _status(origin: str) -> str:
    if origin == "store":
        return "downloaded"
    return "installed" if origin.startswith("pypi:") else "local"


def _disk_size(path: Any) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return int(path.stat().st_size)


def print_rows(rows: list[dict[str, Any]], loaded: Mapping[str, Any] | None) -> None:
    """The `localserve list` table; `loaded` holds the ids a server has loaded (None: no server)."""
    print(f"{'ID':<28} {'LABELS':<18} {'STATUS':<15} {'LOADED':<8} {'SIZE':>9}  PATH")
    for row in rows:
        size = human_bytes(row["size_bytes"]) if row["size_bytes"] else "-"
        if not row["installed"] and row["size_bytes"]:
            size = "~" + size
        state = "-" if loaded is None else ("yes" if row["id"] in loaded else "no")
        where = row["path"] or row["note"]
        print(f"{row['id']:<28} {','.join(row['labels']):<18} {row['status']:<15} {state:<8} {size:>9}  {where}")
