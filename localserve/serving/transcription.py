"""Transcription and translation: audio bytes in, a `Transcript` out.

The audio is decoded and cut at pauses into windows of at most 30 s (off the
event loop), and the windows go to the model's one-shot queue, which runs
them together with the windows of every other request. Rendering the answer
(json, text, srt, vtt, verbose_json) is the caller's: the OpenAI adapter is
`api/openai/audio.py`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Literal

from localserve.backends.speech.common import SpeechBackend, TranscribeOptions, Transcript, decode_audio
from localserve.engine.types import PRIORITY_ALIASES
from localserve.errors import BackendError, InvalidRequestError
from localserve.models.kinds import ModelKind
from localserve.serving.models import ModelHost, hold_oneshot_model

__all__ = ["RESPONSE_FORMATS", "TranscriptionRequest", "Transcript", "check", "transcribe"]

Task = Literal["transcribe", "translate"]

RESPONSE_FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
GRANULARITIES = ("segment", "word")
TIMED_FORMATS = ("srt", "vtt", "verbose_json")  # plain text reads better without timed segments


@dataclass(frozen=True, slots=True)
class TranscriptionRequest:
    """One recording to transcribe (`translate`: into English text).

    `response_format` is the form the caller will write the answer in: it
    decides whether segments are timed, and word timestamps need
    `verbose_json`. `filename` only names the file in error messages."""

    model: str
    audio: bytes
    task: Task = "transcribe"
    language: str | None = None  # None: the model detects it; ignored when translating
    prompt: str | None = None
    temperature: float = 0.0
    timestamp_granularities: tuple[str, ...] = ()
    response_format: str = "json"
    priority: float = PRIORITY_ALIASES["default"]
    filename: str = ""

    @property
    def granularities(self) -> tuple[str, ...]:
        """The timestamp granularities asked for; `segment` when none were."""
        return self.timestamp_granularities or ("segment",)

    def options(self) -> TranscribeOptions:
        """The backend's options for this request's windows."""
        return TranscribeOptions(
            task=self.task,
            language=self.language if self.task == "transcribe" else None,
            prompt=self.prompt,
            temperature=self.temperature,
            timestamps=self.response_format in TIMED_FORMATS,
            word_timestamps="word" in self.granularities,
        )


def check(request: TranscriptionRequest) -> None:
    """400 (`InvalidRequestError`, naming the parameter) for a request that
    cannot be answered, before any model is touched."""
    if not request.model:
        raise InvalidRequestError("Missing required parameter: 'model'.", param="model")
    if not request.audio:
        name = f" {request.filename!r}" if request.filename else ""
        raise InvalidRequestError(f"The audio file{name} is empty (0 bytes); send a recording.", param="file")
    if request.task not in ("transcribe", "translate"):
        raise InvalidRequestError(f"task must be 'transcribe' or 'translate'; got {request.task!r}", param="task")
    if request.response_format not in RESPONSE_FORMATS:
        raise InvalidRequestError(
            f"'response_format' must be one of {', '.join(RESPONSE_FORMATS)}; got {request.response_format!r}",
            param="response_format",
        )
    if not 0.0 <= request.temperature <= 1.0:
        raise InvalidRequestError(
            f"'temperature' must be between 0 and 1; got {request.temperature:g}", param="temperature"
        )
    for value in request.timestamp_granularities:
        if value not in GRANULARITIES:
            raise InvalidRequestError(
                f"'timestamp_granularities[]' must be 'segment' or 'word'; got {value!r}",
                param="timestamp_granularities",
            )
    if request.timestamp_granularities and request.response_format != "verbose_json":
        raise InvalidRequestError(
            "'timestamp_granularities[]' needs response_format 'verbose_json'.", param="timestamp_granularities"
        )


async def transcribe(host: ModelHost, request: TranscriptionRequest, *, max_audio_seconds: float) -> Transcript:
    """Check the request, hold the model, decode and cut the audio (off the
    event loop; 400 for a file that is not audio or is longer than
    `max_audio_seconds`), and run its windows on the model's queue.
    Raises `QueueFullError` (503) when too many requests wait."""
    check(request)
    model = await hold_oneshot_model(host, request.model, ModelKind.TRANSCRIPTION)
    backend = model.backend
    if not isinstance(backend, SpeechBackend):  # a backend registered for speech without the interface
        raise BackendError(f"model {request.model!r}: its backend does not implement speech recognition")
    audio = await asyncio.to_thread(decode_audio, request.audio, max_seconds=max_audio_seconds)
    plan = await asyncio.to_thread(backend.plan, audio, request.options())
    results = await model.queue.submit(plan.windows, priority=request.priority) if plan.windows else []
    return backend.assemble(plan, results, request.task)
