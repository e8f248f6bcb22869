"""Reading tool calls out of a model's text as it streams (see `tools` for
the format). One parser serves streaming and whole answers, so both see the
same calls with the same `arguments` text."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from localserve.serving.tools import TOOL_CLOSE, TOOL_OPEN
from localserve.serving.types import ToolCall

# The start of a call as the grammar writes it (whitespace tolerated for
# templates' own formats): the name is known, the arguments come next.
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(slots=True)
class Delta:
    """What a piece of text added: `content`, or for call `index` its start
    (`call_id` and `name`), a piece of its `arguments`, or its end (`done`)."""

    content: str = ""
    index: int = -1
    call_id: str = ""
    name: str = ""
    arguments: str = ""
    done: bool = False


@dataclass(slots=True)
class ParsedCall:
    """A call as it is being read; `complete` once its closing tag came."""

    id: str
    name: str
    arguments: str = ""  # JSON text, as the model wrote it
    complete: bool = False

    def whole(self) -> ToolCall:
        return ToolCall(self.id, self.name, self.arguments)


class _JsonValueEnd:
    """Finds where one JSON value ends in text that arrives in pieces."""

    def __init__(self) -> None:
        self.started = False
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.scalar = False

    def scan(self, text: str) -> tuple[int, int, bool]:
        """(start, end, done): the value's characters in `text` are
        `text[start:end]`; leading whitespace is skipped."""
        start = 0
        for i, char in enumerate(text):
            if not self.started:
                if char.isspace():
                    start = i + 1
                    continue
                self.started = True
                if char in "{[":
                    self.depth = 1
                elif char == '"':
                    self.in_string = True
                else:
                    self.scalar = True
                continue
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif char == "\\":
                    self.escaped = True
                elif char == '"':
                    self.in_string = False
                    if self.depth == 0:
                        return start, i + 1, True
            elif self.scalar:
                if char in ",}] \t\r\n":
                    return start, i, True
            elif char == '"':
                self.in_string = True
            elif char in "{[":
                self.depth += 1
            elif char in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return start, i + 1, True
        return start, len(text), False


def _same_call(a: ParsedCall, b: ParsedCall) -> bool:
    """Same name and the same arguments once parsed (whitespace aside)."""
    if a.name != b.name:
        return False
    try:
        return bool(json.loads(a.arguments or "{}") == json.loads(b.arguments or "{}"))
    except ValueError:
        return a.arguments.strip() == b.arguments.strip()


@dataclass(slots=True)
class ToolCallParser:
    """Feed the reply's text as it comes; get content and call deltas back.

    Every call after the first is held back until it is complete: a call
    identical to an earlier one (same name, same parsed arguments; a model
    not trained on tools repeats itself until `max_tokens`) is never
    returned, and the reply ends there (`repeated` is set). A later call cut
    off by the end of the reply is dropped, never half-sent."""

    state: str = "start"  # start | text | head | args | tail | between | ended
    buffer: str = ""
    calls: list[ParsedCall] = field(default_factory=list)
    content: str = ""
    repeated: bool = False  # a call repeated an earlier one: the reply is over
    _value: _JsonValueEnd = field(default_factory=_JsonValueEnd)
    _held: list[Delta] = field(default_factory=list)  # the deltas of a later call, until it is complete

    def feed(self, text: str) -> list[Delta]:
        if self.state == "ended":
            return []
        self.buffer += text
        out: list[Delta] = []
        while self._step(out):
            pass
        return self._release(out)

    def finish(self) -> list[Delta]:
        """The reply ended: text held back as a possible call start is content;
        a later call still open is dropped."""
        if self.state == "start" and self.buffer:
            self.state = "text"
            return self.feed("")
        if self.state in ("head", "args", "tail") and len(self.calls) > 1:
            self.calls.pop()
            self._held.clear()
            self.state = "ended"
        return []

    @property
    def num_complete(self) -> int:
        return sum(call.complete for call in self.calls)

    def _release(self, out: list[Delta]) -> list[Delta]:
        """Hold a later call's deltas until its end; drop it if it repeats."""
        released: list[Delta] = []
        for delta in out:
            if delta.index < 1:
                released.append(delta)
                continue
            self._held.append(delta)
            if not delta.done:
                continue
            call = self.calls[delta.index]
            if any(_same_call(call, earlier) for earlier in self.calls[: delta.index]):
                del self.calls[delta.index :]  # the repeat, and whatever this text held after it
                self._held.clear()
                self.repeated = True
                self.state = "ended"
                break
            released += self._held
            self._held.clear()
        return released

    def _step(self, out: list[Delta]) -> bool:
        """Handle what the buffer allows; True to go on."""
        if self.state == "text":
            if self.buffer:
                self.content += self.buffer
                out.append(Delta(content=self.buffer))
                self.buffer = ""
            return False
        if self.state in ("start", "between"):
            stripped = self.buffer.lstrip()
            if stripped.startswith(TOOL_OPEN):
                self.buffer = stripped[len(TOOL_OPEN) :]
                self.calls.append(ParsedCall(new_call_id(), ""))
                self.state = "head"
                return True
            if not stripped or TOOL_OPEN.startswith(stripped):
                return False  # not decided yet
            if self.state == "start":
                self.state = "text"
                return True
            self.buffer = ""  # text after the calls: the grammar never writes it
            return False
        call = self.calls[-1]
        index = len(self.calls) - 1
        if self.state == "head":
            match = _HEAD.match(self.buffer)
            if match:
                call.name = json.loads(f'"{match.group(1)}"')
                out.append(Delta(index=index, call_id=call.id, name=call.name))
                self.buffer = self.buffer[match.end() :]
                self._value = _JsonValueEnd()
                self.state = "args"
                return True
            if TOOL_CLOSE in self.buffer:  # another shape: read the block whole
                body, _, self.buffer = self.buffer.partition(TOOL_CLOSE)
                self._whole_call(body, call, index, out)
                self.state = "between"
                return True
            return False
        if self.state == "args":
            start, end, done = self._value.scan(self.buffer)
            piece = self.buffer[start:end]
            if piece:
                call.arguments += piece
                out.append(Delta(index=index, arguments=piece))
            self.buffer = self.buffer[end:]
            if done:
                self.state = "tail"
                return True
            return False
        # tail: the rest of the call up to its closing tag
        position = self.buffer.find(TOOL_CLOSE)
        if position == -1:
            return False
        self.buffer = self.buffer[position + len(TOOL_CLOSE) :]
        call.complete = True
        out.append(Delta(index=index, done=True))
        self.state = "between"
        return True

    def _whole_call(self, body: str, call: ParsedCall, index: int, out: list[Delta]) -> None:
        try:
            obj = json.loads(body)
        except ValueError:
            obj = None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            self.calls.pop()  # not a call after all
            return
        arguments = obj.get("arguments", obj.get("parameters", {}))
        call.name = obj["name"]
        call.arguments = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        call.complete = True
        out.append(Delta(index=index, call_id=call.id, name=call.name))
        out.append(Delta(index=index, arguments=call.arguments))
        out.append(Delta(index=index, done=True))


@dataclass(frozen=True, slots=True)
class ParsedReply:
    content: str | None
    calls: list[ToolCall]


def parse_reply(text: str) -> ParsedReply:
    """A whole reply: its complete calls, or (none) its text as content.
    A call cut off by the token limit is left out; with no complete call
    the raw text stays the content, so nothing the model wrote is lost."""
    parser = ToolCallParser()
    parser.feed(text)
    parser.finish()
    calls = [call.whole() for call in parser.calls if call.complete]
    if not calls:
        return ParsedReply(text, [])
    return ParsedReply(parser.content or None, calls)
