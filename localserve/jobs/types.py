"""Records of the Files and Batch APIs and their OpenAI wire shapes.

Plain dataclasses: the store reads and writes them, the runner moves them
through their statuses, the API turns them into JSON with `to_openai()`.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass, field
from typing import Any

#: The endpoints a batch may target (the `url` of every input line).
BATCH_ENDPOINTS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/rerank",
    "/v1/score",
    "/v1/classify",
)
COMPLETION_WINDOWS = {"24h": 24 * 3600}
#: Purposes a client may upload with (OpenAI's); outputs get `batch_output`.
UPLOAD_PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")


class BatchStatus(enum.StrEnum):
    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (BatchStatus.FAILED, BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.CANCELLED)

    @property
    def timestamp_field(self) -> str | None:
        """The `*_at` field set when a batch enters this status."""
        return None if self is BatchStatus.VALIDATING else f"{self.value}_at"


#: Statuses a restart picks up again.
UNFINISHED = (
    BatchStatus.VALIDATING,
    BatchStatus.IN_PROGRESS,
    BatchStatus.FINALIZING,
    BatchStatus.CANCELLING,
)


def new_id(prefix: str) -> str:
    """`file-...`, `batch_...`, `batch_req_...` as OpenAI spells them."""
    return f"{prefix}{uuid.uuid4().hex}"


@dataclass(slots=True)
class FileRecord:
    """An uploaded file or a batch's output/error file; the bytes are a blob on disk."""

    id: str
    filename: str
    purpose: str
    num_bytes: int
    created_at: int
    expires_at: int | None = None

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.num_bytes,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
        }


@dataclass(frozen=True, slots=True)
class BatchError:
    """One entry of a batch's `errors.data` (a validation problem)."""

    code: str
    message: str
    line: int | None = None  # 1-based line of the input file
    param: str | None = None

    def to_openai(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "param": self.param, "line": self.line}


@dataclass(slots=True)
class BatchRecord:
    """A batch job: its status with the time it entered each, and its counts."""

    id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: BatchStatus
    created_at: int
    expires_at: int
    metadata: dict[str, str] | None = None
    model: str | None = None
    errors: list[dict[str, Any]] | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    num_total: int = 0
    num_completed: int = 0
    num_failed: int = 0
    usage: dict[str, int] = field(default_factory=dict)  # input_tokens, cached_tokens, output_tokens

    @property
    def num_done(self) -> int:
        return self.num_completed + self.num_failed

    def to_openai(self) -> dict[str, Any]:
        input_tokens = self.usage.get("input_tokens", 0)
        output_tokens = self.usage.get("output_tokens", 0)
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "model": self.model,
            "errors": {"object": "list", "data": self.errors} if self.errors else None,
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status.value,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at,
            "in_progress_at": self.in_progress_at,
            "expires_at": self.expires_at,
            "finalizing_at": self.finalizing_at,
            "completed_at": self.completed_at,
            "failed_at": self.failed_at,
            "expired_at": self.expired_at,
            "cancelling_at": self.cancelling_at,
            "cancelled_at": self.cancelled_at,
            "request_counts": {"total": self.num_total, "completed": self.num_completed, "failed": self.num_failed},
            "usage": {
                "input_tokens": input_tokens,
                "input_tokens_details": {"cached_tokens": self.usage.get("cached_tokens", 0)},
                "output_tokens": output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": input_tokens + output_tokens,
            },
            "metadata": self.metadata,
        }


@dataclass(frozen=True, slots=True)
class LineRef:
    """Where one request of a batch lies in its input file."""

    line_no: int  # 1-based
    custom_id: str
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class LineResult:
    """What the endpoint answered for one line: an HTTP status and a JSON body.
    `retry_after_s` is set when the answer says "not now" (model loading,
    queue full): the runner waits and sends the line again."""

    status_code: int
    body: dict[str, Any]
    request_id: str
    retry_after_s: float | None = None

    def usage(self) -> dict[str, int]:
        """Token counts of a successful answer, in the Batch object's terms."""
        usage = self.body.get("usage") if self.status_code == 200 else None
        if not isinstance(usage, dict):
            return {}
        # Chat and completions count prompt/completion tokens; the Responses API input/output tokens.
        details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
        return {
            "input_tokens": int(usage.get("prompt_tokens") or usage.get("input_tokens") or 0),
            "cached_tokens": int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0,
            "output_tokens": int(usage.get("completion_tokens") or usage.get("output_tokens") or 0),
        }
