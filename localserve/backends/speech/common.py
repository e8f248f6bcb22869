"""What every speech-recognition backend shares: the interface the serving
layer uses (`SpeechBackend`), audio decoding (any format PyAV reads) and the
plain types that cross from the serving layer to the queue's thread and
back."""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from localserve.errors import InvalidRequestError, LocalServeError

SAMPLE_RATE = 16000
WINDOW_S = 30  # Whisper's encoder always sees 30 s
FRAMES_PER_S = 100  # mel frames; the unit of item_size


@dataclass(frozen=True, slots=True)
class TranscribeOptions:
    """What a request asks for. Windows with different options never share
    a `run` call (they are the queue's group key)."""

    task: str = "transcribe"  # transcribe | translate
    language: str | None = None  # None: detect (multilingual models) or "en"
    prompt: str | None = None
    temperature: float = 0.0
    timestamps: bool = False  # timed segments (srt/vtt/verbose_json); plain text reads better without
    word_timestamps: bool = False


@dataclass(frozen=True, slots=True, eq=False)
class AudioWindow:
    """Up to 30 s of speech of one request, ready for the encoder."""

    features: np.ndarray  # (n_mels, 3000) log-mel, padded
    offset_s: float  # start on the speech-only timeline (silence removed)
    duration_s: float
    options: TranscribeOptions


@dataclass(frozen=True, slots=True)
class Word:
    start: float
    end: float
    word: str
    probability: float


@dataclass(frozen=True, slots=True)
class Segment:
    start: float
    end: float
    text: str
    tokens: tuple[int, ...]
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    temperature: float
    seek: int = 0
    words: tuple[Word, ...] = ()


@dataclass(frozen=True, slots=True)
class Transcript:
    """One request's answer, on the original audio's timeline."""

    text: str
    language: str
    duration_s: float
    segments: tuple[Segment, ...] = ()
    task: str = "transcribe"

    @property
    def words(self) -> tuple[Word, ...]:
        return tuple(w for s in self.segments for w in s.words)


@dataclass(slots=True)
class SpeechPlan:
    """How a request's audio was cut: its windows and the map back to time."""

    windows: list[AudioWindow]
    duration_s: float
    language: str
    speech_chunks: list[dict[str, int]] = field(default_factory=list)  # VAD spans, in samples


@runtime_checkable
class SpeechBackend(Protocol):
    """What a speech-recognition backend offers besides `OneShotBackend`
    (`run` turns the windows of `plan` into outputs on the queue's thread).

    `plan` and `assemble` may be called from any thread, also while the
    queue's thread runs `run`: the serving layer calls `plan` in a worker
    thread and `assemble` on the event loop. They share no mutable state with
    `run` (faster-whisper's language detection calls CTranslate2, whose
    models take concurrent calls)."""

    def plan(self, audio: np.ndarray, options: TranscribeOptions) -> SpeechPlan:
        """Cut `audio` (mono float32, 16 kHz) into windows at pauses, ready
        for `run`, and settle the language; 400 for a language the model
        does not know."""
        ...

    def assemble(self, plan: SpeechPlan, results: Sequence[Any], task: str) -> Transcript:
        """One transcript from the outputs of `run` for `plan.windows` (in
        their order), on the original audio's timeline."""
        ...


def decode_audio(data: bytes, *, max_seconds: float) -> np.ndarray:
    """Mono float32 at 16 kHz from any container PyAV reads (WAV, MP3, FLAC,
    OGG, WebM, ...). A file that is not audio is a 400; a longer one than
    `max_seconds` is a 400 that says the limit."""
    import av
    from faster_whisper.audio import decode_audio as fw_decode

    try:
        with av.open(io.BytesIO(data), mode="r", metadata_errors="ignore") as container:
            if not container.streams.audio:
                raise InvalidRequestError("The file has no audio stream.", param="file")
            if container.duration is not None and container.duration / 1_000_000 > max_seconds + 1:
                raise _too_long(container.duration / 1_000_000, max_seconds)
        audio = fw_decode(io.BytesIO(data), sampling_rate=SAMPLE_RATE)
    except LocalServeError:
        raise
    except (av.FFmpegError, ValueError, IndexError, OSError, EOFError) as exc:
        raise InvalidRequestError(
            f"Could not decode the audio file ({exc.__class__.__name__}: {exc}). "
            "Send WAV, MP3, FLAC, OGG, WebM or another common format.",
            param="file",
        ) from None
    if audio.size == 0:
        raise InvalidRequestError("The audio file holds no samples.", param="file")
    if audio.size / SAMPLE_RATE > max_seconds:
        raise _too_long(audio.size / SAMPLE_RATE, max_seconds)
    return audio


def _too_long(seconds: float, limit: float) -> InvalidRequestError:
    return InvalidRequestError(
        f"The audio is {seconds:.1f} s long; the limit is {limit:g} s. Split it into shorter files.",
        param="file",
        code="audio_too_long",
    )
