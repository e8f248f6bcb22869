"""Speech recognition with OpenVINO's `WhisperPipeline` (openvino-genai) on
NPU, GPU or CPU.

The pipeline loads an IR folder (encoder, stateful decoder, tokenizer and
detokenizer, generation config) that `localserve.models.convert.whisper_openvino`
exports once from a CTranslate2 Whisper folder. Serving imports openvino-genai
only, never torch.

Batching: `WhisperPipeline.generate` takes one audio per call and has no
batch form, so `run` transcribes the windows of a dispatch one after another.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localserve.backends.openvino.backend import available_devices, resolve_device
from localserve.backends.speech.common import WINDOW_S, Segment, Word
from localserve.backends.speech.windows import SampleWindow, SampleWindowBackend, WindowTranscript, compression_ratio
from localserve.engine.backend import BackendInfo
from localserve.errors import LocalServeError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class OpenVinoWhisperConfig:
    model_path: str  # an IR folder with openvino_encoder_model.xml, openvino_decoder_model.xml, ...
    device: str = "auto"  # a device name (backends/device_names.py): auto (NPU > GPU > CPU), cpu, gpu, gpu:N, npu
    n_threads: int = 0  # 0: OpenVINO's default (CPU only)
    precision: str = ""  # INFERENCE_PRECISION_HINT: "" (device default; bf16 on some CPUs), f32, f16


class OpenVinoWhisperBackend(SampleWindowBackend):
    """A compiled WhisperPipeline; `run` transcribes windows one after another."""

    def __init__(self, config: OpenVinoWhisperConfig) -> None:
        import openvino_genai

        path = Path(config.model_path)
        if not (path / "openvino_encoder_model.xml").is_file():
            raise LocalServeError(f"{path} is not an OpenVINO Whisper folder (no openvino_encoder_model.xml)")
        self.device = resolve_device(config.device, available_devices())
        properties: dict[str, Any] = {"word_timestamps": True}  # else the pipeline cannot time words later
        if config.precision:
            properties["INFERENCE_PRECISION_HINT"] = config.precision
        if config.n_threads and self.device.startswith("CPU"):
            properties["INFERENCE_NUM_THREADS"] = config.n_threads
        try:
            self._pipeline: Any = openvino_genai.WhisperPipeline(str(path), self.device, **properties)
        except RuntimeError as exc:
            raise LocalServeError(f"OpenVINO could not load the Whisper model {path}: {exc}") from None
        self.config = config
        generation = self._pipeline.get_generation_config()
        self.multilingual = bool(generation.is_multilingual)
        codes = {token.strip("<|>") for token in generation.lang_to_id}
        self.languages = frozenset(codes) if self.multilingual else frozenset({"en"})

    def transcribe_window(self, window: SampleWindow) -> WindowTranscript:
        options = window.options
        kwargs: dict[str, Any] = {
            "return_timestamps": options.timestamps or options.word_timestamps,
            "word_timestamps": options.word_timestamps,
        }
        if self.multilingual:  # an English-only model refuses `language` and `task`
            kwargs["task"] = options.task
            if options.language:
                kwargs["language"] = f"<|{options.language}|>"
        if options.prompt:
            kwargs["initial_prompt"] = options.prompt
        if options.temperature > 0:
            kwargs |= {"do_sample": True, "temperature": options.temperature}
        try:
            result = self._pipeline.generate(window.samples, **kwargs)
        except RuntimeError as exc:
            raise LocalServeError(f"OpenVINO failed to transcribe a window: {exc}") from None
        words = self._words(result) if options.word_timestamps else ()
        if result.chunks:
            segments = tuple(
                self._segment(c.start_ts, c.end_ts, c.text, words, options.temperature) for c in result.chunks
            )
        else:  # untimed: one segment spanning the window
            segments = (self._segment(0.0, window.duration_s, result.texts[0], words, options.temperature),)
        language = str(getattr(result, "language", "") or "").strip("<|>")
        return WindowTranscript(segments, language or (options.language or "en"))

    @staticmethod
    def _words(result: Any) -> tuple[Word, ...]:
        # WhisperPipeline reports no per-word probability.
        return tuple(Word(float(w.start_ts), float(max(w.start_ts, w.end_ts)), w.word, 1.0) for w in result.words or ())

    @staticmethod
    def _segment(start: float, end: float, text: str, words: tuple[Word, ...], temperature: float) -> Segment:
        start, end = float(start), float(max(start, end))
        inside = tuple(w for w in words if start - 0.01 <= w.start < end + 0.01)
        return Segment(
            start=start,
            end=end,
            text=text,
            tokens=(),  # WhisperPipeline returns segment text, not the segment's token ids
            avg_logprob=0.0,  # nor its log-probability
            compression_ratio=compression_ratio(text),
            no_speech_prob=0.0,
            temperature=temperature,
            words=inside,
        )

    def info(self) -> BackendInfo:
        return BackendInfo(
            backend="openvino-whisper",
            device=self.device,
            model_path=self.config.model_path,
            architecture="whisper" + ("" if self.multilingual else ".en"),
            n_ctx_train=WINDOW_S,
        )

    def close(self) -> None:
        self._pipeline = None
