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
FLASH_ATTN_MODES = ("auto", "on", "off")  # auto: see resolve_flash_attn
UNQUANTIZED = ("f32", "f16", "bf16")
# The most the attention scores of one micro-batch may take without flash
# attention (n_ubatch x KV cells x heads x 4 bytes) before `auto` keeps it on.
SCORES_CAP_BYTES = 256 << 20


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
    if flash_attn == "off" and type_v not in UNQUANTIZED:
        raise ValueError(f"a quantized V cache ({type_v}) needs flash attention: use --flash-attn on or auto")


def resolve_flash_attn(mode: str, *, on_cpu: bool, own_cells: bool, type_v: str, scores_bytes: int) -> str:
    """What `--flash-attn` means for one model: `on` and `off` as given;
    `auto` is off for a model whose layers run on the CPU in a context where
    each sequence attends over its own KV cells only (`own_cells`: a KV
    stream per sequence, or one sequence), and llama.cpp's `auto` (on where
    the device supports it) elsewhere.

    On the CPU, llama.cpp's flash-attention kernel (0.3.36) walks the KV cells
    one at a time per query row, while the plain path multiplies matrices.
    SmolLM2-135M, 2 threads, ms a token with / without it
    (bench/flash_attn.py, bench/results/flash-attn.json): 16 sequences
    decoding at position 350, 8.9 / 6.1 (at 700: 13.9 / 7.2); one sequence
    17.5 / 11.5; a prompt chunk 7.9 / 3.7. Only within the first ~100 tokens
    is it ahead (up to 15% at position 50), where a step is cheap anyway.
    In one pool the sequences share, the plain path multiplies over every
    sequence's cells (masked) where the kernel skips the others': 8 sequences
    of 700 in a pool of 8192, a prompt chunk took 9.3 ms a token without it
    against 4.5 with it (decoding 8: 12.8 against 16.2;
    bench/results/flash-attn-pool.json), so there it stays on.
    It also stays on where it is needed: a quantized V cache, and a context whose
    attention scores would take more than SCORES_CAP_BYTES without it (long
    contexts of wide models).
    """
    if mode != "auto":
        return mode
    if on_cpu and own_cells and type_v in UNQUANTIZED and scores_bytes <= SCORES_CAP_BYTES:
        return "off"
    return "auto"
