"""Lenient readers of JSON fields: a missing or odd value gives the default."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def num(data: Mapping[str, Any], key: str, default: float = 0.0) -> float:
    value = data.get(key, default)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default


def opt(data: Mapping[str, Any], key: str) -> float | None:
    """A figure that may be missing (None: not measured)."""
    value = data.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def int_(data: Mapping[str, Any], key: str) -> int:
    return int(num(data, key))


def str_(data: Mapping[str, Any], key: str) -> str:
    value = data.get(key)
    return value if isinstance(value, str) else ""


def map_(data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = data.get(key)
    return value if isinstance(value, Mapping) else {}


def list_(data: Mapping[str, Any], key: str) -> list[Any]:
    value = data.get(key)
    return value if isinstance(value, list) else []
