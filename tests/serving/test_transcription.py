"""`serving.transcription` called directly, without HTTP: the real Whisper
tiny.en (as tests/api/test_audio_api.py) on espeak-ng speech, behind its
one-shot queue, reached through `LocalModels` as `batch run` and `run` do."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from localserve.backends.speech.common import SpeechBackend
from localserve.config import ServerSettings
from localserve.engine.engine import Engine
from localserve.errors import InvalidRequestError, LocalServeError, ModelNotFoundError
from localserve.models.kinds import ModelKind
from localserve.models.registry import ModelRegistry, resolve
from localserve.serving.models import LocalModels
from localserve.serving.transcription import Transcript, TranscriptionRequest, check, transcribe
from tests.fixtures.speech import SENTENCE, have_espeak, speak, with_silence, word_error_rate

MODEL = "whisper-tiny.en"
MAX_SECONDS = 60.0


def needs_speech(test: Callable[..., Any]) -> Callable[..., Any]:
    """A real model and espeak-ng's speech."""
    test = pytest.mark.slow(test)
    return pytest.mark.skipif(not have_espeak(), reason="needs espeak-ng (apt-get install espeak-ng)")(test)


@pytest.fixture(scope="module")
async def models() -> AsyncIterator[LocalModels]:
    """Whisper tiny.en loaded once for the module (a second or so), as `batch run` loads a model."""
    registry = ModelRegistry(Engine(), ServerSettings(threads=2))
    await registry.load(resolve(MODEL))
    try:
        yield LocalModels(registry)
    finally:
        await registry.close()


@pytest.fixture(scope="module")
def wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return speak(SENTENCE, tmp_path_factory.mktemp("speech") / "sentence.wav")


async def run(models: LocalModels, **fields: Any) -> Transcript:
    request = TranscriptionRequest(**{"model": MODEL, **fields})
    async with models.call() as host:
        return await transcribe(host, request, max_audio_seconds=MAX_SECONDS)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"model": ""}, "model"),
        ({"audio": b""}, "file"),
        ({"response_format": "docx"}, "response_format"),
        ({"temperature": 1.5}, "temperature"),
        ({"temperature": -0.1}, "temperature"),
        ({"timestamp_granularities": ("word",)}, "timestamp_granularities"),  # needs verbose_json
        ({"timestamp_granularities": ("sentence",), "response_format": "verbose_json"}, "timestamp_granularities"),
        ({"task": "summarize"}, "task"),
    ],
)
def test_check_refuses_bad_requests_naming_the_parameter(fields: dict[str, object], param: str) -> None:
    request = TranscriptionRequest(**{"model": MODEL, "audio": b"RIFF", **fields})  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError) as caught:
        check(request)
    assert caught.value.param == param and caught.value.status == 400


def test_options_follow_the_response_format_and_task() -> None:
    plain = TranscriptionRequest(MODEL, b"x", language="en").options()
    assert plain.timestamps is False and plain.word_timestamps is False and plain.language == "en"
    words = TranscriptionRequest(
        MODEL, b"x", response_format="verbose_json", timestamp_granularities=("word",)
    ).options()
    assert words.timestamps is True and words.word_timestamps is True
    assert TranscriptionRequest(MODEL, b"x").granularities == ("segment",)
    # Translation detects the spoken language itself: a language given with it is not used.
    assert TranscriptionRequest(MODEL, b"x", task="translate", language="de").options().language is None


@needs_speech
async def test_speech_transcribes_through_the_oneshot_queue(models: LocalModels, wav: Path) -> None:
    loaded = models.registry.get_oneshot(MODEL, ModelKind.TRANSCRIPTION)
    assert isinstance(loaded.backend, SpeechBackend)  # the declared interface, no cast
    before = loaded.queue.stats().requests
    transcript = await run(models, audio=wav.read_bytes())
    assert word_error_rate(SENTENCE, transcript.text) < 0.35, transcript.text
    assert transcript.language == "en" and transcript.task == "transcribe"
    assert transcript.segments and transcript.duration_s > 1.0
    assert loaded.queue.stats().requests == before + 1  # one request's windows went through the queue


@needs_speech
async def test_word_timestamps_and_concurrent_requests(models: LocalModels, wav: Path, tmp_path: Path) -> None:
    padded = with_silence(wav, tmp_path / "padded.wav", before_s=2.0).read_bytes()
    timed, plain, translated = await asyncio.gather(
        run(models, audio=padded, response_format="verbose_json", timestamp_granularities=("segment", "word")),
        run(models, audio=wav.read_bytes(), response_format="text"),
        run(models, audio=wav.read_bytes(), task="translate", language="de"),  # the language is not used
    )
    for transcript in (timed, plain, translated):
        assert word_error_rate(SENTENCE, transcript.text) < 0.35, transcript.text
    assert translated.task == "translate"
    words = timed.words
    assert len(words) >= 8 and all(w.start <= w.end for w in words)
    assert 1.5 <= timed.segments[0].start <= 2.5  # on the padded audio's timeline (VAD removed the silence)


@needs_speech
@pytest.mark.parametrize(
    ("fields", "param", "status"),
    [
        ({"audio": b"definitely not audio" * 50}, "file", 400),
        ({"language": "de"}, "language", 400),  # tiny.en is English-only
        ({"model": "whisper-huge-nowhere"}, "", 404),
        ({"temperature": 3.0}, "temperature", 400),
    ],
)
async def test_bad_input_is_an_error_naming_it(
    models: LocalModels, wav: Path, fields: dict[str, object], param: str, status: int
) -> None:
    with pytest.raises(LocalServeError) as caught:
        await run(models, **{"audio": wav.read_bytes(), **fields})
    assert caught.value.status == status, caught.value.message
    if status == 404:
        assert isinstance(caught.value, ModelNotFoundError)
    else:
        assert caught.value.param == param


@needs_speech
async def test_audio_over_the_limit_is_a_400_that_says_it(models: LocalModels, wav: Path, tmp_path: Path) -> None:
    long = with_silence(wav, tmp_path / "long.wav", after_s=MAX_SECONDS + 5).read_bytes()
    with pytest.raises(InvalidRequestError) as caught:
        await run(models, audio=long)
    assert caught.value.code == "audio_too_long" and f"{MAX_SECONDS:g} s" in caught.value.message
