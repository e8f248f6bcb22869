"""KV cache element types and flash attention, named as llama-server names them
(`--cache-type-k/-v`, `--flash-attn`), with what each costs in memory."""

from __future__ import annotations

# name -> (ggml type id, bytes per element: a quantized block of 32 values
# takes 34 bytes for q8_0, 18 for q4_0, ...)
KV_CACHE_TYPES: dict[str, tuple[int, float]] = {
    "f32": (0, 4.0),
    "f16": (1, 2.0),
    "bf16": (30, 2.0),
    "q8_0": (8, 34 / 32),
    "q5_1": (7, 24 / 32),
    "q5_0": (6, 22 / 32),
    "q4_1": (3, 20 / 32),
    "q4_0": (2, 18 / 32),
    "iq4_nl": (20, 18 / 32),
}
FLASH_ATTN_MODES = ("auto", "on", "off")  # auto: llama.cpp turns it on where the device supports it


def kv_bytes_scale(type_k: str, type_v: str) -> float:
    """KV bytes with these types over KV bytes in f16 (K and V each half of it)."""
    return (KV_CACHE_TYPES[type_k][1] + KV_CACHE_TYPES[type_v][1]) / (2 * KV_CACHE_TYPES["f16"][1])


def check_kv_types(type_k: str, type_v: str, flash_attn: str) -> None:
    """Raise ValueError for a combination llama.cpp refuses: a quantized V
    cache needs flash attention."""
    for name in (type_k, type_v):
        if name not in KV_CACHE_TYPES:
            raise ValueError(f"unknown KV cache type {name!r}; use one of {', '.join(KV_CACHE_TYPES)}")
    if flash_attn not in FLASH_ATTN_MODES:
        raise ValueError(f"flash_attn is one of {', '.join(FLASH_ATTN_MODES)}; got {flash_attn!r}")
    if flash_attn == "off" and type_v not in ("f32", "f16", "bf16"):
        raise ValueError(f"a quantized V cache ({type_v}) needs flash attention: use --flash-attn on or auto")
