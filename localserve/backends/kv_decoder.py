"""A decoder-only model with explicit past key/values, driven by our
scheduler: the part ONNX Runtime and OpenVINO share.

Both runtimes load graphs exported with `past_key_values.N.key/value` inputs
and `present.N.key/value` outputs ([batch, kv_heads, tokens, head_dim]), as
optimum-onnx and optimum-intel (`stateful=False`) write them. The runtime only
runs the graph; this module keeps the KV cache, one numpy buffer per slot, and
decides how a step's chunks become graph calls:

* A slot's KV holds the tokens computed so far; `keep` truncates it, `copy`
  copies a prefix from another slot (the scheduler's prefix cache).
* A step's chunks are grouped by length (`plan_calls`): every decode token
  of the step goes into ONE call (batch = number of sequences, one query
  token each); a prompt chunk joins a group only if padding wastes little,
  so a 300-token prompt never pads 7 decode rows to 300 tokens.
* In one call, each row's past is right-padded to the longest past of the
  group and its chunk to the longest chunk: `[past | pad | chunk | pad]`.
  `attention_mask` marks the real positions and `position_ids` are explicit,
  so padding changes no real token's attention (the graph's causal mask is
  by index, and every real query sees only real keys at or before it).
* Sampling is per sequence, in numpy (numpy_sampling.py).
"""

from __future__ import annotations

import json
import re
from abc import abstractmethod
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from localserve.backends.constraints import GrammarMatcher, think_budget
from localserve.backends.hf_tokenizer import HFTokenizer
from localserve.backends.numpy_sampling import NumpySampler, token_logprob
from localserve.engine.backend import GenerativeBackend
from localserve.engine.types import (
    Capacity,
    KvOp,
    KvOpKind,
    SampledToken,
    SamplingParams,
    SeqChunk,
    StepPlan,
    StepResult,
)
from localserve.errors import BackendError, InvalidRequestError, LocalServeError

#: A prompt chunk joins a call when the call's padded tokens stay within this
#: factor of its real tokens.
MAX_PADDING_FACTOR = 1.25
_PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")
_PRESENT = re.compile(r"^present\.(\d+)\.(key|value)$")


@dataclass(frozen=True, slots=True)
class DecoderIO:
    """The graph's inputs and outputs that matter for KV handling."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    past_names: tuple[str, ...]  # key0, value0, key1, value1, ...
    present_names: tuple[str, ...]
    has_position_ids: bool
    kv_dtype: np.dtype

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_dtype.itemsize


def describe_io(inputs: dict[str, tuple[list[object], str]], outputs: Collection[str], what: str) -> DecoderIO:
    """`inputs`: name -> (shape with ints for static dims, element type name)."""
    past = {(int(m[1]), m[2]): name for name in inputs if (m := _PAST.match(name))}
    present = {(int(m[1]), m[2]): name for name in outputs if (m := _PRESENT.match(name))}
    if not past or "input_ids" not in inputs or "logits" not in outputs:
        stateful = "beam_idx" in inputs
        raise LocalServeError(
            f"{what} has no explicit past_key_values inputs"
            + (" (it is a stateful OpenVINO export)" if stateful else "")
            + "; export it with past KV as inputs: `localserve export`, or optimum-cli export openvino "
            "--disable-stateful / optimum-cli export onnx --task text-generation-with-past"
        )
    num_layers = max(layer for layer, _ in past) + 1
    order = [(layer, kind) for layer in range(num_layers) for kind in ("key", "value")]
    if any(key not in past or key not in present for key in order):
        raise LocalServeError(f"{what}: past_key_values/present inputs and outputs do not pair up per layer")
    shape, dtype = inputs[past[(0, "key")]]
    if len(shape) != 4 or not isinstance(shape[1], int) or not isinstance(shape[3], int):
        raise LocalServeError(f"{what}: past key shape {shape} is not [batch, kv_heads, tokens, head_dim]")
    return DecoderIO(
        num_layers=num_layers,
        num_kv_heads=shape[1],
        head_dim=shape[3],
        past_names=tuple(past[k] for k in order),
        present_names=tuple(present[k] for k in order),
        has_position_ids="position_ids" in inputs,
        kv_dtype=np.dtype(np.float16 if "16" in dtype else np.float32),
    )


@dataclass(frozen=True, slots=True)
class CallShape:
    """The fixed shape of one graph call: rows, new tokens per row, past KV
    positions per row (what a static-shape device was compiled for)."""

    rows: int
    new_tokens: int
    past_tokens: int


class SlotKv:
    """The KV of one slot: [layers, kv_heads, capacity, head_dim] keys and
    values, of which the first `num_tokens` positions are real."""

    __slots__ = ("keys", "values", "num_tokens")

    def __init__(self, io: DecoderIO) -> None:
        shape = (io.num_layers, io.num_kv_heads, 0, io.head_dim)
        self.keys = np.empty(shape, io.kv_dtype)
        self.values = np.empty(shape, io.kv_dtype)
        self.num_tokens = 0

    def reserve(self, num_tokens: int) -> None:
        capacity = self.keys.shape[2]
        if num_tokens <= capacity:
            return
        grown = max(num_tokens, 2 * capacity, 64)
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = np.empty((*old.shape[:2], grown, old.shape[3]), old.dtype)
            new[:, :, : self.num_tokens] = old[:, :, : self.num_tokens]
            setattr(self, name, new)

    def copy_from(self, src: SlotKv, num_tokens: int) -> None:
        num_tokens = min(num_tokens, src.num_tokens)
        self.num_tokens = 0
        self.reserve(num_tokens)
        self.keys[:, :, :num_tokens] = src.keys[:, :, :num_tokens]
        self.values[:, :, :num_tokens] = src.values[:, :, :num_tokens]
        self.num_tokens = num_tokens


def plan_calls(chunks: Sequence[SeqChunk], max_padding: float = MAX_PADDING_FACTOR) -> list[list[SeqChunk]]:
    """Group a step's chunks into graph calls: shortest first, a chunk joins
    the current call while padding every row to the longest chunk keeps the
    call within `max_padding` times its real tokens. All decode tokens (one
    token each) share one call."""
    calls: list[list[SeqChunk]] = []
    current: list[SeqChunk] = []
    real = 0
    for chunk in sorted(chunks, key=lambda c: len(c.token_ids)):
        n = len(chunk.token_ids)
        if current and (len(current) + 1) * n > max_padding * (real + n):
            calls.append(current)
            current, real = [], 0
        current.append(chunk)
        real += n
    if current:
        calls.append(current)
    return calls


class KvDecoderBackend(GenerativeBackend):
    """A GenerativeBackend over any runtime that runs one graph call; see the
    module docstring. Subclasses open the runtime and implement `_infer`."""

    def __init__(self, io: DecoderIO, tokenizer: HFTokenizer, capacity: Capacity) -> None:
        self.io = io
        self._tokenizer = tokenizer
        self._capacity = capacity
        self._slots = [SlotKv(io) for _ in range(capacity.num_slots)]
        self._samplers: dict[int, NumpySampler] = {}
        self.num_calls = 0  # graph calls so far (for tests and benchmarks)
        self.max_padding = MAX_PADDING_FACTOR  # see plan_calls; inf: one call per step

    @abstractmethod
    def _infer(self, feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
        """Run the graph: logits [batch, tokens, vocab] and the present
        arrays in `io.present_names` order (valid until the next call)."""

    # ---- GenerativeBackend ---------------------------------------------------

    def capacity(self) -> Capacity:
        return self._capacity

    def tokenizer(self) -> HFTokenizer:
        return self._tokenizer

    def validate(self, params: SamplingParams) -> None:
        """Refuse now what this backend cannot sample with (a grammar that
        does not compile against this vocabulary)."""
        if params.grammar is not None:
            self._matcher(params.grammar)

    def _matcher(self, grammar: str) -> GrammarMatcher:
        return GrammarMatcher(self._tokenizer.guidance_tokenizer(), grammar)

    def execute(self, batch: StepPlan) -> StepResult:
        self.release(batch.released_seq_ids)
        self._apply_kv_ops(batch.kv_ops)
        failed: dict[int, str] = {}
        sampled: dict[int, SampledToken] = {}
        for call, shape in self._plan(batch.chunks):
            for chunk, logits in zip(call, self._run_call(call, shape), strict=True):
                if chunk.sample and chunk.seq_id not in failed:
                    try:
                        sampled[chunk.seq_id] = self._sample(chunk, logits)
                    except InvalidRequestError as exc:  # this sequence only: e.g. a grammar that allows no token
                        failed[chunk.seq_id] = exc.message
        return StepResult(sampled=sampled, failed=failed)

    def release(self, seq_ids: Collection[int]) -> None:
        for seq_id in seq_ids:
            self._samplers.pop(seq_id, None)

    def clear_slots(self, slots: Collection[int]) -> None:
        for slot in slots:
            self._slots[slot] = SlotKv(self.io)

    def slot_num_tokens(self, slot: int) -> int:
        return self._slots[slot].num_tokens

    # ---- internals -----------------------------------------------------------

    def _plan(self, chunks: Sequence[SeqChunk]) -> list[tuple[list[SeqChunk], CallShape | None]]:
        """The step's graph calls, each with the shape it must be padded to
        (None: as small as it fits); static-shape devices override this."""
        return [(call, None) for call in plan_calls(chunks, self.max_padding)]

    def _apply_kv_ops(self, kv_ops: Sequence[KvOp]) -> None:
        for op in kv_ops:
            if op.kind == KvOpKind.KEEP:
                slot = self._slots[op.slot]
                slot.num_tokens = min(slot.num_tokens, op.num_tokens)
            elif op.kind == KvOpKind.COPY:
                self._slots[op.slot].copy_from(self._slots[op.src], op.num_tokens)
            else:
                raise BackendError(f"unknown KV operation {op.kind!r}")

    def _run_call(self, call: list[SeqChunk], shape: CallShape | None = None) -> list[np.ndarray]:
        """One graph call over `call`, padded to `shape` if given (rows past
        `call` are all padding); returns each chunk's last-token logits and
        appends each chunk's new KV to its slot."""
        io = self.io
        slots = [self._slots[c.slot] for c in call]
        for chunk, slot in zip(call, slots, strict=True):
            if chunk.start_pos != slot.num_tokens:
                raise BackendError(
                    f"slot {chunk.slot} holds {slot.num_tokens} tokens but the chunk starts at {chunk.start_pos}"
                )
        num_rows = len(call)
        num_past = max(s.num_tokens for s in slots)
        num_new = max(len(c.token_ids) for c in call)
        if shape is not None:
            assert shape.rows >= num_rows and shape.new_tokens >= num_new and shape.past_tokens >= num_past, shape
            num_rows, num_new, num_past = shape.rows, shape.new_tokens, shape.past_tokens
        input_ids = np.zeros((num_rows, num_new), np.int64)
        position_ids = np.zeros((num_rows, num_new), np.int64)
        mask = np.zeros((num_rows, num_past + num_new), np.int64)
        past_k = np.empty((io.num_layers, num_rows, io.num_kv_heads, num_past, io.head_dim), io.kv_dtype)
        past_v = np.empty_like(past_k)
        for row, (chunk, slot) in enumerate(zip(call, slots, strict=True)):
            n, p = len(chunk.token_ids), slot.num_tokens
            input_ids[row, :n] = chunk.token_ids
            position_ids[row, :] = np.minimum(np.arange(p, p + num_new), p + n - 1)
            mask[row, :p] = 1
            mask[row, num_past : num_past + n] = 1
            past_k[:, row, :, :p] = slot.keys[:, :, :p]
            past_v[:, row, :, :p] = slot.values[:, :, :p]
            past_k[:, row, :, p:] = 0  # masked, but 0 * NaN would still be NaN
            past_v[:, row, :, p:] = 0
        past_k[:, len(call) :] = 0  # padding rows of a fixed shape: one token that sees itself
        past_v[:, len(call) :] = 0
        mask[len(call) :, num_past] = 1
        feeds = {"input_ids": input_ids, "attention_mask": mask}
        if io.has_position_ids:
            feeds["position_ids"] = position_ids
        for layer in range(io.num_layers):
            feeds[io.past_names[2 * layer]] = past_k[layer]
            feeds[io.past_names[2 * layer + 1]] = past_v[layer]
        logits, presents = self._infer(feeds)
        self.num_calls += 1
        for row, (chunk, slot) in enumerate(zip(call, slots, strict=True)):
            self._append_kv(slot, presents, row, num_past, len(chunk.token_ids))
        # Copies: the runtime may reuse its output buffers in the next call.
        return [logits[row, len(chunk.token_ids) - 1].copy() for row, chunk in enumerate(call)]

    def _append_kv(self, slot: SlotKv, presents: list[np.ndarray], row: int, num_past: int, n: int) -> None:
        p = slot.num_tokens
        slot.reserve(p + n)
        for layer in range(self.io.num_layers):
            slot.keys[layer, :, p : p + n] = presents[2 * layer][row, :, num_past : num_past + n]
            slot.values[layer, :, p : p + n] = presents[2 * layer + 1][row, :, num_past : num_past + n]
        slot.num_tokens = p + n

    def _sample(self, chunk: SeqChunk, logits: np.ndarray) -> SampledToken:
        sampler = self._samplers.get(chunk.seq_id)
        if sampler is None:
            grammar = chunk.sampling.grammar
            matcher = self._matcher(grammar) if grammar is not None else None
            budget = think_budget(chunk.sampling, self._tokenizer)
            sampler = self._samplers[chunk.seq_id] = NumpySampler(chunk.sampling, matcher, budget)
        token_id = sampler.sample(logits)
        logprob = None
        if chunk.sampling.logprobs is not None:
            logprob = token_logprob(logits, token_id, chunk.sampling.logprobs)
        return SampledToken(token_id, logprob, ends=sampler.ended)


def plan_capacity(
    io: DecoderIO, model_config: dict[str, Any], *, n_ctx: int, num_slots: int, kv_size: int, step_tokens: int
) -> Capacity:
    """Slots = `num_slots`; context = `n_ctx` capped by the model's own; KV
    cells as asked, else `num_slots * n_ctx` if that fits in half the free
    memory, else what does (never below one context)."""
    n_ctx = min(n_ctx, int(model_config.get("max_position_embeddings") or n_ctx))
    num_slots = max(1, num_slots)
    if kv_size <= 0:
        try:
            import psutil

            budget = psutil.virtual_memory().available // 2 // io.bytes_per_token
        except (ImportError, OSError):
            budget = 16384
        kv_size = min(num_slots * n_ctx, int(budget))
    return Capacity(num_slots=num_slots, step_tokens=step_tokens, kv_size=max(kv_size, n_ctx), n_ctx=n_ctx)


def read_model_config(folder: Path) -> dict[str, Any]:
    """The folder's config.json (model_type, max_position_embeddings), or {}."""
    path = folder / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
