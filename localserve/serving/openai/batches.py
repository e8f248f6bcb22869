"""The body of `POST /v1/batches` (OpenAI's Batch API), without HTTP."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from localserve.jobs.types import BATCH_ENDPOINTS, COMPLETION_WINDOWS

MAX_METADATA_KEYS, MAX_KEY_CHARS, MAX_VALUE_CHARS = 16, 64, 512


class CreateBatchRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # e.g. output_expires_after: accepted, outputs are kept

    input_file_id: str = Field(min_length=1)
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None

    @field_validator("endpoint")
    @classmethod
    def _check_endpoint(cls, value: str) -> str:
        if value not in BATCH_ENDPOINTS:
            raise ValueError(f"{value!r} is not supported; use one of {', '.join(BATCH_ENDPOINTS)}")
        return value

    @field_validator("completion_window")
    @classmethod
    def _check_window(cls, value: str) -> str:
        if value not in COMPLETION_WINDOWS:
            raise ValueError(f"{value!r} is not supported; use {' or '.join(map(repr, COMPLETION_WINDOWS))}")
        return value

    @field_validator("metadata")
    @classmethod
    def _check_metadata(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is None:
            return None
        if len(value) > MAX_METADATA_KEYS:
            raise ValueError(f"at most {MAX_METADATA_KEYS} keys are allowed")
        for key, text in value.items():
            if len(key) > MAX_KEY_CHARS or len(text) > MAX_VALUE_CHARS:
                raise ValueError(f"keys have at most {MAX_KEY_CHARS} characters and values at most {MAX_VALUE_CHARS}")
        return value
