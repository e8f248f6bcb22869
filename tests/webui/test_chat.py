"""The chat view in headless Chromium against the real server and model."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import pytest

from tests.api.harness import API_KEY, MODEL_ID, ServerThread
from tests.webui.browser import screenshot
from tests.webui.session import WATCH_UPDATES, UiSession

pytestmark = pytest.mark.slow

STATS_LINE = re.compile(r"^\d+ tokens · [\d.]+ tok/s · TTFT \d+ ms")
HOSTILE = "<img src=x onerror=alert(1)><script>window.pwned = 1</script>"


def cancelled_chats(server: ServerThread) -> float:
    """`localserve_requests_total` of chat completions the client left (499)."""
    text = httpx.get(f"{server.base_url}/metrics", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30).text
    pattern = r'localserve_requests_total\{[^}]*endpoint="/v1/chat/completions"[^}]*status="499"[^}]*\} (\S+)'
    return sum(float(value) for value in re.findall(pattern, text))


def test_the_page_loads_with_no_console_error_and_no_request_elsewhere(ui: UiSession) -> None:
    response = ui.page.goto(ui.server.base_url + "/")
    assert response is not None and response.ok
    headers = response.headers
    assert "default-src 'self'" in headers["content-security-policy"]
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert headers["x-content-type-options"] == "nosniff"
    ui.page.locator("#chat-model[data-ready=true]").wait_for(state="attached")
    options = ui.page.locator("#chat-model option").all_text_contents()
    assert MODEL_ID in options
    ui.page.wait_for_load_state("networkidle")
    assert any(url.endswith("/v1/models?all=true") for url in ui.watch.requests)
    ui.watch.assert_clean()


def test_an_answer_streams_in_several_updates_and_gets_its_stats_line(ui: UiSession) -> None:
    page = ui.open("chat")
    ui.set_max_tokens(48)
    page.evaluate(WATCH_UPDATES)
    answer = ui.wait_answer(ui.send("Write three short sentences about the sea."))
    lengths = page.evaluate("window.__answerLengths")
    # Grew in at least three separate updates. The rendered text may dip by a
    # character or two when markdown closes (`**` becomes bold, `1.` a list item).
    growths = sum(1 for a, b in zip(lengths, lengths[1:], strict=False) if b > a)
    assert growths >= 3 and lengths[-1] >= max(lengths) - 4, lengths
    assert answer.locator(".content").inner_text().strip()
    stats = answer.locator(".stats").inner_text()
    assert STATS_LINE.match(stats), stats
    assert int(stats.split()[0]) <= 48
    # Kept in the browser: after a reload the conversation is still there, titled by its first message.
    page.reload()
    page.locator("article.msg.assistant").first.wait_for()
    assert page.locator(".conversations li.active .title").inner_text().startswith("Write three short sentences")
    screenshot(page, "chat")
    ui.watch.assert_clean()


def test_stop_ends_the_stream_and_the_server_counts_it_cancelled(ui: UiSession) -> None:
    page = ui.open("chat")
    ui.set_max_tokens(600)
    before = cancelled_chats(ui.server)
    answer = ui.send("Count from 1 to 300, one number per line.")
    page.wait_for_function(
        "() => { const a = [...document.querySelectorAll('article.msg.assistant')].at(-1);"
        " return a && a.querySelector('.content').textContent.length > 20; }"
    )
    page.click("#chat-stop")
    ui.wait_answer(answer, "stopped", timeout_s=10)
    assert page.locator("#chat-send").is_visible() and not page.locator("#chat-stop").is_visible()
    assert "stopped" in answer.locator(".stats").inner_text()
    deadline = time.monotonic() + 15
    while cancelled_chats(ui.server) <= before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert cancelled_chats(ui.server) == before + 1
    assert ui.server.wait_in_flight(lambda n: n == 0, timeout=15) == 0  # the engine let it go
    ui.watch.assert_clean()


def test_markup_from_the_user_and_the_model_shows_as_text_and_runs_nothing(ui: UiSession) -> None:
    page = ui.open("chat")
    ui.set_max_tokens(64)
    # JSON mode with a schema whose only answer holds the markup: the model's own output carries it.
    page.click("details.more summary")
    page.check("#chat-json")
    schema = json.dumps({"type": "object", "properties": {"html": {"const": HOSTILE}}, "required": ["html"]})
    page.fill("#chat-schema", schema)
    page.locator("#chat-schema").dispatch_event("change")
    answer = ui.wait_answer(ui.send(f"Repeat this: {HOSTILE}"))
    assert HOSTILE in answer.locator(".content").inner_text()
    assert HOSTILE in page.locator("article.msg.user").last.inner_text()
    messages = page.locator("#chat-messages")
    assert messages.locator("img").count() == 0 and messages.locator("script").count() == 0
    page.wait_for_timeout(300)  # an onerror handler would have run by now
    assert page.evaluate("window.pwned") is None
    assert not ui.watch.dialogs
    assert not any(url.endswith("/x") for url in ui.watch.requests)  # the <img> was never fetched
    ui.watch.assert_clean()


def test_with_an_api_key_the_page_asks_for_it_then_chats(browser, ui_server: ServerThread) -> None:  # type: ignore[no-untyped-def]
    from tests.webui.browser import VIEWPORT, PageWatch

    context = browser.new_context(viewport=VIEWPORT)  # no key in sessionStorage
    try:
        page = context.new_page()
        watch = PageWatch(ui_server.base_url).attach(page)
        page.goto(ui_server.base_url + "/")
        dialog = page.locator("#key-dialog")
        dialog.wait_for(state="visible")
        assert any("401" in error for error in watch.console_errors)  # the calls without the key were refused
        page.fill("#key-input", "wrong-key")
        page.click("#key-save")
        page.locator("#key-error").filter(has_text="refused").wait_for()
        page.fill("#key-input", API_KEY)
        page.click("#key-save")
        page.locator("#chat-model[data-ready=true]").wait_for(state="attached")
        assert not dialog.is_visible()
        session = UiSession(page, watch, ui_server)
        session.set_max_tokens(16)
        answer = session.wait_answer(session.send("Say hi."))
        assert answer.locator(".content").inner_text().strip()
        assert STATS_LINE.match(answer.locator(".stats").inner_text())
    finally:
        context.close()


def test_regenerate_edit_and_resend_rename_export_and_delete(ui: UiSession) -> None:
    page = ui.open("chat")
    ui.set_max_tokens(8)
    first = ui.wait_answer(ui.send("Say one word."))
    first.locator(".regenerate").click()
    page.locator("article.msg[data-index='1'][data-state=done]").wait_for(timeout=60_000)
    assert page.locator("article.msg").count() == 2  # the answer was replaced, not added
    page.locator("article.msg.user .edit").click()
    page.fill("article.msg.user .edit-field", "Say two words.")
    page.locator("article.msg.user").get_by_role("button", name="Send").click()
    page.locator("article.msg[data-index='1'][data-state=done]").wait_for(timeout=60_000)
    assert page.locator("article.msg").count() == 2
    assert page.locator("article.msg.user .content").inner_text() == "Say two words."

    active = page.locator(".conversations li.active")
    active.get_by_role("button", name="Rename").click()
    page.fill(".conversations .rename", "Word games")
    page.keyboard.press("Enter")
    assert active.locator(".title").inner_text() == "Word games"
    with page.expect_download() as info:
        page.click("#chat-export")
    exported = json.loads(Path(info.value.path()).read_text())
    assert exported["title"] == "Word games"
    assert [m["role"] for m in exported["messages"]] == ["user", "assistant"]
    assert exported["messages"][0]["content"] == "Say two words."

    page.click("#chat-new")
    assert page.locator(".conversations li").count() == 2 and page.locator("article.msg").count() == 0
    ui.watch.accept_dialogs = True
    page.locator(".conversations li", has_text="Word games").get_by_role("button", name="Delete").click()
    assert page.locator(".conversations li").count() == 1
    assert ui.watch.dialogs == ['confirm: Delete "Word games"?']
    ui.watch.dialogs.clear()
    ui.watch.assert_clean()


def test_markdown_becomes_elements_and_code_blocks_copy(ui: UiSession) -> None:
    page = ui.open("chat")
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=ui.server.base_url)
    text = (
        "# Title\\n\\nSome **bold** and `code` <b>not bold</b>\\n\\n- one\\n- two\\n\\n```python\\nprint('<hi>')\\n```"
    )
    page.evaluate(
        f"""async () => {{
          const {{ renderMarkdown }} = await import('/ui/markdown.js');
          const box = document.createElement('div');
          box.id = 'md-test';
          box.append(renderMarkdown("{text}"));
          document.body.append(box);
        }}"""
    )
    box = page.locator("#md-test")
    assert box.locator("h3").inner_text() == "Title"
    assert box.locator("strong").inner_text() == "bold" and box.locator("p code").inner_text() == "code"
    assert box.locator("b").count() == 0 and "<b>not bold</b>" in box.locator("p").inner_text()
    assert box.locator("li").all_inner_texts() == ["one", "two"]
    assert box.locator("pre code").inner_text() == "print('<hi>')"
    box.locator(".code .copy").click()
    page.locator("#md-test .copy", has_text="Copied").wait_for()
    assert page.evaluate("navigator.clipboard.readText()") == "print('<hi>')"
    ui.watch.assert_clean()
