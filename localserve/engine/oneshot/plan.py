"""What the one-shot queue sends next, as pure functions: which waiting
items make the next dispatch (priority with aging, size limits), and how a
dispatch splits into `run` groups by length (so padding stays small)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar


class Waiting(Protocol):
    """A waiting item, as far as choosing a dispatch cares."""

    @property
    def priority(self) -> float: ...  # lower is sooner
    @property
    def arrival(self) -> float: ...  # clock seconds
    @property
    def order(self) -> int: ...  # FIFO tie-break: one number per request
    @property
    def size(self) -> int: ...  # tokens or audio frames


W = TypeVar("W", bound=Waiting)


def choose_dispatch(
    waiting: Sequence[W], now: float, *, max_batch_size: int, max_batch_tokens: int, aging_s: float
) -> list[W]:
    """The next dispatch: best effective priority first (the priority minus
    the time waited over `aging_s`, so a low priority waits a bounded time),
    FIFO among equals, up to `max_batch_size` items and `max_batch_tokens` of
    work. An item too big for what is left is skipped for a smaller one; an
    item bigger than `max_batch_tokens` goes alone.

    The items of one request (one `order`) go shortest first: a request that
    takes several dispatches (a rerank of 32 documents in batches of 512
    tokens) then sends items of about one length together, with the least
    padding, as a sort of the whole request would."""

    def rank(item: W) -> tuple[float, int, int]:
        waited = now - item.arrival
        return (item.priority - (waited / aging_s if aging_s > 0 else 0.0), item.order, item.size)

    chosen: list[W] = []
    num_tokens = 0
    for item in sorted(waiting, key=rank):
        if len(chosen) >= max_batch_size:
            break
        if chosen and num_tokens + item.size > max_batch_tokens:
            continue  # a smaller item may still fit
        chosen.append(item)
        num_tokens += item.size
    return chosen


def plan_groups(sizes: Sequence[int], *, by_length: bool, padding_free: bool, max_padding: float) -> list[list[int]]:
    """Split one dispatch (item sizes, in dispatch order) into run() groups of
    indices. Without length grouping, or for a padding-free backend, the
    dispatch is one group; else items are sorted by size and a group closes
    before adding an item would push its padding past `max_padding`."""
    order = sorted(range(len(sizes)), key=lambda i: sizes[i]) if by_length else list(range(len(sizes)))
    if not by_length or padding_free:
        return [order] if order else []
    groups: list[list[int]] = []
    current: list[int] = []
    real = 0
    for i in order:
        size = sizes[i]  # the largest so far: sizes ascend
        padding = (len(current) + 1) * size - (real + size)
        if current and padding > max_padding * (real + size):
            groups.append(current)
            current, real = [], 0
        current.append(i)
        real += size
    if current:
        groups.append(current)
    return groups


def padding_of(sizes: Sequence[int]) -> int:
    """Slots a padded backend adds to run these sizes as one rectangle."""
    return len(sizes) * max(sizes) - sum(sizes) if sizes else 0
