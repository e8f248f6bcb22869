"""llama-server's `timings` and `prompt_progress` objects, which its native
completion always sends and its chat dialect sends when asked
(`timings_per_token`, `return_progress`)."""

from __future__ import annotations

import time
from typing import Any

from localserve.serving.answer import Answer


def llama_timings(
    *, prompt_n: int, cache_n: int, prompt_ms: float, predicted_n: int, predicted_ms: float
) -> dict[str, Any]:
    """`timings`: `prompt_n` prompt tokens computed (`cache_n` more reused)
    in `prompt_ms`, then `predicted_n` tokens in `predicted_ms`. The first
    token comes with the prompt's last batch, so the generation rate is over
    the n - 1 decode steps after it, as llama-server counts it."""
    num_steps = max(0, predicted_n - 1)
    return {
        "cache_n": cache_n,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": prompt_n / prompt_ms * 1000 if prompt_ms > 0 else 0.0,
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / num_steps if num_steps else 0.0,
        "predicted_per_second": num_steps / predicted_ms * 1000 if num_steps and predicted_ms > 0 else 0.0,
    }


def answer_timings(answer: Answer, index: int = 0) -> dict[str, Any]:
    """`timings` of choice `index` so far: the prompt until its first token, the rest since."""
    now = time.monotonic_ns()
    first = answer.first_token_ns(index) or now
    cache_n = answer.num_cached_tokens(index)
    return llama_timings(
        prompt_n=max(0, answer.num_prompt_tokens(index) - cache_n),
        cache_n=cache_n,
        prompt_ms=(first - answer.submitted_ns) / 1e6,
        predicted_n=len(answer.token_ids(index)),
        predicted_ms=(now - first) / 1e6,
    )


def prompt_progress(*, total: int, cache: int, processed: int, time_ms: float) -> dict[str, Any]:
    """`prompt_progress`: of `total` prompt tokens, `cache` reused and `processed` (cached included) done."""
    return {"total": total, "cache": cache, "processed": processed, "time_ms": time_ms}
