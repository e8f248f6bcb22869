"""What the Whisper backends that take raw samples share (whisper.cpp,
OpenVINO's WhisperPipeline): cut a request's audio at pauses into windows of
at most 30 s (Silero VAD, as the faster-whisper backend does, so every
backend hears the same windows), check the language, and put each window's
segments back on the original audio's timeline.

Neither library batches several audios in one call, so `run` answers the
windows of a dispatch one after another; the queue still gathers them
(one dispatch per wake-up, grouped by options) and reports what it batched.
"""

from __future__ import annotations

import zlib
from abc import abstractmethod
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from localserve.backends.speech.common import (
    FRAMES_PER_S,
    SAMPLE_RATE,
    WINDOW_S,
    Segment,
    SpeechPlan,
    TranscribeOptions,
    Transcript,
)
from localserve.engine.backend import OneShotBackend
from localserve.errors import InvalidRequestError


@dataclass(frozen=True, slots=True, eq=False)
class SampleWindow:
    """Up to 30 s of one request's speech, as 16 kHz float32 samples."""

    samples: np.ndarray
    offset_s: float  # start on the speech-only timeline (silence removed)
    duration_s: float
    options: TranscribeOptions


@dataclass(frozen=True, slots=True)
class WindowTranscript:
    """A window's segments (times from the window's start) and its language."""

    segments: tuple[Segment, ...]
    language: str


class SampleWindowBackend(OneShotBackend[SampleWindow, WindowTranscript]):
    """A Whisper model fed raw samples window by window; subclasses say how
    one window is transcribed and which languages the model knows."""

    multilingual: bool = False
    languages: frozenset[str] = frozenset({"en"})

    @abstractmethod
    def transcribe_window(self, window: SampleWindow) -> WindowTranscript:
        """One window's segments; `window.options.language` None means detect."""

    # ---- request side (any thread) -------------------------------------------------

    def plan(self, audio: np.ndarray, options: TranscribeOptions) -> SpeechPlan:
        """Cut `audio` into windows at pauses and settle the language (None:
        a multilingual model detects it per window)."""
        from faster_whisper.vad import VadOptions, collect_chunks, get_speech_timestamps

        language = self.check_language(options.language)
        duration = audio.size / SAMPLE_RATE
        vad = VadOptions(max_speech_duration_s=WINDOW_S, min_silence_duration_ms=160)
        speech = get_speech_timestamps(audio, vad)
        if not speech:
            return SpeechPlan([], duration, language or "en")
        chunks, metadata = collect_chunks(audio, speech, max_duration=WINDOW_S)
        resolved = TranscribeOptions(
            options.task, language, options.prompt, options.temperature, options.timestamps, options.word_timestamps
        )
        windows = [
            SampleWindow(
                np.ascontiguousarray(chunk, dtype=np.float32), float(m["offset"]), float(m["duration"]), resolved
            )
            for chunk, m in zip(chunks, metadata, strict=True)
        ]
        return SpeechPlan(windows, duration, language or "", speech)  # type: ignore[arg-type]

    def assemble(self, plan: SpeechPlan, results: Sequence[WindowTranscript], task: str) -> Transcript:
        """One transcript from a request's window results, with times mapped
        back onto the original audio (VAD removed the silence)."""
        from faster_whisper.vad import SpeechTimestampsMap

        from localserve.backends.speech.faster_whisper import _restore  # the faster-whisper backend's mapping, shared

        segments: list[Segment] = []
        if plan.speech_chunks:
            ts_map = SpeechTimestampsMap(plan.speech_chunks, SAMPLE_RATE)
            for window, result in zip(plan.windows, results, strict=True):
                for s in result.segments:
                    if s.text.strip():
                        segments.append(_restore(shifted(s, window.offset_s), ts_map))
        detected = Counter(r.language for r in results if r.language).most_common(1)
        language = plan.language or (detected[0][0] if detected else "en")
        text = "".join(s.text for s in segments).strip()
        return Transcript(text, language, plan.duration_s, tuple(segments), task)

    def check_language(self, language: str | None) -> str | None:
        if language is None:
            return None if self.multilingual else "en"
        code = language.lower().strip()
        if code not in self.languages:
            if not self.multilingual:
                raise InvalidRequestError(
                    f"This model is English-only; language {language!r} is not supported (use 'en').", param="language"
                )
            raise InvalidRequestError(f"Unsupported language {language!r}; use an ISO-639-1 code.", param="language")
        return code

    # ---- OneShotBackend (the queue's thread) ----------------------------------------

    def item_size(self, item: SampleWindow) -> int:
        # The encoder sees a full 30 s window however much speech it holds.
        return WINDOW_S * FRAMES_PER_S

    def group_key(self, item: SampleWindow) -> TranscribeOptions:
        return item.options

    def run(self, items: Sequence[SampleWindow]) -> list[WindowTranscript]:
        return [self.transcribe_window(w) for w in items]


def shifted(segment: Segment, offset_s: float) -> Segment:
    """`segment` moved by `offset_s` (a window's place on the speech timeline)."""
    from dataclasses import replace

    words = tuple(replace(w, start=w.start + offset_s, end=w.end + offset_s) for w in segment.words)
    return replace(segment, start=segment.start + offset_s, end=segment.end + offset_s, words=words)


def compression_ratio(text: str) -> float:
    """How repetitive `text` is (Whisper's hallucination signal), as openai-whisper computes it."""
    data = text.encode("utf-8")
    return len(data) / max(1, len(zlib.compress(data)))
