"""A scripted backend and a step driver for synchronous scheduler tests.

The backend keeps a simulated KV cache per slot and samples every token from
what that slot holds, as a real model would: if the scheduler's KV edits or
positions were wrong, a request's tokens would differ from a run of it alone.
The driver runs the step loop (docs/architecture.md) on a fake clock and checks, after
every step, that the scheduler's view of the KV cache is the backend's, and
after every change that its queue counts (`num_new`, `num_held`: the queue
limit's) are what a schedule() has seen. Each
step takes `step_s` seconds, or with a `step_cost` the time that function
gives for its tokens and sequences, and the scheduler is told so, as the
worker tells it the measured time of a real step.
"""

from __future__ import annotations

import array
import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from localserve.engine.step.output_processor import OutputProcessor
from localserve.engine.step.prefix_disk import DiskPrefixStore
from localserve.engine.step.scheduler import Scheduler, SchedulerConfig
from localserve.engine.step.sequence import SeqStatus
from localserve.engine.types import (
    Capacity,
    GenerateRequest,
    KvOp,
    KvOpKind,
    SampledToken,
    SamplingParams,
    SeqChunk,
    StepPlan,
    StepResult,
    TokenEvent,
)

EOS = 999
VOCAB = 500  # the default script samples below this, so never EOS

NextToken = Callable[[tuple[int, ...]], int]
StepCost = Callable[[int, int], float]  # (tokens, sequences) -> seconds


def linear_cost(fixed_s: float, per_token_s: float, per_seq_s: float) -> StepCost:
    """A step that costs `fixed_s` plus `per_token_s` a token plus `per_seq_s` a sequence."""
    return lambda num_tokens, num_seqs: fixed_s + per_token_s * num_tokens + per_seq_s * num_seqs


def token_bytes(token_id: int) -> bytes:
    return b"" if token_id == EOS else b"t%d " % token_id


def hashed_next_token(history: tuple[int, ...]) -> int:
    """A token that depends on the whole history (prompt + prior outputs)."""
    value = 17
    for token in history:
        value = (value * 31 + token + 1) % 1_000_003
    return value % VOCAB


def scripted_outputs(num_prompt_tokens: int, outputs: list[int]) -> NextToken:
    """The i-th output token is outputs[i] (then hashed tokens)."""

    def next_token(history: tuple[int, ...]) -> int:
        index = len(history) - num_prompt_tokens
        return outputs[index] if index < len(outputs) else hashed_next_token(history)

    return next_token


def make_capacity(
    *,
    num_slots: int = 4,
    step_tokens: int = 64,
    kv_size: int = 1024,
    n_ctx: int = 128,
    max_draft_tokens: int = 0,
    has_draft_model: bool = False,
    slot_streams: bool = False,
) -> Capacity:
    return Capacity(num_slots, step_tokens, kv_size, n_ctx, max_draft_tokens, has_draft_model, slot_streams)


def prompt(start: int, length: int) -> list[int]:
    return list(range(start, start + length))


class FakeClock:
    """`clock=` for the scheduler; the driver advances it one step at a time."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class ScriptedBackend:
    """Applies KV edits and chunks to simulated slots; checks their positions."""

    def __init__(
        self, capacity: Capacity, next_token: NextToken = hashed_next_token, draft_token: NextToken | None = None
    ) -> None:
        self.capacity = capacity
        self.next_token = next_token
        self.draft_token = draft_token  # a draft model (Capacity.has_draft_model): proposes greedily
        self.slots: list[list[int]] = [[] for _ in range(capacity.num_slots)]
        self.released_seq_ids: set[int] = set()
        self.num_drafted = self.num_accepted = 0

    def kv_used(self) -> int:
        return sum(len(tokens) for tokens in self.slots)

    def execute(self, batch: StepPlan) -> StepResult:
        self._check_batch(batch)
        self.saved: dict[str, tuple[int, bytes]] = {}
        for op in batch.kv_ops:
            self._apply(op)
        sampled, accepted, drafted = {}, {}, {}
        for chunk in batch.chunks:
            model_drafts = self._draft(chunk)
            if model_drafts:
                drafted[chunk.seq_id] = len(model_drafts)
                chunk = dataclasses.replace(
                    chunk, token_ids=chunk.token_ids + tuple(model_drafts), num_draft=len(model_drafts)
                )
            history = self._append(chunk)
            if chunk.sample:
                base = len(history) - chunk.num_draft
                token = sampled[chunk.seq_id] = SampledToken(self.next_token(history[:base]))
                if chunk.num_draft:  # verify as the llama.cpp backend does: sample while the draft matched
                    more: list[SampledToken] = []
                    for i, draft in enumerate(chunk.token_ids[len(chunk.token_ids) - chunk.num_draft :]):
                        if token.token_id != draft:
                            break
                        token = SampledToken(self.next_token(history[: base + i + 1]))
                        more.append(token)
                    accepted[chunk.seq_id] = tuple(more)
                    del self.slots[chunk.slot][base + len(more) :]  # the rejected drafts' cells go
                    self.num_drafted += chunk.num_draft
                    self.num_accepted += len(more)
        assert self.kv_used() <= self.capacity.kv_size, f"KV overflow: {self.kv_used()} cells"
        self.released_seq_ids.update(batch.released_seq_ids)
        return StepResult(sampled, accepted=accepted, drafted=drafted, saved=self.saved)

    def _draft(self, chunk: SeqChunk) -> list[int]:
        """The draft model's greedy proposal after the chunk's tokens."""
        if not chunk.draft_model_tokens:
            return []
        assert self.draft_token is not None and self.capacity.has_draft_model, "drafts asked of no draft model"
        history = list(self.slots[chunk.slot]) + list(chunk.token_ids)
        out: list[int] = []
        for _ in range(chunk.draft_model_tokens):
            out.append(self.draft_token(tuple(history + out)))
        return out

    def _check_batch(self, batch: StepPlan) -> None:
        assert batch.num_tokens <= self.capacity.step_tokens, f"step of {batch.num_tokens} tokens"
        assert len(batch.chunks) <= self.capacity.num_slots
        assert len({c.slot for c in batch.chunks}) == len(batch.chunks), "two chunks in one slot"
        assert len({c.seq_id for c in batch.chunks}) == len(batch.chunks), "two chunks of one sequence"
        finished = self.released_seq_ids | set(batch.released_seq_ids)
        assert not finished & {c.seq_id for c in batch.chunks}, "a finished sequence was scheduled"

    def _apply(self, op: KvOp) -> None:
        slot = self.slots[op.slot]
        if op.kind == KvOpKind.KEEP:
            assert op.num_tokens <= len(slot), f"keep {op.num_tokens} of {len(slot)} cells"
            del slot[op.num_tokens :]
        elif op.kind == KvOpKind.COPY:
            source = self.slots[op.src]
            assert op.src != op.slot and op.num_tokens <= len(source), f"bad copy {op}"
            self.slots[op.slot] = source[: op.num_tokens]
        elif op.kind == KvOpKind.SAVE:  # the "state" of a slot is its tokens, as int32s
            assert op.key and op.num_tokens <= len(slot), f"bad save {op}"
            del slot[op.num_tokens :]
            self.saved[op.key] = (op.num_tokens, array.array("i", slot).tobytes())
        elif op.kind == KvOpKind.RESTORE:
            restored = array.array("i")
            restored.frombytes(op.payload)
            assert len(restored) >= op.num_tokens, f"bad restore {op}"
            self.slots[op.slot] = list(restored)[: op.num_tokens]  # the cells the new prompt shares
        else:
            raise AssertionError(f"unknown KV op {op.kind!r}")

    def _append(self, chunk: SeqChunk) -> tuple[int, ...]:
        slot = self.slots[chunk.slot]
        assert chunk.token_ids, "empty chunk"
        assert chunk.start_pos == len(slot), f"chunk at {chunk.start_pos}, slot holds {len(slot)}"
        slot.extend(chunk.token_ids)
        assert len(slot) < self.capacity.n_ctx, "a slot outgrew the context"
        return tuple(slot)


@dataclass
class RequestRecord:
    """What a client of one request has received so far."""

    num_prompt_tokens: int
    events: list[TokenEvent] = field(default_factory=list)
    finish_time: float | None = None

    @property
    def token_ids(self) -> list[int]:
        return [t for e in self.events for t in e.token_ids]

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events)

    @property
    def last(self) -> TokenEvent:
        return self.events[-1]

    @property
    def finished(self) -> bool:
        return bool(self.events) and self.last.finished


class Driver:
    """The step loop (schedule, execute, update, output processing) on a fake clock."""

    def __init__(
        self,
        capacity: Capacity,
        *,
        config: SchedulerConfig | None = None,
        next_token: NextToken = hashed_next_token,
        step_s: float = 1.0,
        step_cost: StepCost | None = None,
        draft_token: NextToken | None = None,
        disk: DiskPrefixStore | None = None,
    ) -> None:
        self.clock = FakeClock()
        self.step_s = step_s
        self.step_cost = step_cost
        self.backend = ScriptedBackend(capacity, next_token, draft_token)
        self.disk = disk
        output = OutputProcessor(eog_token_ids={EOS}, token_bytes=token_bytes, n_ctx=capacity.n_ctx)
        self.scheduler = Scheduler(capacity, config=config, clock=self.clock, disk=disk, output=output)
        self.records: dict[str, RequestRecord] = {}
        self.seq_ids: dict[str, int] = {}
        self.batches: list[StepPlan] = []
        self.scheduled_seq_ids: set[int] = set()  # every sequence a schedule() has seen

    def add(self, request_id: str, prompt_token_ids: Iterable[int], *, priority: float = 1.0, **sampling) -> None:  # type: ignore[no-untyped-def]
        token_ids = list(prompt_token_ids)
        request = GenerateRequest(request_id, token_ids, SamplingParams(**sampling), priority)
        self.scheduler.add(request)
        self.seq_ids[request_id] = next(s.seq_id for s in self.scheduler.sequences() if s.request_id == request_id)
        self.records[request_id] = RequestRecord(len(token_ids))
        self._check_queue()

    def abort(self, request_id: str) -> TokenEvent | None:
        event = self.scheduler.abort(request_id)
        if event is not None:
            self._record(event)
        self._check_queue()
        return event

    def step(self) -> StepPlan:
        self.scheduled_seq_ids.update(s.seq_id for s in self.scheduler.sequences())
        deadline = time.monotonic() + 10
        while not self.scheduler.has_ready_work():  # as the worker sleeps until the disk tier's reader wakes it
            assert time.monotonic() < deadline, "a prefix read from disk never finished"
            time.sleep(0.001)
        batch = self.scheduler.schedule()
        assert not batch.empty, "schedule() planned an empty step with work ready"
        self._check_queue()
        result = self.backend.execute(batch)
        if self.disk is not None:  # as the worker does: the saved states go to the disk tier's writer
            for key, (num_tokens, payload) in result.saved.items():
                self.disk.put(key, num_tokens, payload)
            self.disk.flush()
        seconds = self.step_s if self.step_cost is None else self.step_cost(batch.num_tokens, len(batch.chunks))
        self.clock.advance(seconds)
        for event in self.scheduler.update(batch, dataclasses.replace(result, seconds=seconds)):
            self._record(event)
        self._check_kv_agrees()
        self._check_queue()
        self.batches.append(batch)
        return batch

    def run(self, max_steps: int = 2000) -> None:
        for _ in self.steps(max_steps):
            pass

    def steps(self, max_steps: int = 2000) -> Iterator[StepPlan]:
        """Step until no work is left, yielding each batch."""
        for _ in range(max_steps):
            if not self.scheduler.has_work():
                return
            yield self.step()
        raise AssertionError(f"requests still unfinished after {max_steps} steps")

    def chunk(self, batch: StepPlan, request_id: str) -> SeqChunk | None:
        seq_id = self.seq_ids[request_id]
        return next((c for c in batch.chunks if c.seq_id == seq_id), None)

    def is_decode(self, chunk: SeqChunk) -> bool:
        """A chunk that feeds back one sampled token (not a prompt chunk)."""
        request_id = next(r for r, s in self.seq_ids.items() if s == chunk.seq_id)
        num_fed = len(chunk.token_ids) - chunk.num_draft
        return num_fed == 1 and chunk.start_pos >= self.records[request_id].num_prompt_tokens

    def running_request_ids(self) -> set[str]:
        return {s.request_id for s in self.scheduler.sequences() if s.status is SeqStatus.RUNNING}

    def _record(self, event: TokenEvent) -> None:
        record = self.records[event.request_id]
        record.events.append(event)
        if event.finished:
            record.finish_time = self.clock.now

    def _check_queue(self) -> None:
        waiting = [s for s in self.scheduler.sequences() if s.status is SeqStatus.WAITING]
        num_new = sum(1 for s in waiting if s.seq_id not in self.scheduled_seq_ids)
        assert (self.scheduler.num_new, self.scheduler.num_held) == (num_new, len(waiting) - num_new)

    def _check_kv_agrees(self) -> None:
        assert self.scheduler.kv_used() == self.backend.kv_used(), "scheduler and backend disagree on KV use"
        for seq in self.scheduler.sequences():
            if seq.status is SeqStatus.RUNNING:
                in_slot = self.backend.slots[seq.slot]
                assert in_slot == seq.token_ids[: seq.num_computed_tokens], f"slot {seq.slot} holds other tokens"


def run_alone(prompt_token_ids: list[int], next_token: NextToken = hashed_next_token, **sampling) -> list[int]:  # type: ignore[no-untyped-def]
    """The tokens a request gets with the server to itself and room to spare."""
    driver = Driver(make_capacity(num_slots=1, step_tokens=1024), next_token=next_token)
    driver.add("alone", prompt_token_ids, **sampling)
    driver.run()
    return driver.records["alone"].token_ids
