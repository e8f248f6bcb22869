"""The prefix cache's second tier: KV state of prompt prefixes on disk.

A slot's cached prefix is lost when the slot is reused, evicted, its model
unloaded or the server restarted. Before that, the scheduler has the
backend copy the KV state of the prefix's first whole blocks (BLOCK tokens
each) out of its cache (`KvOp` "save", on the step thread: a memory copy),
and this store writes it to a file from a background thread. A new
sequence whose prompt shares more whole blocks with a file than with any
slot has them restored into its slot (`KvOp` "restore") and computes only
the rest. The file is read ahead when the request arrives (`prefetch`: the
store's reader thread maps and checks it), so the scheduler's plan only
takes bytes that are ready and never waits on the disk; a sequence whose
read is still under way waits for it, and other work runs meanwhile.

Keys: a hash chain over the token ids, block by block, seeded with the
model's KV identity (`GenerativeBackend.kv_state_identity`: the model file's
path, size and mtime, the KV types and layout, the llama.cpp library), so
a file of another model, another KV layout or another build never matches.
A file holds the whole cached sequence, not only its whole blocks: its key
is the chain hash of its last whole block, and it stores its token ids, so
a restore takes every token a new prompt shares with it (a shared document
followed by a new question restores up to the question, not to the last
block boundary: on this CPU each token left over costs ~13 ms at a 2,000
token context). Files: ``ROOT/<identity hash>/<chain hash>.kv``, each a
header (magic, version, the chain hash, token count, payload size, CRC-32
of the rest) then the token ids (int32) and the payload. A file that is truncated, corrupt or not ours is deleted
with one warning and reads as a miss; it never reaches the backend. Writes
go to a temporary name and are renamed into place, so several processes on
one home never see half a file; the size bound (least recently used first,
by mtime, which a hit renews) is kept under an flock of ``ROOT/.lock``.

The disk is not the tier's alone (disk.py's `WriteGate`, on the writer
thread, never the step thread): a save that would leave less than the floor
free (the larger of 1 GiB and 5% of the disk) first evicts the least
recently used files, and is dropped if that is not enough. A full or
read-only disk (`ENOSPC`, `EROFS`) pauses writing with one warning and tries
again later; restores from the files present go on, and so does serving.
A home that cannot be written at all starts the tier paused, never failing.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import hashlib
import logging
import mmap
import os
import queue
import struct
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from localserve.disk import WriteGate, is_storage_error

log = logging.getLogger(__name__)

BLOCK = 256  # tokens per block: prefixes are saved and found in whole blocks
MAGIC = b"LSKV"
VERSION = 2
_HEADER = struct.Struct("<4sH32sIQI")  # magic, version, chain hash (hex, 32), tokens, payload bytes, crc32
_WRITE_QUEUE = 8  # saves waiting for the writer; more are dropped (a cache may forget)


@dataclass(slots=True)
class DiskTierStats:
    """Counters of one model's disk tier (read by the stats snapshot)."""

    num_hits: int = 0  # restores
    num_misses: int = 0  # admissions of a prompt of a block or more that found nothing longer on disk
    num_saves: int = 0
    bytes_written: int = 0
    bytes_read: int = 0
    restore_s: float = 0.0  # seconds spent restoring, backend side
    num_restored_tokens: int = 0
    num_dropped: int = 0  # saves dropped (writer busy) or unreadable files deleted


def chain_hashes(identity: str, token_ids: Sequence[int]) -> list[str]:
    """The chain hash after each whole block of `token_ids`."""
    hashes = []
    previous = hashlib.sha256(identity.encode()).digest()
    for start in range(0, len(token_ids) - BLOCK + 1, BLOCK):
        block = array.array("i", token_ids[start : start + BLOCK]).tobytes()
        previous = hashlib.sha256(previous + block).digest()
        hashes.append(previous.hex()[:32])
    return hashes


class Prefetch:
    """A saved prefix read ahead on the store's reader thread: `num_tokens`
    under `key`; once `done`, `loaded` is its token ids and payload, or None
    (gone, truncated, corrupt: deleted, a miss)."""

    __slots__ = ("done", "key", "loaded", "num_tokens")

    def __init__(self, num_tokens: int, key: str) -> None:
        self.num_tokens = num_tokens
        self.key = key
        self.loaded: tuple[array.array[int], memoryview] | None = None
        self.done = False


class DiskPrefixStore:
    """One model's files under `root` (shared by every model and process on
    this home), within `max_bytes` for the whole root."""

    def __init__(self, root: Path, identity: str, max_bytes: int, *, floor_bytes: int | None = None) -> None:
        self.identity = identity
        self.root = root
        self.dir = root / hashlib.sha256(identity.encode()).hexdigest()[:24]
        self.max_bytes = max_bytes
        self.gate = WriteGate(root, "prefix cache", floor=floor_bytes)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a read-only home: restore what is there, write nothing for now
            self.gate.failed(exc)
        self.stats = DiskTierStats()
        self._lock = threading.Lock()
        self._index: dict[str, int] = {}  # chain hash -> tokens, files of this model present on disk
        self._pending: dict[str, tuple[int, ...]] = {}  # saves asked of the backend: their token ids
        for path in self.dir.glob("*.kv"):
            tokens = _peek_tokens(path)
            if tokens:
                self._index[path.stem] = tokens
        self._queue: queue.Queue[tuple[str, tuple[int, ...], bytes] | None] = queue.Queue(_WRITE_QUEUE)
        self._writer = threading.Thread(target=self._write_loop, name="localserve-prefix-disk", daemon=True)
        self._writer.start()
        #: Called on the reader thread after each read ahead (the step loop's wake-up).
        self.on_read: Callable[[], None] | None = None
        self._reads: queue.SimpleQueue[Prefetch | None] = queue.SimpleQueue()
        self._reader = threading.Thread(target=self._read_loop, name="localserve-prefix-read", daemon=True)
        self._reader.start()

    # ---- the scheduler's view (step thread) --------------------------------------------------

    def longest(self, token_ids: Sequence[int], limit: int) -> tuple[int, str] | None:
        """The longest saved prefix of `token_ids` of at most `limit` tokens: (tokens, key)."""
        hashes = chain_hashes(self.identity, token_ids[:limit])
        with self._lock:
            for i in range(len(hashes) - 1, -1, -1):
                if hashes[i] in self._index:
                    return (i + 1) * BLOCK, hashes[i]
        return None

    def stored_tokens(self, key: str) -> int:
        """Tokens in the file under `key` (0: none)."""
        with self._lock:
            return self._index.get(key, 0)

    def expect(self, key: str, token_ids: Sequence[int]) -> None:
        """A save of `token_ids` under `key` was asked of the backend; its
        payload comes through `put`."""
        with self._lock:
            self._pending[key] = tuple(token_ids)

    def prefetch(self, num_tokens: int, key: str) -> Prefetch:
        """Start reading the file under `key` (`num_tokens` tokens, as
        `longest` found) on the reader thread."""
        fetch = Prefetch(num_tokens, key)
        self._reads.put(fetch)
        return fetch

    def _read_loop(self) -> None:
        while (fetch := self._reads.get()) is not None:
            try:
                fetch.loaded = self.load(fetch.key)
            except Exception:  # a read that fails is a miss; the reader goes on
                log.exception("prefix cache: could not read %s", self.dir / f"{fetch.key}.kv")
            finally:
                fetch.done = True
                wake = self.on_read
                if wake is not None:
                    wake()

    def load(self, key: str) -> tuple[array.array[int], memoryview] | None:
        """A saved sequence's token ids and payload, checked; None (and the
        file deleted) if it is not whole and ours. On the reader thread
        (`prefetch`), never the step thread."""
        path = self.dir / f"{key}.kv"
        try:
            # Mapped, not read: the page cache's pages themselves, with no
            # buffer to allocate, zero and copy into (a 48 MB bytearray cost
            # 34 ms of the step before, reading into it 10 ms more). Private
            # and writable, because llama.cpp is handed a ctypes view of it;
            # nothing writes to it. Files are only ever replaced whole
            # (`_write`), never truncated in place while mapped.
            with path.open("rb") as file:
                size = os.fstat(file.fileno()).st_size
                data: mmap.mmap | bytes = mmap.mmap(file.fileno(), size, access=mmap.ACCESS_COPY) if size else b""
        except (OSError, ValueError):
            self._forget(key)
            return None
        loaded = _check(data, key)
        if loaded is None:
            log.warning("prefix cache: %s is truncated, corrupt or not this model's; deleted", path)
            self.stats.num_dropped += 1
            self._forget(key)
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used
        self.stats.bytes_read += len(data)
        return loaded

    def discard(self, key: str) -> None:
        """A file the backend could not restore: never tried again."""
        log.warning("prefix cache: the backend refused %s; deleted", self.dir / f"{key}.kv")
        self.stats.num_dropped += 1
        self._forget(key)
        with contextlib.suppress(OSError):
            (self.dir / f"{key}.kv").unlink()

    # ---- saving (the worker hands payloads over; a thread writes them) ----------------------

    def put(self, key: str, num_tokens: int, payload: bytes) -> None:
        """The backend's state of the save `expect`ed under `key`, to write."""
        with self._lock:
            token_ids = self._pending.pop(key, None)
        if token_ids is None or len(token_ids) != num_tokens:
            self.stats.num_dropped += 1
            return
        try:
            self._queue.put_nowait((key, token_ids, payload))
        except queue.Full:
            self.stats.num_dropped += 1

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until queued saves are written (at unload and shutdown), at most `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self, timeout_s: float = 30.0) -> None:
        self.flush(timeout_s)
        self._reads.put(None)
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                if not self._room_for(_HEADER.size + 4 * len(item[1]) + len(item[2])):
                    self.stats.num_dropped += 1
                    continue
                self._write(*item)
            except OSError as exc:
                self.stats.num_dropped += 1
                if not is_storage_error(exc):
                    log.warning("prefix cache: could not write to %s: %s", self.dir, exc)
                    continue
                self.gate.failed(exc)  # a full or read-only disk: the cache forgets, serving goes on
                with contextlib.suppress(OSError):
                    self._evict(self.gate.shortfall(0, fresh=True))
            finally:
                self._queue.task_done()

    def _room_for(self, num_bytes: int) -> bool:
        """Writing `num_bytes` keeps the floor free (evicting old files first if
        needed); False while writing is paused or where eviction cannot make room."""
        if not self.gate.is_open():
            return False
        shortfall = self.gate.shortfall(num_bytes)
        if shortfall:
            self._evict(shortfall)
            if self.gate.shortfall(num_bytes, fresh=True):
                self.gate.hold_for_floor()
                return False
        return True

    def _write(self, key: str, token_ids: tuple[int, ...], payload: bytes) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)  # gone (a `localserve cache prune`) or never made (read-only)
        tokens = array.array("i", token_ids).tobytes()
        crc = zlib.crc32(payload, zlib.crc32(tokens))
        header = _HEADER.pack(MAGIC, VERSION, key.encode(), len(token_ids), len(payload), crc)
        path = self.dir / f"{key}.kv"
        tmp = self.dir / f".{key}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            with tmp.open("wb") as file:
                file.write(header)
                file.write(tokens)
                file.write(payload)
            tmp.replace(path)
        except BaseException:
            tmp.unlink(missing_ok=True)  # no half file takes the space
            raise
        with self._lock:
            self._index[key] = len(token_ids)
        self.stats.num_saves += 1
        num_bytes = len(header) + len(tokens) + len(payload)
        self.stats.bytes_written += num_bytes
        self.gate.wrote(num_bytes)
        self._evict()

    def _evict(self, free_bytes: int = 0) -> None:
        """Delete the least recently used files of every model until the root
        fits its bound and at least `free_bytes` more are free."""
        with (self.root / ".lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            files = []
            for path in self.root.glob("*/*.kv"):
                with contextlib.suppress(OSError):
                    st = path.stat()
                    files.append((st.st_mtime, st.st_size, path))
            total = sum(size for _, size, _ in files)
            if free_bytes > total:  # all of it would not make the room: keep the cache
                free_bytes = 0
            freed = 0
            for _, size, path in sorted(files):
                if total <= self.max_bytes and freed >= free_bytes:
                    break
                with contextlib.suppress(OSError):
                    path.unlink()
                    total -= size
                    freed += size
                    if path.parent == self.dir:
                        self._forget(path.stem)

    def _forget(self, key: str) -> None:
        with self._lock:
            self._index.pop(key, None)


def _check(data: mmap.mmap | bytes, key: str) -> tuple[array.array[int], memoryview] | None:
    if len(data) < _HEADER.size:
        return None
    magic, version, stored_key, num_tokens, size, crc = _HEADER.unpack_from(data)
    start = _HEADER.size + 4 * num_tokens
    if magic != MAGIC or version != VERSION or stored_key != key.encode() or len(data) != start + size:
        return None
    view = memoryview(data)
    if zlib.crc32(view[start:], zlib.crc32(view[_HEADER.size : start])) != crc:
        return None
    token_ids = array.array("i")
    token_ids.frombytes(view[_HEADER.size : start])
    return token_ids, view[start:]


def _peek_tokens(path: Path) -> int:
    """The token count a file's header states (0: not a file of ours); the payload is checked at load."""
    try:
        with path.open("rb") as file:
            head = file.read(_HEADER.size)
    except OSError:
        return 0
    if len(head) < _HEADER.size:
        return 0
    magic, version, key, tokens, _, _ = _HEADER.unpack(head)
    return int(tokens) if magic == MAGIC and version == VERSION and key == path.stem.encode() else 0
