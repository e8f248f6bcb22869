"""The speed guard's own bookkeeping (bench/guard.py, bench/paired.py),
without servers or timing: nested pairs counted per server, rounds merged
per cell."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import guard, paired  # noqa: E402


def _run(tok_s: float, duration_s: float, ttft: float = 100.0) -> dict[str, Any]:
    return {"tok_s": tok_s, "ttft_p50_ms": ttft, "itl_p50_ms": 10.0, "duration_s": duration_s, "loadavg": 0.4}


def test_a_servers_two_halves_count_as_their_tokens_over_their_time() -> None:
    # 100 tok/s for 2 s and 50 tok/s for 2 s: 300 tokens in 4 s, not the mean of the rates
    combined = paired.combine_runs([_run(100.0, 2.0, ttft=80.0), _run(50.0, 4.0, ttft=120.0)])
    assert combined["tok_s"] == round(400 / 6, 2)
    assert combined["duration_s"] == 6.0
    assert combined["ttft_p50_ms"] == 100.0
    assert combined["halves_tok_s"] == [100.0, 50.0]
    assert paired.combine_runs([_run(70.0, 1.0)]) == _run(70.0, 1.0)


def _pair(head: float, base: float) -> dict[str, Any]:
    return {"head": _run(head, 1.0), "base": _run(base, 1.0), "ratio": round(head / base, 4), "first": "head"}


def test_a_confirming_round_adds_its_pairs_to_the_cells_it_measured_again() -> None:
    cells = paired.parse_cells("1,8", "0")
    head, base = paired.Target("head", "", "m"), paired.Target("base", "", "m")

    def half(pairs_by_label: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
        return {
            "cells": [
                paired.summarize_cell(cell, head, base, pairs_by_label[cell.label], 0.4)
                for cell in cells
                if cell.label in pairs_by_label
            ]
        }

    first = [
        (False, half({"1 x greedy": [_pair(90, 100), _pair(92, 100)], "8 x greedy": [_pair(100, 100)]})),
        (True, half({"1 x greedy": [_pair(93, 100)], "8 x greedy": [_pair(101, 100)]})),
    ]
    before = guard.merge_halves(first, cells, head, base)
    assert [c["ratio_median"] for c in before["cells"]] == [0.92, 1.005]
    again = [
        (False, half({"1 x greedy": [_pair(100, 100), _pair(101, 100)]})),
        (True, half({"1 x greedy": [_pair(99, 100)]})),
    ]
    after = guard.merge_halves(first + again, cells, head, base)
    one, eight = after["cells"]
    assert len(one["runs"]) == 6 and len(eight["runs"]) == 2
    assert one["ratio_median"] == (0.93 + 0.99) / 2
    assert [r["started_first"] for r in one["runs"]] == ["head", "head", "base", "head", "head", "base"]
