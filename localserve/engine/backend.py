"""Backend interfaces. A generative backend runs one forward pass per step over
the tokens the scheduler chose; it never decides what runs."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from localserve.engine.types import Capacity, SamplingParams, StepPlan, StepResult
from localserve.errors import InvalidRequestError

if TYPE_CHECKING:
    import llguidance

ItemT = TypeVar("ItemT")
OutputT = TypeVar("OutputT")


@dataclass(frozen=True, slots=True)
class BackendInfo:
    """What the dashboard and `/v1/models` show about a loaded backend."""

    backend: str  # "llamacpp", "onnx", "openvino", ...
    device: str  # "CPU", "CUDA", "NPU", ...
    model_path: str
    architecture: str = ""
    num_params: int = 0
    n_ctx_train: int = 0


class Tokenizer(ABC):
    """Text <-> token ids for one model, plus what the chat API needs."""

    @abstractmethod
    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]: ...

    @abstractmethod
    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token contributes to the output text (special tokens: b"")."""

    def decode(self, token_ids: Sequence[int]) -> str:
        return b"".join(self.token_bytes(t) for t in token_ids).decode("utf-8", errors="replace")

    @property
    @abstractmethod
    def eog_token_ids(self) -> frozenset[int]:
        """End-of-generation tokens (EOS, EOT, <|im_end|>, ...)."""

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @property
    def bos_token(self) -> str:
        return ""

    @property
    def eos_token(self) -> str:
        return ""

    @property
    def chat_template(self) -> str | None:
        """The model's own Jinja chat template, if it has one."""
        return None

    def token_text(self, token_id: int) -> str:
        return self.token_bytes(token_id).decode("utf-8", errors="replace")

    def guidance_tokenizer(self) -> llguidance.LLTokenizer:
        """This vocabulary for the grammar engine (backends/constraints.py);
        built once (about half a second), then shared. Safe from any thread."""
        raise InvalidRequestError("this model's tokenizer cannot constrain output (no grammar support)")


class GenerativeBackend(ABC):
    """A loaded generative model driven step by step by the scheduler.

    Threads: `warm_up`, `execute`, `release`, `clear_slots` and
    `set_cpu_threads` are called by
    the model's step thread only, so their state needs no locks; `execute` must treat the
    batch as one forward pass. `capacity`, `tokenizer`, `info` and `metadata`
    give what was fixed at load and may be called from any thread. `validate`
    runs on a worker thread, beside steps, and must touch no state a step
    uses. `close` is called once, after the step thread has ended.
    """

    @abstractmethod
    def capacity(self) -> Capacity: ...

    @abstractmethod
    def tokenizer(self) -> Tokenizer: ...

    @abstractmethod
    def info(self) -> BackendInfo: ...

    def warm_up(self) -> None:
        """Run the model once before the first request, so that it does not
        pay for the weights' first touch. Called on the step thread, before
        its first step: a runtime whose thread team belongs to the calling
        thread (llama.cpp's OpenMP) must first compute there, never on the
        thread that loaded the model (see backends/llamacpp/devices.py)."""
        return None

    def cpu_threads(self) -> int:
        """The CPU threads a step computes on, when the count may change
        between steps (`set_cpu_threads`, driven by engine/threads.py); 0 when
        it is fixed at load (ONNX Runtime's intra-op pool, OpenVINO's compiled
        model) or the CPU does not compute the steps."""
        return 0

    def set_cpu_threads(self, threads: int) -> None:  # noqa: B027 - optional hook
        """Compute the next steps on `threads` (1..the count at load)."""

    @abstractmethod
    def execute(self, batch: StepPlan) -> StepResult:
        """Apply `batch.kv_ops`, run one forward pass over every chunk, sample
        one token for each chunk with `sample=True`, and drop the sampler
        state of `batch.released_seq_ids`."""

    @abstractmethod
    def release(self, seq_ids: Collection[int]) -> None:
        """Drop per-sequence state (samplers) of sequences that ended."""

    @abstractmethod
    def clear_slots(self, slots: Collection[int]) -> None:
        """Empty KV slots entirely (after a failed step, on preemption)."""

    def metadata(self) -> dict[str, Any]:
        return {}

    def kv_state_identity(self) -> str | None:
        """What a saved KV state of this model depends on (model file, KV
        types and layout, library build), if the backend can save and restore
        a slot's state (KvOp "save" / "restore"); None: it cannot, and the
        prefix cache has no disk tier for it."""
        return None

    def validate(self, params: SamplingParams) -> None:
        """Raise InvalidRequestError for what this backend could not sample
        with (e.g. a grammar that does not compile), so that a request is
        refused with a 400 before it is queued, not failed inside a step."""
        return None

    @abstractmethod
    def close(self) -> None: ...


class OneShotBackend(ABC, Generic[ItemT, OutputT]):
    """A model that answers each item in one call: embeddings, speech
    recognition, reranking. Driven by `engine.oneshot.queue.OneShotQueue`.

    Only the queue's thread calls `run`, so implementations need no locks.
    `item_size` and `group_key` may be called from any thread.
    """

    #: True when `run` packs items without padding (llama.cpp's ragged batch):
    #: then the queue never splits a dispatch into length groups.
    padding_free: bool = False

    @abstractmethod
    def run(self, items: Sequence[ItemT]) -> list[OutputT]:
        """One output per item, in the items' order."""

    def item_size(self, item: ItemT) -> int:
        """The cost of one item in the unit of `max_batch_tokens` (tokens,
        audio frames); also what length grouping sorts by."""
        return 1

    def group_key(self, item: ItemT) -> Hashable:
        """Items with different keys never share a `run` call (e.g. Whisper
        language/task/prompt)."""
        return None

    def cpu_threads(self) -> int:
        """As `GenerativeBackend.cpu_threads`: the CPU threads a `run`
        computes on when the count may change between runs; 0 when fixed."""
        return 0

    def set_cpu_threads(self, threads: int) -> None:  # noqa: B027 - optional hook
        """Compute the next runs on `threads` (1..the count at load); the
        queue's thread calls it between runs."""

    @abstractmethod
    def info(self) -> BackendInfo: ...

    def close(self) -> None:  # noqa: B027 - optional hook
        """Free native resources; the backend is not used afterwards."""
