"""Static shapes for OpenVINO's NPU plugin, which compiles fixed shapes only.

A decoder with dynamic shapes becomes two compiled graphs, fixed from the
server settings at load time:

* prefill: 1 row of `prompt_tokens` new tokens (`--batch-tokens`, at most
  `--ctx-size`) over `past_tokens` past positions; a longer prompt chunk runs
  as several such calls, the last one padded;
* decode: `decode_rows` rows (`--parallel`) of one new token each over the
  same `past_tokens` past positions (`--ctx-size`); unused rows are padding.

Every call pads the past KV to `past_tokens` (the attention mask hides the
padding), so one decode step moves `decode_rows * past_tokens` cached tokens
whatever the sequences hold. A plan whose decode KV input would exceed
`NPU_MAX_KV_BYTES` is refused at load with the settings that fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from localserve.backends.kv_decoder import CallShape
from localserve.engine.types import SeqChunk
from localserve.errors import LocalServeError

#: Largest past-KV input of one static decode call (all rows, all layers).
NPU_MAX_KV_BYTES = 1 << 30


@dataclass(frozen=True, slots=True)
class StaticShapes:
    """The two fixed graphs a static-shape device runs."""

    past_tokens: int  # past positions per row (= the context length)
    prompt_tokens: int  # new tokens per prefill call (one row)
    decode_rows: int  # rows per decode call (= KV slots)

    @property
    def prefill(self) -> CallShape:
        return CallShape(1, self.prompt_tokens, self.past_tokens)

    @property
    def decode(self) -> CallShape:
        return CallShape(self.decode_rows, 1, self.past_tokens)


def needs_static_shapes(device: str, forced: bool | None = None) -> bool:
    """NPU compiles static shapes only; `forced` (tests) overrides."""
    return device.upper().startswith("NPU") if forced is None else forced


def plan_static_shapes(
    *, n_ctx: int, num_slots: int, step_tokens: int, bytes_per_token: int, device: str = "NPU"
) -> StaticShapes:
    """The static shapes for these settings, or a LocalServeError that names
    exactly which settings to lower and to what."""
    rows, prompt_tokens = max(1, num_slots), max(1, min(step_tokens, n_ctx))
    kv_bytes = rows * n_ctx * bytes_per_token
    if kv_bytes > NPU_MAX_KV_BYTES:
        fit_ctx = NPU_MAX_KV_BYTES // (rows * bytes_per_token) // 256 * 256
        fit_rows = NPU_MAX_KV_BYTES // (n_ctx * bytes_per_token)
        options = [f"--ctx-size {fit_ctx} (LOCALSERVE_CTX_SIZE={fit_ctx})"] if fit_ctx >= 256 else []
        if fit_rows >= 1:
            options.append(f"--parallel {fit_rows} (LOCALSERVE_PARALLEL={fit_rows})")
        raise LocalServeError(
            f"OpenVINO on {device} compiles static shapes: every decode call would carry the full KV of "
            f"--parallel {rows} x --ctx-size {n_ctx} tokens ({kv_bytes / 2**30:.1f} GiB, over the "
            f"{NPU_MAX_KV_BYTES / 2**30:.0f} GiB limit). Set {' or '.join(options) or 'a smaller --ctx-size'}; "
            "--batch-tokens sets the prompt tokens per prefill call."
        )
    return StaticShapes(past_tokens=n_ctx, prompt_tokens=prompt_tokens, decode_rows=rows)


def static_calls(chunks: Sequence[SeqChunk], shapes: StaticShapes) -> list[tuple[list[SeqChunk], CallShape]]:
    """A step's chunks as fixed-shape calls: one-token chunks (decode, or a
    prompt's last token) share decode calls; a longer chunk runs alone in
    prefill calls of `prompt_tokens`, sampling only after its last piece."""
    singles = [c for c in chunks if len(c.token_ids) == 1]
    calls: list[tuple[list[SeqChunk], CallShape]] = [
        (singles[i : i + shapes.decode_rows], shapes.decode) for i in range(0, len(singles), shapes.decode_rows)
    ]
    step = shapes.prompt_tokens
    for chunk in (c for c in chunks if len(c.token_ids) > 1):
        for start in range(0, len(chunk.token_ids), step):
            last = start + step >= len(chunk.token_ids)
            piece = replace(
                chunk,
                token_ids=chunk.token_ids[start : start + step],
                start_pos=chunk.start_pos + start,
                sample=chunk.sample and last,
            )
            calls.append(([piece], shapes.prefill))
    return calls


def static_input_shapes(
    shape: CallShape, past_names: Sequence[str], kv_heads: int, head_dim: int, has_position_ids: bool
) -> dict[str, list[int]]:
    """The `model.reshape` argument that fixes a decoder to `shape`."""
    shapes = {
        "input_ids": [shape.rows, shape.new_tokens],
        "attention_mask": [shape.rows, shape.past_tokens + shape.new_tokens],
    }
    if has_position_ids:
        shapes["position_ids"] = [shape.rows, shape.new_tokens]
    for name in past_names:
        shapes[name] = [shape.rows, kv_heads, shape.past_tokens, head_dim]
    return shapes
