"""Speech recognition with faster-whisper (CTranslate2 Whisper models).

A request's audio is decoded (any format PyAV reads), cut into windows of at
most 30 s at pauses found by Silero VAD (silence dropped), and each window
becomes one item for the queue. `run` encodes a group of windows, from any
number of requests, in one batch and decodes them together
(`ctranslate2.models.Whisper.generate` over the batch). `assemble` turns a
request's window results back into one transcript on the original timeline.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localserve.backends.device_names import AUTO, CPU, GPU, DeviceTable, Present
from localserve.backends.speech.common import (
    FRAMES_PER_S,
    SAMPLE_RATE,
    WINDOW_S,
    AudioWindow,
    Segment,
    SpeechPlan,
    TranscribeOptions,
    Transcript,
    Word,
)
from localserve.engine.backend import BackendInfo, OneShotBackend
from localserve.errors import InvalidRequestError, LocalServeError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WhisperConfig:
    model_path: str
    device: str = "auto"  # a device name (backends/device_names.py): auto (CUDA > CPU), cpu, gpu, gpu:N, cuda
    compute_type: str = "int8"  # CTranslate2 quantization on CPU
    n_threads: int = 0  # 0: all cores
    beam_size: int = 1  # greedy: batching pays most; raise for accuracy


CTRANSLATE2 = DeviceTable(
    "faster-whisper",
    accepts=(AUTO, CPU, GPU, "cuda"),
    auto=(GPU, CPU),
    hint="CTranslate2 runs on NVIDIA GPUs through CUDA only (CUDA 12 and cuDNN 9 installed).",
)


def present_devices(cuda_devices: int) -> list[Present]:
    """CTranslate2's CUDA devices (gpu:N, also cuda:N), then the CPU."""
    gpus = [Present(f"gpu:{i}", "cuda", frozenset({GPU, "cuda"}), i) for i in range(cuda_devices)]
    return [*gpus, Present(CPU, "cpu", frozenset({CPU}))]


class FasterWhisperBackend(OneShotBackend[AudioWindow, list[Segment]]):
    """A CTranslate2 Whisper model; `run` answers windows of many requests at once."""

    def __init__(self, config: WhisperConfig) -> None:
        import ctranslate2
        from faster_whisper import BatchedInferencePipeline, WhisperModel

        path = Path(config.model_path)
        if not (path / "model.bin").is_file():
            raise LocalServeError(f"{path} is not a CTranslate2 Whisper model folder (no model.bin)")
        wanted, found = CTRANSLATE2.resolve(config.device, present_devices(ctranslate2.get_cuda_device_count()))
        use_cuda = CPU not in found[0].kinds
        self._device = "CPU" if not use_cuda else "CUDA" if wanted.index is None else f"CUDA:{wanted.index}"
        self.config = config
        self.model = WhisperModel(
            str(path),
            device="cuda" if use_cuda else "cpu",
            device_index=found[0].index or 0,
            compute_type="default" if use_cuda else config.compute_type,
            cpu_threads=config.n_threads or os.cpu_count() or 1,
        )
        self._pipeline = BatchedInferencePipeline(self.model)
        self.multilingual = bool(self.model.model.is_multilingual)

    # ---- request side (any thread) -------------------------------------------------

    def plan(self, audio: np.ndarray, options: TranscribeOptions) -> SpeechPlan:
        """Cut `audio` into windows at pauses (VAD), compute their features,
        and settle the language."""
        from faster_whisper.audio import pad_or_trim
        from faster_whisper.vad import VadOptions, collect_chunks, get_speech_timestamps

        language = self._check_language(options.language)
        vad = VadOptions(max_speech_duration_s=WINDOW_S, min_silence_duration_ms=160)
        speech = get_speech_timestamps(audio, vad)
        duration = audio.size / SAMPLE_RATE
        if not speech:
            return SpeechPlan([], duration, language or "en")
        chunks, metadata = collect_chunks(audio, speech, max_duration=WINDOW_S)
        features = [self.model.feature_extractor(chunk)[..., :-1] for chunk in chunks]
        if language is None:
            language = self._detect_language(features)
        resolved = TranscribeOptions(
            options.task, language, options.prompt, options.temperature, options.timestamps, options.word_timestamps
        )
        windows = [
            AudioWindow(pad_or_trim(f), float(m["offset"]), float(m["duration"]), resolved)
            for f, m in zip(features, metadata, strict=True)
        ]
        return SpeechPlan(windows, duration, language, speech)

    def assemble(self, plan: SpeechPlan, results: Sequence[list[Segment]], task: str) -> Transcript:
        """One transcript from a request's window results, with times mapped
        back onto the original audio (VAD removed the silence)."""
        from faster_whisper.vad import SpeechTimestampsMap

        segments: list[Segment] = []
        if plan.speech_chunks:
            ts_map = SpeechTimestampsMap(plan.speech_chunks, SAMPLE_RATE)
            for window_segments in results:
                for s in window_segments:
                    if not s.text.strip():
                        continue
                    segments.append(_restore(s, ts_map))
        text = "".join(s.text for s in segments).strip()
        return Transcript(text, plan.language, plan.duration_s, tuple(segments), task)

    def _check_language(self, language: str | None) -> str | None:
        if language is None:
            return None if self.multilingual else "en"
        code = language.lower().strip()
        supported = self.model.supported_languages
        if code not in supported:
            if not self.multilingual:
                raise InvalidRequestError(
                    f"This model is English-only; language {language!r} is not supported (use 'en').", param="language"
                )
            raise InvalidRequestError(f"Unsupported language {language!r}; use an ISO-639-1 code.", param="language")
        return code

    def _detect_language(self, features: list[np.ndarray]) -> str:
        language, _, _ = self.model.detect_language(features=np.concatenate(features, axis=1))
        return str(language)

    # ---- OneShotBackend (the queue's thread) ----------------------------------------

    def item_size(self, item: AudioWindow) -> int:
        # The encoder computes a full 30 s window however much speech it
        # holds, so every window costs the same: length grouping would only
        # split batches (CTranslate2 drops finished sequences while decoding).
        return WINDOW_S * FRAMES_PER_S

    def group_key(self, item: AudioWindow) -> TranscribeOptions:
        return item.options

    def run(self, items: Sequence[AudioWindow]) -> list[list[Segment]]:
        from faster_whisper.tokenizer import Tokenizer

        first = items[0].options
        tokenizer = Tokenizer(self.model.hf_tokenizer, self.multilingual, task=first.task, language=first.language)
        options = self._decode_options(first, tokenizer)
        features = np.stack([w.features for w in items])
        metadata = [{"offset": w.offset_s, "duration": w.duration_s} for w in items]
        self._pipeline.last_speech_timestamp = 0.0
        outputs = self._pipeline.forward(features, tokenizer, metadata, options)
        return [[_segment(s, first.temperature) for s in window] for window in outputs]

    def info(self) -> BackendInfo:
        return BackendInfo(
            backend="faster-whisper",
            device=self._device,
            model_path=self.config.model_path,
            architecture="whisper" + ("" if self.multilingual else ".en"),
            n_ctx_train=WINDOW_S,
        )

    def close(self) -> None:
        self._pipeline = None  # type: ignore[assignment]
        self.model = None  # type: ignore[assignment]

    def _decode_options(self, options: TranscribeOptions, tokenizer: object) -> object:
        from faster_whisper.transcribe import TranscriptionOptions, get_suppressed_tokens

        return TranscriptionOptions(
            beam_size=self.config.beam_size,
            best_of=1,
            patience=1.0,
            length_penalty=1.0,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            log_prob_threshold=-1.0,
            no_speech_threshold=0.6,
            compression_ratio_threshold=2.4,
            condition_on_previous_text=False,
            prompt_reset_on_temperature=0.5,
            temperatures=[options.temperature],
            initial_prompt=options.prompt,
            prefix=None,
            suppress_blank=True,
            suppress_tokens=get_suppressed_tokens(tokenizer, [-1]),
            without_timestamps=not options.timestamps,
            max_initial_timestamp=0.0,
            word_timestamps=options.word_timestamps,
            prepend_punctuations="\"'“¿([{-",
            append_punctuations="\"'.。,，!！?？:：”)]}、",
            multilingual=False,
            max_new_tokens=None,
            clip_timestamps="0",
            hallucination_silence_threshold=None,
            hotwords=None,
        )


def _segment(raw: dict, temperature: float) -> Segment:  # type: ignore[type-arg]
    words = tuple(
        Word(float(w["start"]), float(w["end"]), str(w["word"]), float(w["probability"]))
        for w in raw.get("words") or ()
    )
    return Segment(
        start=float(raw["start"]),
        end=float(raw["end"]),
        text=str(raw["text"]),
        tokens=tuple(int(t) for t in raw["tokens"]),
        avg_logprob=float(raw["avg_logprob"]),
        compression_ratio=float(raw["compression_ratio"]),
        no_speech_prob=float(raw["no_speech_prob"]),
        temperature=temperature,
        seek=int(raw.get("seek", 0)),
        words=words,
    )


def _restore(segment: Segment, ts_map: object) -> Segment:
    """Map a segment (and its words) from the speech-only timeline back to the audio's."""
    if segment.words:
        words = []
        for w in segment.words:
            chunk = ts_map.get_chunk_index((w.start + w.end) / 2)  # type: ignore[attr-defined]
            start = ts_map.get_original_time(w.start, chunk)  # type: ignore[attr-defined]
            end = ts_map.get_original_time(w.end, chunk)  # type: ignore[attr-defined]
            words.append(Word(start, end, w.word, w.probability))
        start, end = words[0].start, words[-1].end
        return _replace(segment, start, end, tuple(words))
    start = ts_map.get_original_time(segment.start)  # type: ignore[attr-defined]
    end = ts_map.get_original_time(segment.end, is_end=True)  # type: ignore[attr-defined]
    return _replace(segment, start, end, ())


def _replace(segment: Segment, start: float, end: float, words: tuple[Word, ...]) -> Segment:
    return Segment(
        start,
        max(end, start),
        segment.text,
        segment.tokens,
        segment.avg_logprob,
        segment.compression_ratio,
        segment.no_speech_prob,
        segment.temperature,
        segment.seek,
        words,
    )
