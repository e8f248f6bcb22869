"""Plain types that cross the boundary between the event loop, the step thread
and the backends. Frozen where shared, slotted everywhere."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

#: Named priority levels. Lower is sooner; any float is accepted.
PRIORITY_ALIASES: dict[str, float] = {"interactive": 0.0, "default": 1.0, "batch": 2.0}
MIN_PRIORITY = 0.0
MAX_PRIORITY = 10.0


def parse_priority(value: str | float | int | None) -> float:
    """Turn an alias or a number into a priority in [MIN_PRIORITY, MAX_PRIORITY]."""
    if value is None:
        return PRIORITY_ALIASES["default"]
    if isinstance(value, str):
        if value in PRIORITY_ALIASES:
            return PRIORITY_ALIASES[value]
        try:
            value = float(value)
        except ValueError:
            names = ", ".join(PRIORITY_ALIASES)
            raise ValueError(f"priority must be a number or one of {names}; got {value!r}") from None
    number = float(value)
    if not MIN_PRIORITY <= number <= MAX_PRIORITY:
        raise ValueError(f"priority must be between {MIN_PRIORITY:g} and {MAX_PRIORITY:g}; got {number:g}")
    return number


def priority_class(priority: float) -> str:
    """The alias a priority is counted under in stats (nearest level at or below)."""
    if priority < PRIORITY_ALIASES["default"]:
        return "interactive"
    if priority < PRIORITY_ALIASES["batch"]:
        return "default"
    return "batch"


class FinishReason(enum.StrEnum):
    """Why a sequence ended; values are OpenAI's finish reasons where one exists."""

    STOP = "stop"  # EOS/EOG token or a stop string
    LENGTH = "length"  # max_tokens or the context size
    ABORT = "abort"  # client went away or cancelled
    ERROR = "error"  # the backend failed in a step with this sequence


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick tokens. `temperature == 0` is greedy."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0
    min_p: float = 0.0
    typical_p: float = 1.0  # locally typical sampling; 1: off
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int = 64
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None  # None: off; 0..20: top alternatives per token
    grammar: str | None = None  # an llguidance grammar (serving/grammar.py); constrains every sampled token
    logit_bias: tuple[tuple[int, float], ...] = ()
    speculative: bool = True  # may draft tokens when the model speculates (`"speculative": false` turns it off)
    # false: the whole prompt is computed, no cached prefix reused (llama-server's `cache_prompt`); a cached prompt
    # computes its last token alone and rounds differently (README, Sampling defaults: exact repeats)
    cache_prompt: bool = True
    think_budget: int | None = (
        None  # a reasoning model's thinking tokens before </think> is forced (serving/reasoning.py)
    )
    think_opened: bool = False  # the prompt opened the think section (the output starts inside it)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token_id, logprob), best first


@dataclass(frozen=True, slots=True)
class SampledToken:
    token_id: int
    logprob: TokenLogprob | None = None
    ends: bool = False  # the grammar is complete: this (end-of-generation) token ends the sequence


@dataclass(slots=True)
class GenerateRequest:
    """One generation asked of one model."""

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    priority: float = PRIORITY_ALIASES["default"]


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """What a request's consumer receives after a step: new tokens and text,
    and on the last event the finish reason and the counts for `usage`."""

    request_id: str
    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()
    finish_reason: FinishReason | None = None
    error: str | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    num_draft_tokens: int = 0  # drafts verified for this request so far (speculative decoding)
    num_accepted_tokens: int = 0  # ... and accepted

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True, slots=True)
class Capacity:
    """What a generative backend can hold and compute in one step."""

    num_slots: int  # KV slots (llama.cpp sequence ids)
    step_tokens: int  # token budget of one step
    kv_size: int  # KV cells shared by all slots
    n_ctx: int  # the longest sequence one slot may hold
    max_draft_tokens: int = 0  # drafts a decode chunk may carry for verification; 0: the backend cannot
    has_draft_model: bool = False  # the backend can draft with a model of its own (SeqChunk.draft_model_tokens)
    # Each slot is a KV stream of its own (llama.cpp without a unified KV): a step is computed as
    # one forward pass per run of consecutive busy slots with as many tokens each, so a sequence's
    # drafts beside others take a pass of their own, and so does each gap between busy slots.
    slot_streams: bool = False


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Settings of one model's scheduler (see `scheduler` and `batch_policy`)."""

    aging_s: float = 30.0  # seconds of waiting that gain one priority level
    preempt_margin: float = 0.5  # priority levels a waiter must lead by to preempt
    enable_prefix_cache: bool = True
    batch_priority: float = 2.0  # priorities at or past this are `batch` work
    reserved_slots: int | None = None  # slots that are interactive work's first claim; None: num_slots // 8
    # Batch work beside interactive work: a shared step may take at most
    itl_target: float = 1.2  # x the predicted step of the interactive work alone (its inter-token latency)
    ttft_target: float = 1.5  # ... and keep an arriving prompt's first token within this x its step alone
    # Batch work runs alone (all slots, the whole budget) once no other work has
    # run or waited for `quiet_gaps` mean gaps between other requests' arrivals,
    # at most `max_quiet_s` seconds (a gap longer than that is not a stream).
    quiet_gaps: float = 3.0
    max_quiet_s: float = 30.0
    step_memory: int = 500  # steps the step-time model learns from (exponential forgetting)
    speculative: str = "off"  # "off" | "ngram" (prompt lookup) | "draft" (the backend's draft model): speculation.py
    draft_max: int = 8  # drafts one sequence may carry into a step


@dataclass(frozen=True, slots=True)
class SeqChunk:
    """Tokens of one sequence fed in one step, at positions start_pos.. ."""

    seq_id: int  # stable id of the sequence (survives preemption)
    slot: int  # KV slot the tokens go to
    token_ids: tuple[int, ...]
    start_pos: int
    sample: bool  # a token is sampled after the last one
    sampling: SamplingParams
    num_draft: int = 0  # the last `num_draft` tokens are drafts to verify (sampled at each, see speculation.py)
    draft_model_tokens: int = 0  # the backend's draft model proposes up to this many drafts after the last token


class KvOpKind(enum.StrEnum):
    """What a `KvOp` does to its slot."""

    KEEP = "keep"
    COPY = "copy"
    SAVE = "save"
    RESTORE = "restore"


@dataclass(frozen=True, slots=True)
class KvOp:
    """A KV-cache edit applied before the step's forward pass, in order.

    `keep`: drop every cell of `slot` from position `num_tokens` on.
    `copy`: make `dst` share the first `num_tokens` cells of `src` (after
    clearing `dst`).
    `save`: keep the first `num_tokens` cells of `slot` (drop the rest) and
    copy their state out, for the disk tier under `key` (StepResult.saved).
    `restore`: clear `slot`, load `payload` (a saved state of at least
    `num_tokens` cells) into it, and keep its first `num_tokens` cells.
    """

    kind: KvOpKind
    slot: int
    num_tokens: int
    src: int = -1
    key: str = ""  # save, restore: the disk tier's key
    payload: bytes | memoryview = field(default=b"", repr=False)  # restore: the saved state (a view: no copy)


@dataclass(frozen=True, slots=True)
class StepPlan:
    """Everything one step computes: KV edits, then one forward pass."""

    step_id: int
    kv_ops: tuple[KvOp, ...]
    chunks: tuple[SeqChunk, ...]
    released_seq_ids: tuple[int, ...] = ()  # sequences whose sampler state can go

    @property
    def num_tokens(self) -> int:
        """Tokens the forward pass computes, drafts of a draft model included."""
        return sum(len(c.token_ids) + c.draft_model_tokens for c in self.chunks)

    @property
    def empty(self) -> bool:
        return not self.chunks


@dataclass(frozen=True, slots=True)
class StepResult:
    """Sampled tokens by seq_id for every chunk with `sample=True`, and the
    sequences the backend refused alone (e.g. a grammar that does not
    compile) with the reason; those end with an error, the rest go on.

    A chunk with drafts: `sampled` is the token after its last non-draft
    token; `accepted[seq_id]` holds one more sampled token per draft accepted
    (the draft equalled the token sampled before it), in order. The backend
    has removed the KV cells of the drafts that were not accepted."""

    sampled: dict[int, SampledToken]
    failed: dict[int, str] = field(default_factory=dict)
    accepted: dict[int, tuple[SampledToken, ...]] = field(default_factory=dict)
    drafted: dict[int, int] = field(default_factory=dict)  # drafts the backend's draft model proposed, by seq_id
    saved: dict[str, tuple[int, bytes]] = field(default_factory=dict)  # save ops: key -> (tokens, state)
    restore_s: float = 0.0  # seconds the step's restore ops took
    restore_failed: tuple[
        int, ...
    ] = ()  # slots whose restore the backend refused: left empty, their chunks not computed
    # Set by the step thread, not the backend: the step's measured seconds, and
    # why it failed when `execute` raised (then nothing else is set)
    seconds: float | None = None
    error: str | None = None
