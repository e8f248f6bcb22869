"""What the embeddings and audio routes share: route prefixes and usage."""

from __future__ import annotations

from typing import Any

PREFIXES = ("/v1", "/api/v1")


def usage_tokens(num_tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": num_tokens, "total_tokens": num_tokens}
