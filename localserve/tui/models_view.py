"""The loaded models in a stats snapshot: generative ones with their
priority classes, keep-alive and batch admission, and one-shot ones
(embeddings, speech)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from localserve.tui.fields import int_, map_, num, opt, str_
from localserve.tui.fmt import DASH, fmt_duration, fmt_latency

LATENCY_KINDS = ("ttft", "queue_wait", "itl")


@dataclass(frozen=True, slots=True)
class ClassView:
    """One priority class of one model: p50/p95 of each latency kind over the last minute."""

    num_requests: int = 0  # first tokens in the window
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    queue_wait_p50_s: float | None = None
    queue_wait_p95_s: float | None = None
    itl_p50_s: float | None = None
    itl_p95_s: float | None = None


@dataclass(frozen=True, slots=True)
class KeepAlive:
    """When the server unloads a model (`ollama ps`'s UNTIL)."""

    keep_alive: str = ""  # "forever", "5m", "" when the server does not say
    expires_in_s: float | None = None  # None: in use, or never
    in_use: bool = False

    def describe(self) -> str:
        if not self.keep_alive:
            return DASH
        if self.in_use:
            return "in use"
        if self.expires_in_s is None:
            return self.keep_alive
        return f"in {fmt_duration(self.expires_in_s)}"


@dataclass(frozen=True, slots=True)
class BatchPolicyView:
    """How the scheduler admitted batch work in its last step (`batch_policy`)."""

    mode: str = ""  # "alone": batch work has the model to itself; "shared"; "": not told
    step_limit_s: float | None = None  # the step time batch work may add to while shared
    batch_in_step: int = 0
    batch_held_back: int = 0
    lent_slots: int = 0  # reserved slots batch work holds now

    def describe(self) -> str:
        if self.mode != "shared":
            return "batch: alone, no limit" if self.mode == "alone" else f"batch: {self.mode}" if self.mode else ""
        limit = f" · step limit {fmt_latency(self.step_limit_s)}" if self.step_limit_s is not None else ""
        lent = f" · {self.lent_slots} slots lent" if self.lent_slots else ""
        return f"batch: shared{limit} · {self.batch_in_step} in step, {self.batch_held_back} held back{lent}"


@dataclass(frozen=True, slots=True)
class ModelView:
    model_id: str
    backend: str = ""
    device: str = ""
    running: Mapping[str, int] = field(default_factory=dict)  # priority class -> count
    waiting: Mapping[str, int] = field(default_factory=dict)
    kv_used: int = 0
    kv_size: int = 0
    num_slots: int = 0
    n_ctx: int = 0
    prefix_cache_hit_rate: float = 0.0
    spec_draft_tokens: int = 0  # speculative decoding: drafts verified
    spec_accepted_tokens: int = 0  # ... and accepted
    prefix_disk_hits: int | None = None  # restores from the disk tier; None: no disk tier
    mean_batch_size: float = 0.0
    busy_fraction: float = 0.0
    prefill_tokens_per_s: float = 0.0
    decode_tokens_per_s: float = 0.0
    classes: Mapping[str, ClassView] = field(default_factory=dict)
    keep_alive: KeepAlive = field(default_factory=KeepAlive)
    weights_mib: float = 0.0  # 0: not known
    kv_mib: float = 0.0
    n_gpu_layers: int = 0
    n_layers: int = 0  # 0: not known
    batch_policy: BatchPolicyView = field(default_factory=BatchPolicyView)
    threads: int = 0  # CPU threads its steps compute on (0: not told)
    max_threads: int = 0
    threads_mode: str = ""  # "auto" (engine/threads.py chooses) or "fixed"
    cpu_busy_elsewhere: float = 0.0  # cores other programs kept busy

    @property
    def num_running(self) -> int:
        return sum(self.running.values())

    @property
    def num_waiting(self) -> int:
        return sum(self.waiting.values())

    def of_class(self, name: str) -> ClassView:
        return self.classes.get(name) or ClassView()


@dataclass(frozen=True, slots=True)
class OneShotView:
    """An embeddings or speech model behind its one-shot queue."""

    model_id: str
    kind: str = ""
    queue_items: int = 0
    in_flight: int = 0
    items_per_s: float = 0.0
    mean_batch_size: float = 0.0
    padding_ratio: float = 0.0
    busy_fraction: float = 0.0
    keep_alive: KeepAlive = field(default_factory=KeepAlive)


def parse_model(data: Mapping[str, Any]) -> ModelView:
    def counts(key: str) -> dict[str, int]:
        return {str(k): int(v) for k, v in map_(data, key).items() if isinstance(v, int | float)}

    floats = {
        name: num(data, name)
        for name in (
            "prefix_cache_hit_rate",
            "mean_batch_size",
            "busy_fraction",
            "prefill_tokens_per_s",
            "decode_tokens_per_s",
        )
    }
    options, policy, threads = map_(data, "options"), map_(data, "batch_policy"), map_(data, "threads")
    return ModelView(
        model_id=str_(data, "id"),
        backend=str_(data, "backend"),
        device=str_(data, "device"),
        running=counts("running"),
        waiting=counts("waiting"),
        kv_used=int_(data, "kv_used"),
        kv_size=int_(data, "kv_total"),
        num_slots=int_(data, "max_num_seqs"),
        n_ctx=int_(data, "n_ctx"),
        spec_draft_tokens=int_(data, "spec_draft_tokens"),
        spec_accepted_tokens=int_(data, "spec_accepted_tokens"),
        prefix_disk_hits=int_(data, "prefix_disk_hits") if data.get("prefix_disk") else None,
        classes={str(k): _class(v) for k, v in map_(data, "classes").items() if isinstance(v, Mapping)},
        keep_alive=_keep_alive(data),
        weights_mib=num(options, "weights_mib"),
        kv_mib=num(options, "kv_mib"),
        n_gpu_layers=int_(options, "n_gpu_layers"),
        n_layers=int_(options, "n_layers"),
        batch_policy=BatchPolicyView(
            mode=str_(policy, "mode"),
            step_limit_s=opt(policy, "step_limit_s"),
            batch_in_step=int_(policy, "batch_in_step"),
            batch_held_back=int_(policy, "batch_held_back"),
            lent_slots=int_(policy, "lent_slots"),
        ),
        threads=int_(threads, "in_use"),
        max_threads=int_(threads, "max"),
        threads_mode=str_(threads, "mode"),
        cpu_busy_elsewhere=num(threads, "cpu_busy_elsewhere"),
        **floats,
    )


def _class(data: Mapping[str, Any]) -> ClassView:
    figures = {f"{kind}_p{q}_s": opt(data, f"{kind}_p{q}_s") for kind in LATENCY_KINDS for q in (50, 95)}
    return ClassView(num_requests=int_(data, "num_requests"), **figures)


def _keep_alive(data: Mapping[str, Any]) -> KeepAlive:
    return KeepAlive(
        keep_alive=str_(data, "keep_alive"), expires_in_s=opt(data, "expires_in_s"), in_use=data.get("in_use") is True
    )


def parse_one_shot(model_id: str, data: Mapping[str, Any]) -> OneShotView:
    return OneShotView(
        model_id=str(model_id),
        kind=str_(data, "kind"),
        queue_items=int_(data, "queue_items"),
        in_flight=int_(data, "in_flight"),
        items_per_s=num(data, "items_per_s"),
        mean_batch_size=num(data, "mean_batch_size"),
        padding_ratio=num(data, "recent_padding_ratio"),
        busy_fraction=num(data, "busy_fraction"),
        keep_alive=_keep_alive(data),
    )
