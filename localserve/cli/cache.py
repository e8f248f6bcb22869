"""`localserve cache` (what each cache holds, and its size) and
`localserve cache prune` (superseded conversions and exports, partial
leftovers, and with `--older-than DAYS` whatever was not used for that
long). The caches are described in models/caches.py."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, TextIO

DAY_S = 24 * 3600
#: Label of each cache kind in the listing.
LABELS = {
    "conversions": "conversions",
    "exports": "exports",
    "partial": "partial (stopped half-way)",
    "prefix": "prefix cache",
    "wheels": "llama.cpp wheels",
    "pulls": "pulls (Hugging Face cache)",
}


def add_cache_command(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "cache",
        help="list what localserve's caches hold on disk, or prune them",
        description="Without an action, list every cache (converted models, exports, the prefix cache, "
        "llama.cpp wheels, pulls) with its size and entries. `prune` removes superseded conversions and exports "
        "(an older key for the same model and format), conversions that stopped half-way, and with --older-than "
        "anything of localserve's own not used for that many days. Pulled models live in the Hugging Face cache, "
        "which other tools share: they are listed, never pruned (`localserve rm MODEL` removes one).",
    )
    parser.add_argument("action", nargs="?", choices=("list", "prune"), default="list", help="list (default) or prune")
    parser.add_argument(
        "--older-than",
        type=_days,
        default=None,
        metavar="DAYS",
        help="prune: also remove entries unused this long (default: none, only superseded and partial ones)",
    )
    parser.add_argument("--dry-run", action="store_true", help="prune: say what would go, remove nothing")
    parser.set_defaults(handler=cmd_cache)


def _days(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number of days, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"a number of days, 0 or more, got {text!r}")
    return value


def cmd_cache(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from localserve.models.caches import prunable, prune, survey

    out = out or sys.stdout
    report = survey()
    if args.action == "list":
        print_listing(report, out)
        return 0
    older_than_s = args.older_than * DAY_S if args.older_than is not None else None
    doomed = (prunable if args.dry_run else prune)(report, older_than_s=older_than_s)
    verb = "would remove" if args.dry_run else "removed"
    for entry in doomed:
        why = "superseded" if entry.superseded else entry.kind if entry.kind == "partial" else "unused"
        out.write(f"{verb} {_size(entry.num_bytes):>9}  {entry.path}  ({why})\n")
    out.write(f"{verb} {len(doomed)} entries, {_size(sum(e.num_bytes for e in doomed))}\n")
    return 0


def print_listing(report: Any, out: TextIO) -> None:
    now = time.time()
    for kind, label in LABELS.items():
        entries = report.of(kind)
        total = sum(e.num_bytes for e in entries)
        out.write(f"{label}: {len(entries)} entries, {_size(total)}  ({report.roots[kind]})\n")
        for entry in sorted(entries, key=lambda e: (e.group, -e.mtime)):
            mark = "  superseded" if entry.superseded else ""
            age = _age(now - entry.mtime)
            out.write(f"  {_size(entry.num_bytes):>9}  {age:>8}  {entry.path.name}{mark}\n")


def _size(num_bytes: float) -> str:
    from localserve.disk import human

    return human(num_bytes)


def _age(seconds: float) -> str:
    if seconds < 3600:
        return f"{max(0, seconds) / 60:.0f} min"
    if seconds < DAY_S:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / DAY_S:.0f} days"
