"""The scheduler's monotonic counters, and the one prefill/decode rule."""

from __future__ import annotations

from dataclasses import dataclass

from localserve.engine.types import SeqChunk


@dataclass(slots=True)
class SchedulerCounters:
    """Monotonic counters, read by the step worker for the model's stats
    (rates and the prefix-cache hit rate are derived there)."""

    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens reused from the prefix cache
    num_preemptions: int = 0
    num_draft_tokens: int = 0  # drafted tokens verified (speculative decoding)
    num_accepted_tokens: int = 0  # ... of which accepted

    def count_chunk(self, chunk: SeqChunk, num_prompt_tokens: int | None) -> None:
        """The one prefill/decode rule (the model's stats read these counters):
        a chunk that starts past the prompt (of `num_prompt_tokens`; None: its
        sequence is gone) is decode work, any other chunk prompt work, counted whole."""
        if num_prompt_tokens is not None and chunk.start_pos >= num_prompt_tokens:
            self.num_decode_tokens += len(chunk.token_ids)
        else:
            self.num_prefill_tokens += len(chunk.token_ids)
