"""What a test does with the UI, in the user's terms: open a view, pick the
model, send a message, wait for the answer."""

from __future__ import annotations

from dataclasses import dataclass

from playwright.sync_api import Locator, Page

from tests.api.harness import MODEL_ID, ServerThread
from tests.webui.browser import PageWatch

#: Records the text length of the last assistant message at each DOM change
#: (how many separate updates the user saw while the answer streamed).
WATCH_UPDATES = """() => {
  window.__answerLengths = [];
  const box = document.getElementById('chat-messages');
  new MutationObserver(() => {
    const answers = box.querySelectorAll('article.msg.assistant');
    const last = answers[answers.length - 1];
    if (last && last.dataset.state === 'streaming') {
      const length = last.querySelector('.content').textContent.length;
      if (window.__answerLengths.at(-1) !== length) window.__answerLengths.push(length);
    }
  }).observe(box, {childList: true, subtree: true, characterData: true});
}"""


@dataclass
class UiSession:
    page: Page
    watch: PageWatch
    server: ServerThread

    def open(self, view: str = "chat") -> Page:
        self.page.goto(f"{self.server.base_url}/#{view}")
        self.page.locator(f"#view-{view}").wait_for(state="visible")
        if view == "chat":
            self.page.locator("#chat-model[data-ready=true]").wait_for(state="attached")
            self.page.select_option("#chat-model", MODEL_ID)
        return self.page

    def set_max_tokens(self, n: int) -> None:
        self.page.fill("#chat-max-tokens", str(n))
        self.page.locator("#chat-max-tokens").dispatch_event("change")

    def send(self, text: str) -> Locator:
        """Type `text` and send it; the answer's element."""
        num_answers = self.page.locator("article.msg.assistant").count()
        self.page.fill("#chat-input", text)
        self.page.click("#chat-send")
        answer = self.page.locator("article.msg.assistant").nth(num_answers)
        answer.wait_for(state="attached")
        return answer

    def wait_answer(self, answer: Locator, state: str = "done", timeout_s: float = 120) -> Locator:
        self.page.wait_for_function(
            "([el, state]) => el.dataset.state === state",
            arg=[answer.element_handle(), state],
            timeout=timeout_s * 1000,
        )
        return answer
