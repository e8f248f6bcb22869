"""How much of each step `batch` work may take, decided by measurement.

Batch work (priority at or past `SchedulerConfig.batch_priority`) runs in
one of two modes:

* **alone**: no other (interactive or default) request has run or waited for
  a while (`quiet_s`): batch work is scheduled like any other work, with
  every slot (the reserved ones too, lent until other work wants them back)
  and the whole token budget.
* **shared**: other work runs or waits, or did recently. A batch sequence
  that aging has not yet put ahead of every other request is *limited*: it
  sits out a step that computes another request's prompt (that step is the
  prompt's time to first token), and it joins any other step only while the
  step's predicted time stays within its limit:

  - when other sequences decode in the step: `itl_target` x the predicted
    step of that work alone (their inter-token latency);
  - always: the step without batch work (at least the fixed cost every step
    has) plus (`ttft_target` - 1) x the predicted step of an interactive
    prompt alone (the typical one seen lately): an interactive request that
    arrives while the step runs waits for it, and still gets its first token
    within `ttft_target` x its time when idle.

  Predictions come from `StepTimeModel`, fed every measured step, so the
  same targets admit many batch sequences where an extra sequence costs
  little (a GPU) and few where every sequence lengthens the step (a CPU).

"A while" is measured too: `quiet_gaps` x the mean gap between other
requests' arrivals (at most `max_quiet_s`): under a steady stream of
requests, batch work stays shared between them, so an arrival rarely finds a
long batch step in flight; after the stream ends, batch work widens again.

Pure: no clocks. The scheduler passes the time of its last update and the
worker feeds step times in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from localserve.engine.step.step_model import StepTimeModel
from localserve.engine.types import SchedulerConfig

EWMA_WEIGHT = 0.25  # of the newest arrival gap and interactive prompt length
EPSILON = 1e-9  # float slack when a limit is an exact multiple of a cost


@dataclass(frozen=True, slots=True)
class BatchPolicySnapshot:
    """What the batch policy did in the last step, for the stats endpoints."""

    mode: str = "alone"  # "alone" | "shared"
    step_limit_s: float | None = None  # the predicted-time limit of limited batch work (None: alone)
    quiet_after_s: float = 0.0  # how long after other work batch work runs alone again
    batch_in_step: int = 0  # batch sequences in the last step
    batch_held_back: int = 0  # batch sequences running or waiting that the last step left out
    lent_slots: int = 0  # reserved slots batch work holds now
    num_slots_returned: int = 0  # batch sequences preempted to give a reserved slot back (total)
    predicted_step_s: float = 0.0  # the step-time model's prediction for the last step ...
    measured_step_s: float = 0.0  # ... and what it took
    mean_abs_error_s: float = 0.0  # recent mean |predicted - measured|
    step_fixed_s: float = 0.0  # the model: a step's fixed cost,
    step_per_token_s: float = 0.0  # what each token adds
    step_per_seq_s: float = 0.0  # and what each sequence adds
    num_steps_observed: int = 0


class StepGate:
    """The predicted-time limit of one step for limited batch work."""

    def __init__(self, model: StepTimeModel, limit_s: float) -> None:
        self.model = model
        self.limit_s = limit_s

    @property
    def unlimited(self) -> bool:
        return math.isinf(self.limit_s)

    def num_decodes(self, num_tokens: int, num_seqs: int, wanted: int) -> int:
        """How many of `wanted` one-token sequences fit beside a step of
        `num_tokens` tokens of `num_seqs` sequences."""
        if self.unlimited or wanted <= 0:
            return max(0, wanted)
        a, b, c = self.model.coefficients
        room = self.limit_s - self._cost(num_tokens, num_seqs)
        if b + c <= 0.0:
            return wanted if room >= 0.0 else 0
        return max(0, min(wanted, math.floor(room / (b + c) + EPSILON)))

    def room(self, num_tokens: int, num_seqs: int) -> int:
        """Tokens one more sequence may add to a step of `num_tokens` tokens
        of `num_seqs` sequences (a large number when time is no limit)."""
        if self.unlimited:
            return 1 << 30
        a, b, c = self.model.coefficients
        room = self.limit_s - self._cost(num_tokens, num_seqs) - c
        if b <= 0.0:
            return 1 << 30 if room >= 0.0 else 0
        return max(0, math.floor(room / b + EPSILON))

    def _cost(self, num_tokens: int, num_seqs: int) -> float:
        """The predicted step, counting its fixed cost even before it holds anything."""
        a, b, c = self.model.coefficients
        return a + b * num_tokens + c * num_seqs


def reserved_slots(config: SchedulerConfig, num_slots: int) -> int:
    """Slots that are other work's first claim (batch work holds them only while it runs alone)."""
    if config.reserved_slots is not None:
        return max(0, min(config.reserved_slots, num_slots - 1))
    return num_slots // 8


class BatchPolicy:
    """The mode and the step limits of batch work for one model's scheduler.
    See the module docstring."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.model = StepTimeModel(config.step_memory)
        self.alone = True
        self.num_slots_returned = 0
        self._others_seen_at = -math.inf  # when other work last ran or waited
        self._last_arrival: float | None = None
        self._mean_gap_s: float | None = None
        self._prompt_tokens: float | None = None  # typical interactive prompt computed in one step
        self._last_limit_s: float | None = None
        self._last_step = (0, 0, 0)  # batch in step, held back, lent slots

    def note_arrival(self, now: float) -> None:
        """Another (non-batch) request arrived."""
        if self._last_arrival is not None:
            gap = min(max(0.0, now - self._last_arrival), self.config.max_quiet_s)
            self._mean_gap_s = gap if self._mean_gap_s is None else _ewma(self._mean_gap_s, gap)
        self._last_arrival = now

    def note_prompt(self, num_tokens: int) -> None:
        """Another request's prompt was admitted with `num_tokens` tokens to compute in its first step."""
        self._prompt_tokens = num_tokens if self._prompt_tokens is None else _ewma(self._prompt_tokens, num_tokens)

    def quiet_s(self) -> float:
        """How long after other work batch work runs alone again."""
        if self._mean_gap_s is None:
            return self.config.max_quiet_s
        return min(self.config.max_quiet_s, self.config.quiet_gaps * self._mean_gap_s)

    def update_mode(self, others_present: bool, now: float) -> bool:
        """Set and return whether batch work runs alone in the next step."""
        if others_present:
            self._others_seen_at = now
        self.alone = not others_present and now - self._others_seen_at >= self.quiet_s()
        return self.alone

    def gate(self, num_tokens: int, num_seqs: int, *, others_decoding: bool) -> StepGate:
        """The limit of a step that holds `num_tokens` tokens of `num_seqs`
        sequences of unlimited work (`others_decoding`: some are decodes of
        other requests, whose inter-token latency is at stake)."""
        if self.alone:
            self._last_limit_s = None
            return StepGate(self.model, math.inf)
        a = self.model.coefficients[0]
        base = self.model.predict(num_tokens, num_seqs) if num_seqs else a
        prompt = self.model.predict(round(self._prompt_tokens or 1), 1)
        limit = base + (self.config.ttft_target - 1.0) * prompt
        if others_decoding:
            limit = min(limit, self.config.itl_target * base)
        if not num_seqs:
            # Nothing else is in this step: one batch token always fits, or a
            # step of only limited batch work would come out empty.
            limit = max(limit, self.model.predict(1, 1) * (1 + 1e-6) + 1e-9)
        self._last_limit_s = limit
        return StepGate(self.model, limit)

    def observe_step(self, num_tokens: int, num_seqs: int, seconds: float) -> None:
        self.model.observe(num_tokens, num_seqs, seconds)

    def record_step(self, batch_in_step: int, batch_held_back: int, lent_slots: int) -> None:
        self._last_step = (batch_in_step, batch_held_back, lent_slots)

    def snapshot(self) -> BatchPolicySnapshot:
        a, b, c = self.model.coefficients
        in_step, held_back, lent = self._last_step
        return BatchPolicySnapshot(
            mode="alone" if self.alone else "shared",
            step_limit_s=self._last_limit_s,
            quiet_after_s=self.quiet_s(),
            batch_in_step=in_step,
            batch_held_back=held_back,
            lent_slots=lent,
            num_slots_returned=self.num_slots_returned,
            predicted_step_s=self.model.last_predicted_s,
            measured_step_s=self.model.last_measured_s,
            mean_abs_error_s=self.model.mean_abs_error_s,
            step_fixed_s=a,
            step_per_token_s=b,
            step_per_seq_s=c,
            num_steps_observed=self.model.num_observations,
        )


def _ewma(mean: float, value: float) -> float:
    return mean + EWMA_WEIGHT * (value - mean)
