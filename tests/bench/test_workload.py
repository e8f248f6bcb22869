"""The load generator's pure parts: request mix, prompts, bodies, percentiles."""

from __future__ import annotations

import math

import pytest

from localserve.bench.report import percentile
from localserve.bench.workload import ClassPicker, RequestClass, Workload, parse_mix, synthetic_prompt


def test_parse_mix_names_classes_after_the_priority_they_send() -> None:
    classes = parse_mix("interactive=0.2,batch=0.8")
    assert classes == (RequestClass("interactive", "interactive", 0.2), RequestClass("batch", "batch", 0.8))
    assert parse_mix("none") == (RequestClass("none", None, 1.0),)
    assert parse_mix("3=1")[0].priority == 3.0


@pytest.mark.parametrize("text", ["", "a=x", "a=-1"])
def test_parse_mix_rejects_bad_input(text: str) -> None:
    with pytest.raises(ValueError):
        parse_mix(text)


def test_class_picker_keeps_the_exact_mix_over_every_prefix() -> None:
    picker = ClassPicker(parse_mix("interactive=0.2,batch=0.8"))
    names = [picker.next().name for _ in range(50)]
    for n in (5, 10, 25, 50):
        assert names[:n].count("interactive") == n // 5


def test_synthetic_prompts_have_the_asked_length_and_differ() -> None:
    a, b = synthetic_prompt(100, seed=1), synthetic_prompt(100, seed=2)
    assert len(a.split()) == 100
    assert a != b
    assert synthetic_prompt(100, seed=1) == a


def test_fixed_output_body_asks_every_server_for_the_exact_length() -> None:
    body = Workload("m", prompt_tokens=8, output_tokens=32).body(7, RequestClass("batch", "batch"))
    assert body["max_tokens"] == body["min_tokens"] == 32
    assert body["ignore_eos"] is True and body["stream"] is True
    assert body["priority"] == "batch"
    assert len(body["prompt"].split()) == 8
    chat = Workload("m", endpoint="chat", fixed_output=False).body(7, RequestClass("default"))
    assert "priority" not in chat and "ignore_eos" not in chat
    assert chat["messages"][0]["role"] == "user"


def test_a_seeded_workload_gives_each_sampled_request_the_seed_of_its_prompt() -> None:
    sampled = Workload("m", temperature=0.7, seeded=True)
    first, again, other = (sampled.body(n, RequestClass("default")) for n in (7, 7, 8))
    assert first["seed"] == again["seed"] != other["seed"]
    assert first["prompt"] == again["prompt"] != other["prompt"]
    assert "seed" not in Workload("m", temperature=0.7).body(7, RequestClass("default"))
    assert "seed" not in Workload("m", temperature=0.0, seeded=True).body(7, RequestClass("default"))
    assert 0 <= sampled.body(3 * 2**40, RequestClass("default"))["seed"] < 2**31


def test_percentile_interpolates_like_numpy() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([5.0], 99) == 5.0
    assert math.isclose(percentile(list(range(101)), 95), 95.0)
    assert math.isnan(percentile([], 50))
