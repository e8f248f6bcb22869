"""The dashboard, models, batch jobs and speech views in headless Chromium
against the real server and model."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.api.harness import API_KEY, MODEL_ID, ServerThread
from tests.fixtures.tiny_gguf import write_tiny_llama
from tests.models.conftest import home, hub  # noqa: F401  (a private Hugging Face cache and a fake hub)
from tests.models.hub import FakeHub
from tests.webui.browser import screenshot
from tests.webui.session import UiSession

EMBEDDINGS_MODEL = "all-minilm-l6-v2-gguf"  # small and quick to load: for load / unload

pytestmark = pytest.mark.slow


@contextmanager
def load(server: ServerThread, num_streams: int = 3, max_tokens: int = 160) -> Iterator[None]:
    """Streaming chat requests from other clients while the block runs."""

    def one(i: int) -> None:
        body = {
            "model": MODEL_ID,
            "messages": [{"role": "user", "content": f"Tell a long story about a lighthouse keeper number {i}."}],
            "max_tokens": max_tokens,
            "stream": True,
        }
        headers = {"Authorization": f"Bearer {API_KEY}"}
        with httpx.stream(
            "POST", f"{server.base_url}/v1/chat/completions", json=body, headers=headers, timeout=120
        ) as r:
            for _ in r.iter_bytes():
                pass

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(num_streams)]
    for t in threads:
        t.start()
    try:
        yield
    finally:
        for t in threads:
            t.join(120)


def test_the_dashboard_shows_running_requests_and_a_moving_chart(ui: UiSession) -> None:
    page = ui.open("dashboard")
    page.locator("#dash-state").filter(has_text="live").wait_for()
    with load(ui.server, num_streams=4, max_tokens=300):
        page.wait_for_function("() => Number(document.getElementById('dash-running').textContent) >= 1")
        page.locator("#dash-requests tr[data-state=running]").first.wait_for()
        chart = page.locator("#dash-chart")
        page.wait_for_function("() => Number(document.getElementById('dash-chart').dataset.last) > 0", timeout=30_000)
        first = (int(chart.get_attribute("data-points") or 0), float(chart.get_attribute("data-last") or 0))
        page.wait_for_function(
            f"() => Number(document.getElementById('dash-chart').dataset.points) > {first[0]}", timeout=10_000
        )
        assert page.locator(f"[data-model='{MODEL_ID}']").inner_text().count("interactive") >= 2
        page.wait_for_function(
            "() => Number(document.getElementById('dash-chart').dataset.points) >= 8", timeout=30_000
        )
        screenshot(page, "dashboard")
    ui.watch.assert_clean()


def test_models_view_lists_the_loaded_model_and_its_details(ui: UiSession) -> None:
    page = ui.open("models")
    row = page.locator(f"#models-rows tr[data-model='{MODEL_ID}']")
    row.wait_for()
    assert row.get_attribute("data-loaded") == "true"
    row.get_by_role("button", name="Details").click()
    page.locator("#model-details").filter(has_text='"family"').wait_for()
    assert "llama" in page.locator("#model-details").inner_text()
    screenshot(page, "models")
    ui.watch.assert_clean()


def test_a_model_loads_with_a_keep_alive_and_unloads(ui: UiSession) -> None:
    page = ui.open("models")
    row = page.locator(f"#models-rows tr[data-model='{EMBEDDINGS_MODEL}']")
    row.and_(page.locator("[data-loaded=false]")).wait_for()
    page.fill("#models-keep-alive", "2m")
    row.get_by_role("button", name="Load").click()
    row.and_(page.locator("[data-loaded=true]")).wait_for(timeout=60_000)
    assert "2m" in row.inner_text()
    loaded = ui.server.call(lambda: set(ui.server.registry.oneshot))
    assert EMBEDDINGS_MODEL in loaded
    row.get_by_role("button", name="Unload").click()
    row.and_(page.locator("[data-loaded=false]")).wait_for(timeout=30_000)
    assert EMBEDDINGS_MODEL not in ui.server.call(lambda: set(ui.server.registry.oneshot))
    ui.watch.assert_clean()


def test_a_pull_shows_its_progress_and_the_model_appears(ui: UiSession, hub: FakeHub, tmp_path: Path) -> None:  # noqa: F811
    data = write_tiny_llama(tmp_path / "tiny.gguf").read_bytes()
    hub.add("test/tiny-GGUF", "tiny-Q4_K_M.gguf", data)
    page = ui.open("models")
    page.fill("#pull-model", "test/tiny-GGUF")
    page.click("#pull-start")
    page.locator("#pull-status").filter(has_text="success").wait_for(timeout=60_000)
    assert page.locator("#pull-progress").evaluate("bar => bar.value") == 1
    ui.watch.assert_clean()


def test_a_batch_file_is_uploaded_runs_to_the_end_and_its_output_downloads(ui: UiSession, tmp_path: Path) -> None:
    lines = [
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": MODEL_ID,
                "messages": [{"role": "user", "content": f"Name a colour ({i})."}],
                "max_tokens": 8,
            },
        }
        for i in range(3)
    ]
    source = tmp_path / "three.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    page = ui.open("batches")
    page.set_input_files("#batch-file", str(source))
    page.click("#batch-create")
    page.locator("#batch-message").filter(has_text="started batch_").wait_for()
    batch_id = page.locator("#batch-message").inner_text().split()[-1]
    row = page.locator(f"#batch-rows tr[data-id='{batch_id}']")
    row.and_(page.locator("[data-status=completed]")).wait_for(timeout=120_000)
    assert "3 / 3" in row.inner_text()
    with page.expect_download() as info:
        row.locator(".download-output").click()
    output = [json.loads(line) for line in Path(info.value.path()).read_text().splitlines()]
    assert sorted(item["custom_id"] for item in output) == ["line-0", "line-1", "line-2"]
    assert all(item["response"]["status_code"] == 200 for item in output)
    screenshot(page, "batches")
    ui.watch.assert_clean()


def test_a_dropped_audio_file_is_transcribed(ui: UiSession, tmp_path: Path) -> None:
    from tests.fixtures.speech import SENTENCE, have_espeak, speak

    if not have_espeak():
        pytest.skip("espeak-ng is not installed (make test installs it)")
    audio = speak(SENTENCE, tmp_path / "weather.wav")
    page = ui.open("speech")
    page.locator("#speech-model option").first.wait_for(state="attached")
    # Dropped on the drop zone, as a user drags it from a file manager.
    drop = page.evaluate_handle(
        """([bytes, name]) => { const data = new DataTransfer();
             data.items.add(new File([new Uint8Array(bytes)], name, {type: 'audio/wav'})); return data; }""",
        [list(audio.read_bytes()), audio.name],
    )
    page.dispatch_event("#speech-drop", "drop", {"dataTransfer": drop})
    page.locator("#speech-transcript").filter(has_text="weather").wait_for(timeout=120_000)
    assert "sunny" in page.locator("#speech-transcript").inner_text().lower()
    screenshot(page, "speech")
    ui.watch.assert_clean()
