"""`POST /v1/audio/transcriptions` and `/translations` over HTTP, with the
openai SDK, on espeak-ng speech and the real Whisper tiny.en."""

from __future__ import annotations

import asyncio
import io
import math
import re
import wave
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from tests.api.harness import ServerThread, make_settings
from tests.api.test_metrics import scrape, value
from tests.fixtures.speech import FORMATS, SENTENCE, encode, have_espeak, speak, with_silence, word_error_rate

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not have_espeak(), reason="needs espeak-ng (apt-get install espeak-ng)"),
]

MODEL = "whisper-tiny.en"
MAX_AUDIO_BYTES = 1024 * 1024
MAX_AUDIO_SECONDS = 90.0


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    settings = make_settings(
        models=[MODEL], threads=2, max_audio_bytes=MAX_AUDIO_BYTES, max_audio_seconds=MAX_AUDIO_SECONDS
    )
    srv = ServerThread(settings).start()
    try:
        srv.wait_healthy(timeout=180)
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def client(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture
def http(server: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=300) as c:
        yield c


@pytest.fixture(scope="module")
def wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return speak(SENTENCE, tmp_path_factory.mktemp("speech") / "sentence.wav")


def duration_of(path: Path) -> float:
    with wave.open(str(path), "rb") as f:
        return f.getnframes() / f.getframerate()


def post(http: httpx.Client, data: bytes, name: str = "speech.wav", route: str = "transcriptions", **fields: str):  # noqa: ANN201
    form = {"model": MODEL, **fields}
    return http.post(f"/v1/audio/{route}", data=form, files={"file": (name, data)})


# ---- must show: accuracy and formats --------------------------------------------------------


def test_espeak_speech_transcribes_under_35_percent_wer(client: openai.OpenAI, wav: Path) -> None:
    with wav.open("rb") as f:
        result = client.audio.transcriptions.create(model=MODEL, file=f)
    assert word_error_rate(SENTENCE, result.text) < 0.35, result.text


def test_text_format_is_plain_text(http: httpx.Client, wav: Path) -> None:
    response = post(http, wav.read_bytes(), response_format="text")
    assert response.status_code == 200 and response.headers["Content-Type"].startswith("text/plain")
    assert word_error_rate(SENTENCE, response.text) < 0.35 and response.text.endswith("\n")


def test_srt_has_indices_and_arrows(http: httpx.Client, wav: Path, tmp_path: Path) -> None:
    audio = with_silence(wav, tmp_path / "two.wav", before_s=1.0, repeat=2, gap_s=2.0)
    response = post(http, audio.read_bytes(), response_format="srt")
    assert response.status_code == 200
    blocks = response.text.strip().split("\n\n")
    assert len(blocks) >= 2
    previous_end = 0
    for number, block in enumerate(blocks, 1):
        lines = block.split("\n")
        assert lines[0] == str(number)
        match = re.fullmatch(r"(\d\d):(\d\d):(\d\d),(\d{3}) --> (\d\d):(\d\d):(\d\d),(\d{3})", lines[1])
        assert match, lines[1]
        h1, m1, s1, ms1, h2, m2, s2, ms2 = map(int, match.groups())
        start, end = (h1 * 3600 + m1 * 60 + s1) * 1000 + ms1, (h2 * 3600 + m2 * 60 + s2) * 1000 + ms2
        assert previous_end <= start < end
        previous_end = end
        assert lines[2].strip()


def test_vtt_has_its_header_and_cues(http: httpx.Client, wav: Path) -> None:
    response = post(http, wav.read_bytes(), response_format="vtt")
    assert response.status_code == 200 and response.text.startswith("WEBVTT\n\n")
    cues = re.findall(r"^(\d\d:\d\d:\d\d\.\d{3}) --> (\d\d:\d\d:\d\d\.\d{3})$", response.text, re.M)
    assert cues and all(a < b for a, b in cues)
    assert word_error_rate(SENTENCE, re.sub(r"^WEBVTT|^\S+ --> \S+$", "", response.text, flags=re.M)) < 0.35


def test_verbose_json_segments_and_words(client: openai.OpenAI, wav: Path, tmp_path: Path) -> None:
    audio = with_silence(wav, tmp_path / "padded.wav", before_s=2.0, after_s=1.0)
    with audio.open("rb") as f:
        result = client.audio.transcriptions.create(
            model=MODEL, file=f, response_format="verbose_json", timestamp_granularities=["segment", "word"]
        )
    assert result.language == "english" and result.duration == pytest.approx(duration_of(audio), abs=0.05)
    assert word_error_rate(SENTENCE, result.text) < 0.35
    assert result.segments and all(s.start < s.end for s in result.segments)
    assert result.segments[0].start >= 1.5 and result.segments[-1].end <= result.duration + 0.5
    assert [s.id for s in result.segments] == list(range(len(result.segments)))
    assert result.words and all(w.start <= w.end for w in result.words)
    assert "weather" in [w.word.lower().strip(".,") for w in result.words]


def test_json_has_text_and_duration_usage(http: httpx.Client, wav: Path) -> None:
    body = post(http, wav.read_bytes(), response_format="json").json()
    assert set(body) == {"text", "usage"}
    assert body["usage"] == {"type": "duration", "seconds": math.ceil(duration_of(wav))}


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_compressed_containers_transcribe(http: httpx.Client, wav: Path, fmt: str) -> None:
    response = post(http, encode(wav, fmt), name=f"speech.{fmt}")
    assert response.status_code == 200, response.text
    assert word_error_rate(SENTENCE, response.json()["text"]) < 0.35


def test_translations_answer_in_english(client: openai.OpenAI, wav: Path) -> None:
    with wav.open("rb") as f:
        result = client.audio.translations.create(model=MODEL, file=f)
    assert word_error_rate(SENTENCE, result.text) < 0.35


def test_long_audio_is_windowed_and_batched(
    http: httpx.Client, server: ServerThread, wav: Path, tmp_path: Path
) -> None:
    long = with_silence(wav, tmp_path / "long.wav", before_s=1.0, repeat=14, gap_s=1.0)
    data = encode(long, "ogg")  # ~75 s: under the byte limit as Opus
    before = server.call(lambda: server.registry.oneshot_stats())[MODEL].queue.items
    body = post(http, data, name="long.ogg", response_format="verbose_json").json()
    assert body["duration"] > 60 and body["text"].lower().count("weather") >= 11
    after = server.call(lambda: server.registry.oneshot_stats())[MODEL].queue.items
    assert after - before >= 3  # windows of at most 30 s


# ---- must show: concurrency ----------------------------------------------------------------


async def test_eight_concurrent_transcriptions_are_batched_and_correct(server: ServerThread, wav: Path) -> None:
    aclient = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=300)
    data = wav.read_bytes()
    stats = server.call(lambda: server.registry.oneshot_stats())[MODEL]
    items_before, batches_before = stats.queue.items, stats.queue.batches
    results = await asyncio.gather(
        *(aclient.audio.transcriptions.create(model=MODEL, file=(f"s{i}.wav", io.BytesIO(data))) for i in range(8))
    )
    for result in results:
        assert word_error_rate(SENTENCE, result.text) < 0.35, result.text
    stats = server.call(lambda: server.registry.oneshot_stats())[MODEL]
    num_items, num_batches = stats.queue.items - items_before, stats.queue.batches - batches_before
    assert num_items == 8 and num_batches < 8  # some backend runs held more than one request's window
    assert stats.queue.max_batch_size_seen > 1 and stats.queue.errors == 0


# ---- limits and errors ------------------------------------------------------------------------


def test_a_file_over_the_size_limit_is_a_413_that_says_the_limit(http: httpx.Client) -> None:
    noise = (np.random.default_rng(0).standard_normal(MAX_AUDIO_BYTES) * 3000).astype(np.int16)
    wav_bytes = _wav_bytes(noise, 16000)
    assert len(wav_bytes) > MAX_AUDIO_BYTES
    response = post(http, wav_bytes, name="big.wav")
    assert response.status_code == 413
    error = response.json()["error"]
    assert str(MAX_AUDIO_BYTES) in error["message"] and error["code"] == "payload_too_large"


def test_audio_over_the_duration_limit_is_a_400_that_says_the_limit(
    http: httpx.Client, wav: Path, tmp_path: Path
) -> None:
    long = with_silence(wav, tmp_path / "long.wav", after_s=MAX_AUDIO_SECONDS + 5)
    response = post(http, encode(long, "ogg"), name="long.ogg")
    assert response.status_code == 400
    error = response.json()["error"]
    assert f"the limit is {MAX_AUDIO_SECONDS:g} s" in error["message"] and error["param"] == "file"


@pytest.mark.parametrize(
    "data",
    [b"definitely not audio" * 50, b"RIFF\x00\x00\x00\x00WAVEfmt ", b"\x1aE\xdf\xa3" + bytes(200)],
    ids=["text", "truncated-wav", "broken-webm"],
)
def test_a_corrupt_file_is_a_400_not_a_500(http: httpx.Client, data: bytes) -> None:
    response = post(http, data, name="broken.wav")
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "file"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": "docx"}, "response_format"),
        ({"temperature": "3"}, "temperature"),
        ({"temperature": "warm"}, "temperature"),
        ({"timestamp_granularities[]": "word"}, "timestamp_granularities"),  # needs verbose_json
        ({"response_format": "verbose_json", "timestamp_granularities[]": "sentence"}, "timestamp_granularities"),
        ({"language": "de"}, "language"),
        ({"priority": "urgent"}, "priority"),
    ],
)
def test_bad_fields_are_400s_naming_them(http: httpx.Client, wav: Path, fields: dict[str, str], param: str) -> None:
    response = post(http, wav.read_bytes(), **fields)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_missing_parts_and_wrong_models(http: httpx.Client, wav: Path) -> None:
    no_file = http.post("/v1/audio/transcriptions", data={"model": MODEL}, files={"other": ("x", b"1")})
    assert no_file.status_code == 400 and no_file.json()["error"]["param"] == "file"
    no_model = http.post("/v1/audio/transcriptions", files={"file": ("s.wav", wav.read_bytes())})
    assert no_model.status_code == 400 and no_model.json()["error"]["param"] == "model"
    as_json = http.post("/v1/audio/transcriptions", json={"model": MODEL})
    assert as_json.status_code == 400 and "multipart" in as_json.json()["error"]["message"]
    # The only speech model serves a name it does not know, as llama-server does (issue 44).
    assert post(http, wav.read_bytes(), model="whisper-huge").status_code == 200


def _wav_bytes(samples: np.ndarray, rate: int) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes(samples.astype(np.int16).tobytes())
    return buffer.getvalue()


# ---- listed and counted like any model -------------------------------------------------------


def test_the_model_is_listed_in_v1_models(client: openai.OpenAI, http: httpx.Client) -> None:
    listed = {m.id: m for m in client.models.list().data}
    assert MODEL in listed, list(listed)
    assert listed[MODEL].model_extra["meta"]["kind"] == "transcription"
    one = http.get(f"/v1/models/{MODEL}")
    assert one.status_code == 200 and one.json()["meta"]["kind"] == "transcription"


def test_metrics_count_requests_under_the_model(http: httpx.Client, wav: Path) -> None:
    labels = {"model": MODEL, "endpoint": "/v1/audio/transcriptions", "status": "200"}
    before = value(scrape(http), "localserve_requests_total", **labels)
    assert post(http, wav.read_bytes()).status_code == 200
    assert value(scrape(http), "localserve_requests_total", **labels) == before + 1
