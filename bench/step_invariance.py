"""Does a token's logits row depend on how many tokens its step carried?
SmolLM2-135M Q4_1, one chat prompt, 64 greedy tokens decoded one a step with
flash attention on (the reference); then the same tokens fed again in steps
of 1, 4 and 64, flash attention on and off, each row compared with the
reference (max and mean |difference|, argmax flips). Why speculation's
exactness tests name `--flash-attn on` (kv_types.resolve_flash_attn).

    .venv/bin/python bench/step_invariance.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import llama_cpp  # noqa: E402

from localserve.backends.llamacpp.devices import init_llama  # noqa: E402
from localserve.models.registry import resolve  # noqa: E402

PROMPT = "<|im_start|>user\nWrite a short story about a robot who learns to paint.<|im_end|>\n<|im_start|>assistant\n"
ON, OFF = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED, llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED


def main() -> None:
    init_llama()
    model = llama_cpp.llama_model_load_from_file(
        str(resolve("smollm2-135m-instruct").path).encode(), llama_cpp.llama_model_default_params()
    )
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    text = PROMPT.encode()
    buffer = (llama_cpp.llama_token * 256)()
    prompt = list(buffer[: llama_cpp.llama_tokenize(vocab, text, len(text), buffer, 256, False, True)])
    batch = llama_cpp.llama_batch_init(512, 0, 1)

    def decode(ctx: llama_cpp.llama_context_p, tokens: list[int], start: int) -> np.ndarray:
        """Logits of every token (rows), in one step."""
        for i, token in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, start + i, 1, 1
            batch.seq_id[i][0] = 0
        batch.n_tokens = len(tokens)
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed")
        rows = [llama_cpp.llama_get_logits_ith(ctx, i) for i in range(len(tokens))]
        return np.array([np.ctypeslib.as_array(row, shape=(n_vocab,)) for row in rows])

    def context(flash_attn: int) -> llama_cpp.llama_context_p:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = 1024, 512, 512, 1
        params.n_threads = params.n_threads_batch = 2
        params.flash_attn_type = flash_attn
        return llama_cpp.llama_init_from_model(model, params)

    def rows_in_steps(flash_attn: int, tokens: list[int], size: int) -> np.ndarray:
        ctx = context(flash_attn)
        decode(ctx, prompt, 0)
        rows = np.concatenate([decode(ctx, tokens[j : j + size], len(prompt) + j) for j in range(0, len(tokens), size)])
        llama_cpp.llama_free(ctx)
        return rows

    ctx = context(ON)
    out = [int(decode(ctx, prompt, 0)[-1].argmax())]
    for k in range(63):
        out.append(int(decode(ctx, [out[-1]], len(prompt) + k)[-1].argmax()))
    llama_cpp.llama_free(ctx)
    reference = rows_in_steps(ON, out, 1)
    for name, mode in (("on", ON), ("off", OFF)):
        for size in (1, 4, 64):
            rows = rows_in_steps(mode, out, size)
            diff = np.abs(rows - reference)
            flips = int((rows.argmax(1) != reference.argmax(1)).sum())
            print(
                f"flash attention {name:3}, steps of {size:2}: max {diff.max():.3f}  mean {diff.mean():.4f}  flips {flips}"
            )


if __name__ == "__main__":
    main()
