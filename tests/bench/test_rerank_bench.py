"""The rerank benchmarks' own logic (bench/rerank_peers.py, bench/oneshot_bench.py's
rerank ceiling, bench/readme_tables.py's rerank tables), without servers or timing."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import oneshot_bench, readme_tables, rerank_peers  # noqa: E402


def _tokenizer() -> Any:
    from tokenizers import Tokenizer

    from localserve.models.registry import resolve

    tokenizer = Tokenizer.from_file(str(resolve("all-minilm-l6-v2").path / "tokenizer.json"))
    tokenizer.no_padding()  # as the bench's copy of it: all-MiniLM's pads and cuts to 128
    tokenizer.no_truncation()
    return tokenizer


def test_passages_are_90_to_110_tokens_and_end_at_a_word() -> None:
    tokenizer = _tokenizer()
    lengths = []
    for index in range(64):
        text = rerank_peers.passage(index, tokenizer)
        lengths.append(len(tokenizer.encode(text, add_special_tokens=False).ids))
        words = {w.strip(".,") for w in " ".join(rerank_peers.SENTENCES).split()}
        assert text.split()[-1].strip(".,") in words, text  # whole words only
    assert min(lengths) >= 85 and max(lengths) <= 110, lengths  # a word's pieces may end a few tokens early
    assert len(set(lengths)) > 10, "lengths vary, as real passages do"


def test_every_request_has_its_own_query_and_documents() -> None:
    tokenizer = _tokenizer()
    requests = rerank_peers.workload(0, 3, tokenizer) + rerank_peers.workload(3, 2, tokenizer)
    assert all(len(r.documents) == rerank_peers.DOCUMENTS for r in requests)
    assert len({r.query for r in requests}) == 5
    documents = [d for r in requests for d in r.documents]
    assert len(set(documents)) == len(documents)
    assert rerank_peers.workload(3, 2, tokenizer) == requests[3:], "the same indices give the same requests"
    assert rerank_peers.body(requests[0])["documents"] == list(requests[0].documents)


def _run(clients: int, peer: str, pair: int, system: str, pairs_per_s: float) -> dict[str, Any]:
    return {
        "clients": clients,
        "peer": peer,
        "pair": pair,
        "system": system,
        "load_before_pair": 0.3 + pair / 10,
        "pairs_per_s": pairs_per_s,
        "requests_per_s": pairs_per_s / 32,
        "p50_latency_ms": 1000 / pairs_per_s,
    }


def _runs() -> list[dict[str, Any]]:
    """1 client: optimum the faster peer; 8 clients: torch."""
    speeds = {
        (1, "infinity-optimum"): [(100, 80), (90, 100), (110, 100)],
        (1, "infinity-torch"): [(100, 50), (100, 40), (100, 50)],
        (8, "infinity-optimum"): [(120, 60), (120, 60), (120, 60)],
        (8, "infinity-torch"): [(120, 130), (120, 150), (120, 100)],
    }
    runs = []
    for (clients, peer), pairs in speeds.items():
        for pair, (ours, theirs) in enumerate(pairs):
            order = [("localserve", ours), (peer, theirs)]
            for system, speed in order if pair % 2 == 0 else order[::-1]:
                runs.append(_run(clients, peer, pair, system, speed))
    return runs


def test_summary_takes_the_median_of_paired_ratios_and_marks_the_fastest_peer() -> None:
    cells = rerank_peers.summarize(_runs())
    by = {(c["clients"], c["peer"]): c for c in cells}
    one = by[(1, "infinity-optimum")]
    assert one["ratio_median"] == 1.1  # ratios 1.25, 0.9, 1.1: not the ratio of medians (100 / 100)
    assert (one["ratio_min"], one["ratio_max"]) == (0.9, 1.25)
    assert (one["localserve_pairs_per_s"], one["peer_pairs_per_s"]) == (100, 100)
    assert one["loads_before_pairs"] == [0.3, 0.4, 0.5]
    assert [c["fastest"] for c in cells] == [True, False, False, True]
    assert by[(8, "infinity-torch")]["ratio_median"] == round(120 / 130, 4)
    assert rerank_peers.verdicts(cells) == [
        "1 client(s): localserve / fastest peer (infinity-optimum) = 1.10 -> PASS (goal >= 1.0)",
        "8 client(s): localserve / fastest peer (infinity-torch) = 0.92 -> FAIL (goal >= 1.0)",
    ]
    table = rerank_peers.table(cells)
    assert "| 1 | infinity-optimum (fastest) | 100.0 | 100.0 | **1.10** (0.90-1.25) |" in table
    assert "| 1 | infinity-torch | 100.0 | 50.0 | 2.00 (2.00-2.50) |" in table


def test_summary_leaves_out_an_unfinished_pair() -> None:
    runs = _runs()[:3]  # pair 0 whole, pair 1 only its first run
    (cell,) = rerank_peers.summarize(runs)
    assert cell["pairs"] == 1 and cell["ratio_median"] == 1.25


def test_score_check_is_the_largest_difference_from_localserve() -> None:
    scores = {"localserve": [0.5, 0.25], "infinity-torch": [0.5, 0.2500031], "infinity-optimum": [0.4, 0.3]}
    assert rerank_peers.score_check(scores) == {"infinity-torch": 3.1e-06, "infinity-optimum": 0.1}
    assert rerank_peers.score_check({"infinity-torch": [0.5]}) == {}


def test_help_names_every_option_and_the_reproducing_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        rerank_peers.parse_args(["--help"])
    text = capsys.readouterr().out
    for option in ("--peers", "--clients", "--requests", "--pairs", "--threads", "--infinity-batch-size", "--max-load"):
        assert option in text
    assert "bench/results/rerank-peers.json" in text
    args = rerank_peers.parse_args([])
    assert (args.clients, args.peers, args.requests) == ("1,8", "infinity-optimum,infinity-torch", 16)
    with pytest.raises(SystemExit):
        rerank_peers.peers(rerank_peers.parse_args(["--peers", "fastembed"]))


class _Backend:
    """A padded backend whose run() records the batches it got."""

    def __init__(self) -> None:
        self.batches: list[list[list[int]]] = []

    def item_size(self, item: list[int]) -> int:
        return len(item)

    def run(self, items: list[list[int]]) -> list[int]:
        self.batches.append(list(items))
        return [0] * len(items)


def test_pool_ceiling_sorts_each_window_of_pairs_in_flight_and_tries_each_size() -> None:
    backend = _Backend()
    pairs = [[0] * n for n in (5, 1, 4, 2, 3, 6, 8, 7)]  # two requests of 4 pairs
    rate, size = oneshot_bench.pool_ceiling(backend, pairs, 4, (1, 2, 4, 8))
    assert size in (1, 2, 4) and rate > 0  # 8 is more than can be in flight
    sizes_tried = [len(b) for b in backend.batches]
    # per size: one warm-up batch, then every batch of both windows
    assert sizes_tried == [1] + [1] * 8 + [2] + [2] * 4 + [4] + [4] * 2
    fours = backend.batches[-2:]
    assert [[len(x) for x in b] for b in fours] == [[1, 2, 4, 5], [3, 6, 7, 8]]


def _oneshot_json(tmp_path: Path) -> None:
    cells = []
    for clients, ceiling in ((1, 100.0), (8, 200.0)):
        for r, on in enumerate((96.0, 90.0, 99.0)):
            for mode, speed in (("off", 50.0), ("on", on * ceiling / 100)):
                cells.append(
                    {
                        "table": "throughput",
                        "backend": "cross-encoder (onnxruntime, model.onnx)",
                        "clients": clients,
                        "round": r,
                        "batching": mode,
                        "ceiling_items_per_s": ceiling,
                        "ceiling_batch": 32 if clients == 1 else 64,
                        "items_per_s": speed,
                        "mean_batch": 32.0 if mode == "on" else 1.0,
                        "load_before": 0.2,
                    }
                )
    cells.append({"table": "throughput", "backend": "ONNX Runtime", "clients": 1, "round": 0, "batching": "on"})
    record = {
        "commit": "abc1234",
        "started": "2026-01-02T03:04:05+0000",
        "cpus": 2,
        "args": {"rounds": "3", "rerank_requests": "16"},
        "cells": cells,
    }
    (tmp_path / "oneshot-rerank.json").write_text(json.dumps(record))


def test_readme_tables_render_the_rerank_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cells = rerank_peers.summarize(_runs())
    record = {
        "commit": "abc1234",
        "started": "2026-01-02T03:04:05+0000",
        "cpus": 2,
        "args": {"pairs": "3", "requests": "16", "infinity_batch_size": "32"},
        "request": {"documents": 32, "passage_tokens": [90, 110]},
        "servers": {
            "localserve": {
                "served_as": {"backend": "onnxruntime"},
                "graph": rerank_peers.LOCALSERVE_GRAPH,
                "threads": 2,
            }
        },
        "cells": cells,
    }
    (tmp_path / "rerank-peers.json").write_text(json.dumps(record))
    _oneshot_json(tmp_path)
    monkeypatch.setattr(readme_tables, "RESULTS", tmp_path)

    peers = readme_tables.rerank_peers()
    assert "| 8 | torch (fastest) | 120.0 | 130.0 | **0.92** (0.80-1.20) | 8 / 8 | 0.30, 0.40, 0.50 |" in peers
    assert re.search(r"Commit abc1234, 2026-01-02, 2 cores", peers)
    assert "localserve on onnxruntime, the fused float32 ONNX graph (its default" in peers

    oneshot = readme_tables.oneshot_rerank()
    rows = [line for line in oneshot.splitlines() if line.startswith("| 8192 ")]
    assert rows == [  # a record without --rerank-max-batch-tokens ran the budget served before febc841
        "| 8192 | arrival | 1 | 96.0 | 100.0 (32) | **0.96** (0.90-0.99) | 50.0 | 32.0 | 0.20 |",
        "| 8192 | arrival | 8 | 192.0 | 200.0 (64) | **0.96** (0.90-0.99) | 50.0 | 32.0 | 0.20 |",
    ]
    assert "Commit abc1234" in oneshot and "cross-encoder (onnxruntime, model.onnx)" in oneshot

    readme = tmp_path / "README.md"
    readme.write_text("x\n<!-- table:rerank-peers -->\nstale\n<!-- /table:rerank-peers -->\n")
    monkeypatch.setattr(readme_tables, "README", readme)
    assert readme_tables.main(["--check"]) == 1
    assert readme_tables.main([]) == 0
    assert peers in readme.read_text()
