"""A conversion or export in the model store supersedes the older ones of
its name and format: `<store>/<name>/<name>-<key>-<format>`, where the key
follows the source's weights and the converter (models/caches.py lists and
prunes the store; this is the part a conversion needs right after it wrote)."""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

#: `<name>-<12 hex digits of the key>-<format>`
KEYED = re.compile(r"^(?P<folder>.+)-(?P<key>[0-9a-f]{12})-(?P<suffix>[^/]+)$")


def remove_superseded(target: Path) -> list[Path]:
    """After `target` (a conversion or export in the model store) was written:
    remove the entries of its name and format under an older key."""
    match = KEYED.match(target.name)
    if match is None or target.parent.name != match["folder"]:
        return []
    removed = []
    for sibling in children(target.parent):
        other = KEYED.match(sibling.name)
        same_group = other is not None and (other["folder"], other["suffix"]) == (match["folder"], match["suffix"])
        if sibling != target and same_group and remove(sibling):
            log.info("removed %s: superseded by %s", sibling, target.name)
            removed.append(sibling)
    return removed


def children(path: Path) -> list[Path]:
    """What `path` holds, sorted; nothing if it is missing or unreadable."""
    try:
        return sorted(path.iterdir())
    except OSError:
        return []


def remove(path: Path) -> bool:
    """Delete a file or a folder; False (with a warning) if it stays."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:
        return True
    except OSError as exc:
        log.warning("could not remove %s: %s", path, exc)
        return False
    return True
