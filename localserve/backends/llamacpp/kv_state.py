"""KV-cache edits on a llama.cpp context: trims and copies between slots,
and the save / restore of a slot's state for the prefix cache's disk tier
(engine/step/prefix_disk.py): `llama_state_seq_get_data` / `_set_data`."""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import llama_cpp

from localserve.backends.llamacpp import selfcheck
from localserve.engine.types import KvOp, KvOpKind
from localserve.errors import BackendError

log = logging.getLogger(__name__)


@dataclass(slots=True)
class KvEdits:
    """What a step's save and restore edits did."""

    saved: dict[str, tuple[int, bytes]] = dataclasses.field(default_factory=dict)
    restore_s: float = 0.0
    restore_failed: set[int] = dataclasses.field(default_factory=set)


def apply_kv_ops(
    ctx: llama_cpp.llama_context_p, mem: llama_cpp.llama_memory_t, kv_ops: tuple[KvOp, ...], *, split_kv: bool
) -> KvEdits:
    """Apply a step's KV edits in order (see `KvOp`)."""
    state = KvEdits()
    for op in kv_ops:
        if op.kind == KvOpKind.KEEP:
            llama_cpp.llama_memory_seq_rm(mem, op.slot, op.num_tokens, -1)
        elif op.kind == KvOpKind.COPY:
            llama_cpp.llama_memory_seq_rm(mem, op.slot, -1, -1)
            if split_kv:  # across streams llama.cpp copies whole streams only: copy, then trim
                llama_cpp.llama_memory_seq_cp(mem, op.src, op.slot, -1, -1)
                llama_cpp.llama_memory_seq_rm(mem, op.slot, op.num_tokens, -1)
            else:
                llama_cpp.llama_memory_seq_cp(mem, op.src, op.slot, 0, op.num_tokens)
        elif op.kind == KvOpKind.SAVE:
            llama_cpp.llama_memory_seq_rm(mem, op.slot, op.num_tokens, -1)
            state.saved[op.key] = (op.num_tokens, seq_state(ctx, op.slot))
        elif op.kind == KvOpKind.RESTORE:
            started = time.perf_counter()
            llama_cpp.llama_memory_seq_rm(mem, op.slot, -1, -1)
            if set_seq_state(ctx, op.slot, op.payload):
                llama_cpp.llama_memory_seq_rm(mem, op.slot, op.num_tokens, -1)  # the prompt shares these
            else:
                llama_cpp.llama_memory_seq_rm(mem, op.slot, -1, -1)
                state.restore_failed.add(op.slot)
                log.warning("llama.cpp refused a saved prefix state of %d tokens; recomputing", op.num_tokens)
            state.restore_s += time.perf_counter() - started
        else:
            raise BackendError(f"unknown KV operation {op.kind!r}")
    return state


def seq_state(ctx: llama_cpp.llama_context_p, slot: int) -> bytes:
    """A copy of the KV state of one sequence (all its cells)."""
    size = llama_cpp.llama_state_seq_get_size(ctx, slot)
    buffer = (ctypes.c_uint8 * size)()
    written = llama_cpp.llama_state_seq_get_data(ctx, buffer, size, slot)
    return ctypes.string_at(buffer, written)


def set_seq_state(ctx: llama_cpp.llama_context_p, slot: int, payload: bytes | memoryview) -> bool:
    """Load a saved sequence state into `slot`; False if llama.cpp refuses it."""
    size = len(payload)
    if isinstance(payload, memoryview) and not payload.readonly:
        buffer = (ctypes.c_uint8 * size).from_buffer(payload)  # the file's buffer itself: no copy
    else:
        buffer = (ctypes.c_uint8 * size).from_buffer_copy(payload)
    return bool(llama_cpp.llama_state_seq_set_data(ctx, buffer, size, slot))


@functools.cache
def library_build() -> str:
    """The llama.cpp library this process runs (a hash of its files): a saved state is for that build only."""
    return selfcheck.library_digest(Path(llama_cpp.__file__).parent / "lib")
