"""The disk as a resource that runs out: which failures mean "no room" (or
"read-only"), how much is free, and how much every cache leaves to the user.

A full disk (`ENOSPC`, a quota's `EDQUOT`, SQLite's "database or disk is
full") or a read-only one (`EROFS`, `EACCES`, SQLite's "attempt to write a
readonly database") is not a bug of the request that met it: callers pause
and retry, or answer 507 (`InsufficientStorageError`) with where and how much
is free, never 500.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from localserve.errors import InsufficientStorageError

log = logging.getLogger(__name__)

GIB = 1 << 30
#: What the caches never take: the larger of this and `FLOOR_SHARE` of the disk.
FLOOR_MIN_BYTES = GIB
FLOOR_SHARE = 0.05
#: Free space under which the server warns (once, until it is back above).
LOW_SPACE_BYTES = GIB

_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_READ_ONLY_ERRNOS = frozenset({errno.EROFS, errno.EACCES})
# sqlite3.h result codes (extended codes keep them in the low byte). SQLITE_IOERR counts as a full
# disk: opening a WAL database must make its -shm file, which fails that way when no byte is free.
_SQLITE_FULL, _SQLITE_READONLY, _SQLITE_IOERR = 13, 8, 10


def is_disk_full(exc: BaseException) -> bool:
    """`exc` says the disk (or a quota) has no room left."""
    if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS:
        return True
    return isinstance(exc, sqlite3.OperationalError) and _sqlite_code(exc) in (_SQLITE_FULL, _SQLITE_IOERR)


def is_read_only(exc: BaseException) -> bool:
    """`exc` says the file system, or the file, cannot be written."""
    if isinstance(exc, OSError) and exc.errno in _READ_ONLY_ERRNOS:
        return True
    return isinstance(exc, sqlite3.OperationalError) and _sqlite_code(exc) == _SQLITE_READONLY


def is_storage_error(exc: BaseException) -> bool:
    """A full or read-only disk: a condition to wait out, not a bug."""
    return is_disk_full(exc) or is_read_only(exc)


def _sqlite_code(exc: sqlite3.Error) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return int(code) & 0xFF
    text = str(exc)
    if "database or disk is full" in text:
        return _SQLITE_FULL
    if "disk I/O error" in text:
        return _SQLITE_IOERR
    return _SQLITE_READONLY if "readonly database" in text else None


def existing(path: Path) -> Path:
    """`path`, or its nearest ancestor that exists (where its file system is known)."""
    return next((p for p in (path, *path.parents) if p.exists()), Path(path.anchor or "/"))


def free_bytes(path: Path) -> int:
    """Bytes free to this user on `path`'s file system."""
    return shutil.disk_usage(existing(path)).free


def floor_bytes(path: Path) -> int:
    """What the caches leave free on `path`'s file system for everything else:
    the larger of 1 GiB and 5% of the disk."""
    return max(FLOOR_MIN_BYTES, int(FLOOR_SHARE * shutil.disk_usage(existing(path)).total))


def writable(path: Path) -> bool:
    """`path` (or, where it does not exist yet, the folder it would be made in)
    can be written: not a read-only file system, not someone else's folder."""
    return os.access(existing(path), os.W_OK)


def human(num_bytes: float) -> str:
    """`1.5 GiB`, `312 MiB`, `20 KiB`, `12 B`."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(num_bytes) < 1024 or unit == "GiB":
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
        num_bytes /= 1024
    return f"{num_bytes:.1f} GiB"


def storage_error(exc: BaseException, path: Path, what: str, *, needed: int | None = None) -> InsufficientStorageError:
    """The 507 for `exc` (a storage error met while `what`, e.g. "storing the
    upload") on `path`: names the folder, the free space and, when known, the
    space needed."""
    try:
        free = human(free_bytes(path))
    except OSError:
        free = "unknown"
    if is_read_only(exc):
        message = f"The server's data folder {path} is read-only ({_reason(exc)}); {what} failed. Make it writable."
        return InsufficientStorageError(message, code="storage_read_only")
    need = f"needs about {human(needed)}, " if needed is not None else ""
    return InsufficientStorageError(
        f"No space left on the disk of {path} while {what} ({need}{free} free). Free some space and retry."
    )


@contextlib.contextmanager
def storage_guard(path: Path, what: str, *, needed: int | None = None) -> Iterator[None]:
    """A full or read-only disk met in the block is the 507 `storage_error`
    (the block cleans up its own partial files)."""
    try:
        yield
    except (OSError, sqlite3.Error) as exc:
        if not is_storage_error(exc):
            raise
        raise storage_error(exc, path, what, needed=needed) from exc


def check_room(path: Path, needed: int, what: str) -> None:
    """Refuse up front (507) a write of about `needed` bytes that cannot fit on `path`'s disk."""
    try:
        free = free_bytes(path)
    except OSError:
        return
    if needed > free:
        raise InsufficientStorageError(
            f"No space on the disk of {path} for {what}: needs about {human(needed)}, {human(free)} free. "
            "Free some space (`localserve cache prune` removes superseded conversions) and retry."
        )


def _reason(exc: BaseException) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


class WriteGate:
    """One writer thread's say on whether a write of N bytes under `root` goes
    ahead: not while paused after a full or read-only disk (tried again after
    `retry_s`), and not where it would leave less than the floor free. The
    free space is read (statvfs) at most every `check_s` seconds and counted
    down by what was written in between, so a busy writer costs no syscall
    per write. One warning per pause, one line when writes work again."""

    def __init__(
        self,
        root: Path,
        name: str,
        *,
        floor: int | None = None,
        retry_s: float = 30.0,
        check_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root, self.name = root, name
        self.retry_s, self.check_s, self.clock = retry_s, check_s, clock
        self._floor = floor
        self._free = 0
        self._checked_at = -math.inf
        self.paused_until = -math.inf  # no writes before this (clock time)
        self.pause_reason = ""  # why writes are paused ("" when they are not)

    @property
    def floor(self) -> int:
        if self._floor is None:
            self._floor = floor_bytes(self.root)
        return self._floor

    def is_open(self) -> bool:
        """Not paused (or the pause is over: try again)."""
        return self.clock() >= self.paused_until

    def shortfall(self, num_bytes: int, *, fresh: bool = False) -> int:
        """Bytes to free before writing `num_bytes` keeps the floor free (0: none)."""
        now = self.clock()
        if fresh or now - self._checked_at >= self.check_s:
            self._free, self._checked_at = free_bytes(self.root), now
        return max(0, self.floor + num_bytes - self._free)

    def wrote(self, num_bytes: int) -> None:
        """`num_bytes` were written: counted against the free space; a pause ends."""
        self._free -= num_bytes
        if self.pause_reason:
            log.warning("%s: writing to %s again", self.name, self.root)
            self.pause_reason = ""

    def hold(self, reason: str) -> None:
        """Pause writes for `retry_s`; warn once per pause."""
        self.paused_until = self.clock() + self.retry_s
        if not self.pause_reason:
            log.warning("%s: not writing to %s for now: %s (trying again every %g s)", self.name, self.root, reason,
                        self.retry_s)  # fmt: skip
        self.pause_reason = reason
        self._checked_at = -math.inf  # read the free space again next time

    def failed(self, exc: BaseException) -> None:
        """A write met `exc`, a full or read-only disk: pause."""
        kind = "read-only" if is_read_only(exc) else "full"
        self.hold(f"the disk is {kind} ({_reason(exc)})")

    def hold_for_floor(self) -> None:
        """Pause: the free space is at the floor."""
        self.hold(f"{human(self._free)} free, and {human(self.floor)} stays free for other uses")
