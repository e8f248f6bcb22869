"""Incremental, UTF-8-safe detokenization and stop-string matching.

Tokens arrive one at a time; their bytes may split a UTF-8 character, and a
stop string may span several tokens. `OutputText` emits only text that is
final: complete characters that cannot be the start of a stop string.
"""

from __future__ import annotations

import codecs


class OutputText:
    """The text of one sequence's output, built token by token. It keeps only
    what may still change (held text); what it returned is the caller's."""

    __slots__ = ("_decoder", "_stops", "_max_stop_len", "_held", "stopped_by")

    def __init__(self, stop: tuple[str, ...] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = tuple(s for s in stop if s)
        self._max_stop_len = max((len(s) for s in self._stops), default=0)
        self._held = ""  # decoded text not yet emitted (may begin a stop string)
        self.stopped_by: str | None = None

    def push(self, piece: bytes) -> str:
        """Add one token's bytes; return the text that became final."""
        if self.stopped_by is not None:
            return ""
        self._held += self._decoder.decode(piece)
        if not self._stops:
            return self._emit(len(self._held))
        # A stop string may end in this piece and begin in held text. The
        # earliest match wins: no text after any stop string may be emitted.
        matches = [(index, stop) for stop in self._stops if (index := self._held.find(stop)) != -1]
        if matches:
            index, self.stopped_by = min(matches)
            delta = self._held[:index]
            self._held = ""
            return delta
        return self._emit(len(self._held) - self._partial_stop_len())

    def flush(self) -> str:
        """The sequence ended: emit whatever is held (a cut-off character
        becomes U+FFFD, a partial stop string is plain text)."""
        if self.stopped_by is not None:
            return ""
        self._held += self._decoder.decode(b"", final=True)
        return self._emit(len(self._held))

    def _emit(self, num_chars: int) -> str:
        delta, self._held = self._held[:num_chars], self._held[num_chars:]
        return delta

    def _partial_stop_len(self) -> int:
        """Length of the longest tail of held text that begins some stop string."""
        held = self._held
        for length in range(min(len(held), self._max_stop_len - 1), 0, -1):
            tail = held[-length:]
            if any(stop.startswith(tail) for stop in self._stops):
                return length
        return 0
