"""A model's reasoning, split from its answer.

Reasoning models (Qwen3, DeepSeek-R1 distills, SmolLM3, ...) write their
thinking between markers before the answer: `<think>...</think>`. Their
chat template says so: it mentions the markers, and some open the section
in the prompt already (the generation prompt ends with `<think>`), so the
output starts inside it. `ReasoningFormat.of` reads both from the template.

`ReasoningParser` splits a choice's text as it streams, holding back only
what could be the start of a marker, into reasoning and content. The
dialects put the reasoning in their own fields: `reasoning_content`
(OpenAI chat, as llama-server and vLLM do), `thinking` blocks (Anthropic),
`reasoning` items (Responses), `message.thinking` (Ollama).

`think: false` (Ollama) or `reasoning_effort: "none"` (OpenAI) closes the
section in the prompt (`closed_prompt`): the template is rendered with
`enable_thinking=False` (Qwen3's switch), and an empty section is written
after the generation prompt if the template did not write one itself.

A JSON schema or tools constrain the answer, not the thinking before it:
`reasoning_grammar` puts the think section in front of the request's
grammar. A budget (`--reasoning-budget N`, Anthropic's
`thinking.budget_tokens`) caps the section: after N thinking tokens the
sampler writes the closing marker itself (backends/constraints.py,
`ThinkBudget`), as llama-server's `--reasoning-budget` does.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

from localserve.backends.chat_template import ChatTemplate

OPEN, CLOSE = "<think>", "</think>"
REASONING, CONTENT = "reasoning", "content"


@dataclass(frozen=True, slots=True)
class ReasoningFormat:
    """A model's think markers, and whether its prompt opens the section."""

    open: str = OPEN
    close: str = CLOSE
    starts_open: bool = False

    @classmethod
    def of(cls, template: ChatTemplate) -> ReasoningFormat | None:
        """The format the model's chat template writes, or None when the
        template knows no think section (once per compiled template)."""
        return _format_of(template)

    @classmethod
    def read(cls, template: ChatTemplate) -> ReasoningFormat | None:
        if template.is_default or CLOSE not in template.source:
            return None
        try:
            prompt = template.render([{"role": "user", "content": "hi"}], enable_thinking=True)
        except Exception:  # a template that needs more than a plain turn: assume the section is not opened
            prompt = ""
        return cls(starts_open=prompt.rstrip().endswith(OPEN))

    def closed_prompt(self, prompt: str) -> str:
        """`prompt` (ending with the generation prompt) with the think
        section opened and closed, empty, unless it is closed already."""
        tail = prompt.rstrip()
        if tail.endswith(self.close):
            return prompt
        if tail.endswith(self.open):
            return f"{tail}\n\n{self.close}\n\n"
        return f"{prompt}{self.open}\n\n{self.close}\n\n"


@functools.lru_cache(maxsize=64)
def _format_of(template: ChatTemplate) -> ReasoningFormat | None:
    return ReasoningFormat.read(template)


class ReasoningParser:
    """Splits streamed text into (kind, text) pieces; one section, at the
    start (leading whitespace allowed), as the models write it."""

    __slots__ = ("_format", "_inside", "_buffer", "_started", "_after_open", "_after_close")

    def __init__(self, fmt: ReasoningFormat) -> None:
        self._format = fmt
        self._inside = fmt.starts_open
        self._started = fmt.starts_open  # the section was seen (or opened by the prompt)
        self._buffer = ""
        self._after_open = fmt.starts_open  # strip the newlines that open the section
        self._after_close = False  # strip the blank lines between the section and the answer

    def feed(self, text: str) -> list[tuple[str, str]]:
        self._buffer += text
        out: list[tuple[str, str]] = []
        while self._buffer:
            if self._inside:
                if self._after_open:
                    self._buffer = self._buffer.lstrip("\n")
                    if not self._buffer:
                        break
                    self._after_open = False
                index = self._buffer.find(self._format.close)
                if index < 0:
                    keep = _partial(self._buffer, self._format.close)
                    _add(out, REASONING, self._buffer[: len(self._buffer) - keep])
                    self._buffer = self._buffer[len(self._buffer) - keep :]
                    break
                _add(out, REASONING, self._buffer[:index])
                self._buffer = self._buffer[index + len(self._format.close) :]
                self._inside, self._after_close = False, True
                continue
            if self._after_close:
                stripped = self._buffer.lstrip()
                if not stripped:
                    self._buffer = ""
                    break
                self._buffer, self._after_close = stripped, False
            if not self._started:
                stripped = self._buffer.lstrip()
                if stripped.startswith(self._format.open):
                    self._buffer = stripped[len(self._format.open) :]
                    self._inside = self._started = self._after_open = True
                    continue
                if not stripped or self._format.open.startswith(stripped):
                    break  # could still become the opening marker
                self._started = True
            _add(out, CONTENT, self._buffer)
            self._buffer = ""
        return out

    def finish(self) -> list[tuple[str, str]]:
        """What is held back, at the end of the choice."""
        rest, self._buffer = self._buffer, ""
        if not rest or self._after_close:
            return [(CONTENT, rest.lstrip())] if rest.strip() else []
        return [(REASONING if self._inside else CONTENT, rest)]


def split_reasoning(text: str, fmt: ReasoningFormat | None) -> tuple[str | None, str]:
    """A whole answer's (reasoning or None, content)."""
    if fmt is None:
        return None, text
    parser = ReasoningParser(fmt)
    pieces = parser.feed(text) + parser.finish()
    reasoning = "".join(t for kind, t in pieces if kind == REASONING)
    content = "".join(t for kind, t in pieces if kind == CONTENT)
    seen = parser._started and (fmt.starts_open or reasoning or CLOSE in text)
    return (reasoning if seen else None), content


def reasoning_grammar(fmt: ReasoningFormat, answer: str) -> str:
    """One llguidance grammar: the think section (anything up to its first
    closing marker), then the answer under the grammar `answer`. A model
    whose prompt does not open the section may also skip it."""
    opened = "" if fmt.starts_open else f"{json.dumps(fmt.open)} "
    close = fmt.close.replace("/", "\\/")
    lark = "\n".join(
        [
            f"start: {opened}ls_think LS_GAP @ls_answer" + ("" if fmt.starts_open else " | @ls_answer"),
            f"ls_think[lazy]: /(?s:.*){close}/",  # lazy: it ends at the first closing marker
            "LS_GAP: /[ \\t\\n]*/",
        ]
    )
    inner = json.loads(answer)["grammars"] if answer.lstrip().startswith("{") else [{"lark_grammar": answer}]
    inner[0] = {**inner[0], "name": "ls_answer"}
    return json.dumps({"grammars": [{"lark_grammar": lark + "\n"}, *inner]})


def _partial(text: str, marker: str) -> int:
    """The length of the longest end of `text` that starts `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def _add(out: list[tuple[str, str]], kind: str, text: str) -> None:
    if text:
        out.append((kind, text))
