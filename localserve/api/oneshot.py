"""What the embeddings and audio routes share: their route prefixes."""

from __future__ import annotations
