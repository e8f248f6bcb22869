"""Speech recognition with whisper.cpp (through `pywhispercpp`'s bindings).

whisper.cpp loads a ggml model file: `localserve.models.convert.whisper`
writes one from a CTranslate2 Whisper folder, so the model that
faster-whisper serves also runs here, with no download.

Batching: whisper.cpp has no batch API (one `whisper_full` call transcribes
one audio on one context, and a context runs one call at a time), so `run`
transcribes the windows of a dispatch one after another, each with every
thread it is given. The queue still gathers concurrent requests; the gain
of batching that faster-whisper gets is not available here.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from localserve.backends.device_names import AUTO, CPU, DeviceTable, Present
from localserve.backends.speech.common import WINDOW_S, Segment, Word
from localserve.backends.speech.windows import SampleWindow, SampleWindowBackend, WindowTranscript, compression_ratio
from localserve.engine.backend import BackendInfo
from localserve.errors import LocalServeError

log = logging.getLogger(__name__)

CENTISECONDS = 100.0  # whisper.cpp's time unit
GGML_MAGIC = b"lmgg"  # 0x67676d6c, little-endian: how a whisper.cpp model file starts
_LOG_LEVELS = {3: logging.WARNING, 4: logging.ERROR}  # ggml's WARN and ERROR; the rest is debug detail
_load_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class WhisperCppConfig:
    model_path: str  # a ggml model file: a path, never a bare name (pywhispercpp would download it)
    device: str = "auto"  # a device name (backends/device_names.py); auto or cpu: the PyPI wheel is CPU-only
    n_threads: int = 0  # 0: all cores


#: The PyPI wheel of pywhispercpp is built for the CPU only.
WHISPER_CPP = DeviceTable(
    "whisper.cpp (this pywhispercpp build runs on the CPU only)", accepts=(AUTO, CPU), auto=(CPU,)
)


class WhisperCppBackend(SampleWindowBackend):
    """A whisper.cpp context; `run` transcribes windows one after another."""

    def __init__(self, config: WhisperCppConfig) -> None:
        import _pywhispercpp as pw

        WHISPER_CPP.resolve(config.device, [Present(CPU, "cpu", frozenset({CPU}))])
        path = Path(config.model_path)
        if not path.is_file():
            raise LocalServeError(f"whisper.cpp model file not found: {path}")
        with path.open("rb") as f:
            if f.read(4) != GGML_MAGIC:
                raise LocalServeError(f"whisper.cpp could not load {path}: not a ggml Whisper model file")
        params = pw.whisper_context_default_params()
        params.use_gpu = False
        ctx, messages = _load(pw, path, params)
        # On failure the binding hands back a context around NULL, which would
        # crash the process on first use: whisper.cpp's log is the only signal.
        if any("failed to load" in m for m in messages):
            reason = next((m.strip() for m in messages if "ERROR" in m or "invalid" in m), messages[-1].strip())
            raise LocalServeError(f"whisper.cpp could not load {path}: {reason}")
        self._pw = pw
        self._ctx: Any = ctx
        self.config = config
        self.n_threads = config.n_threads or os.cpu_count() or 1
        self.multilingual = bool(pw.whisper_is_multilingual(ctx))
        max_id = pw.whisper_lang_max_id() if self.multilingual else 0
        self.languages = frozenset(pw.whisper_lang_str(i) for i in range(max_id + 1))
        self._eot = int(pw.whisper_token_eot(ctx))

    def transcribe_window(self, window: SampleWindow) -> WindowTranscript:
        pw, ctx = self._pw, self._ctx
        status = pw.whisper_full(ctx, self._params(window), window.samples, window.samples.size)
        if status != 0:
            raise LocalServeError(f"whisper.cpp failed to transcribe a window (status {status})")
        segments = tuple(self._segment(i, window) for i in range(pw.whisper_full_n_segments(ctx)))
        return WindowTranscript(segments, pw.whisper_lang_str(pw.whisper_full_lang_id(ctx)) or "en")

    def _params(self, window: SampleWindow) -> Any:
        pw, options = self._pw, window.options
        params = pw.whisper_full_default_params(pw.whisper_sampling_strategy.WHISPER_SAMPLING_GREEDY)
        params.n_threads = self.n_threads
        params.print_progress = params.print_realtime = params.print_timestamps = False
        params.no_context = True
        params.single_segment = False
        params.no_timestamps = not (options.timestamps or options.word_timestamps)
        params.token_timestamps = options.word_timestamps
        params.translate = options.task == "translate" and self.multilingual
        params.language = options.language or "auto"
        params.temperature = options.temperature
        params.temperature_inc = 0.0  # one temperature, as the request asked (no fallback)
        if options.prompt:
            params.initial_prompt = options.prompt
        return params

    def _segment(self, index: int, window: SampleWindow) -> Segment:
        pw, ctx, options = self._pw, self._ctx, window.options
        text = pw.whisper_full_get_segment_text(ctx, index).decode("utf-8", errors="replace")
        tokens = [pw.whisper_full_get_token_data(ctx, index, j) for j in range(pw.whisper_full_n_tokens(ctx, index))]
        tokens = [t for t in tokens if t.id < self._eot]  # drop timestamps and other special tokens
        if options.timestamps or options.word_timestamps:
            start = pw.whisper_full_get_segment_t0(ctx, index) / CENTISECONDS
            end = min(pw.whisper_full_get_segment_t1(ctx, index) / CENTISECONDS, window.duration_s)
        else:  # untimed: whisper.cpp leaves the times undefined; the text spans the window
            start, end = 0.0, window.duration_s
        return Segment(
            start=start,
            end=max(end, start),
            text=text,
            tokens=tuple(int(t.id) for t in tokens),
            avg_logprob=float(np.mean([t.plog for t in tokens])) if tokens else 0.0,
            compression_ratio=compression_ratio(text),
            no_speech_prob=0.0,  # whisper.cpp drops no-speech windows itself and does not report the figure
            temperature=options.temperature,
            words=self._words(tokens) if options.word_timestamps else (),
        )

    def _words(self, tokens: list[Any]) -> tuple[Word, ...]:
        """Tokens joined into words (a word starts at a token that begins with
        a space), timed by whisper.cpp's token timestamps."""
        groups: list[list[tuple[bytes, Any]]] = []
        for token in tokens:
            piece = self._pw.whisper_token_to_bytes(self._ctx, token.id)
            if not groups or piece.startswith(b" "):
                groups.append([])
            groups[-1].append((piece, token))
        words = []
        for group in groups:
            word = b"".join(p for p, _ in group).decode("utf-8", errors="replace")
            start, end = group[0][1].t0 / CENTISECONDS, group[-1][1].t1 / CENTISECONDS
            words.append(Word(start, max(start, end), word, float(np.mean([t.p for _, t in group]))))
        return tuple(words)

    def info(self) -> BackendInfo:
        return BackendInfo(
            backend="whisper.cpp",
            device="CPU",
            model_path=self.config.model_path,
            architecture="whisper" + ("" if self.multilingual else ".en"),
            n_ctx_train=WINDOW_S,
        )

    def close(self) -> None:
        if self._ctx is not None:
            self._pw.whisper_free(self._ctx)
            self._ctx = None


def _load(pw: Any, path: Path, params: Any) -> tuple[Any, list[str]]:
    """Load a context, collecting what whisper.cpp logs meanwhile; its log
    goes to Python's `logging` afterwards (not to stderr)."""
    messages: list[str] = []
    with _load_lock:  # the log callback is process-wide
        pw.whisper_log_set(lambda level, text: messages.append(text))
        try:
            ctx = pw.whisper_init_from_file_with_params(str(path), params)
        finally:
            pw.whisper_log_set(_log)
            _reset_log_at_exit(pw)
    return ctx, messages


@functools.cache
def _reset_log_at_exit(pw: Any) -> None:
    """A Python log callback called while the interpreter finalizes aborts the
    process: give whisper.cpp its own logger back before that."""
    atexit.register(pw.whisper_log_set, None)


def _log(level: int, text: str) -> None:
    log.log(_LOG_LEVELS.get(level, logging.DEBUG), "whisper.cpp: %s", text.rstrip())
