"""Server-sent events read from the bytes Bernard streams, as the WHATWG spec says
(https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation).

`SseDecoder.feed` takes whatever bytes arrived (a chunk may end mid-line, even mid-character)
and returns the events that blank lines completed. Lines end with CRLF, LF or CR. Comments
(`: ping`, Bernard's keepalives) and `retry:` are dropped, and so is an event with no data,
as a browser would.

Each chunk is looked at once: the part of a line not yet ended is kept as the pieces it
came in and joined when its line ends, so a long line costs its length, not its length
times its chunks. A line longer than `MAX_LINE_CHARS`, far above any event Bernard sends,
raises `LineTooLong` as soon as it passes it: what is read of one line is bounded.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass, field
from typing import Final

# Only these end a line: str.splitlines would also split on U+2028 and others inside data.
_BREAK = re.compile(r"\r\n|\r|\n")
# The longest line read: above Bernard's own bounds on what one event carries (a request's
# body is 4 MiB at most, a stored message 1,000,000 characters).
MAX_LINE_CHARS: Final = 4 * 2**20


class LineTooLong(ValueError):
    """A line of the stream passed `MAX_LINE_CHARS` before it ended."""


@dataclass(frozen=True, slots=True)
class ServerEvent:
    """One dispatched event: its name ("" when it had none), data and id, if it had one."""

    event: str
    data: str
    id: str | None = None


@dataclass(slots=True)
class SseDecoder:
    """The pieces of the line not yet ended, and the fields of the event being read."""

    max_line_chars: int = MAX_LINE_CHARS
    _utf8: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace")
    )
    _pending: list[str] = field(default_factory=list)
    _pending_chars: int = 0
    # The last chunk ended with CR: an LF opening the next one is the rest of that CRLF.
    _after_cr: bool = False
    _event: str = ""
    _data: list[str] = field(default_factory=list)
    _id: str | None = None

    def feed(self, chunk: bytes) -> list[ServerEvent]:
        text = self._utf8.decode(chunk)
        if not text:
            return []
        start = 0
        if self._after_cr:
            self._after_cr = False
            if text.startswith("\n"):
                start = 1
        events = []
        for match in _BREAK.finditer(text, start):
            piece = text[start : match.start()]
            if self._pending:
                self._pending.append(piece)
                line = "".join(self._pending)
                self._pending, self._pending_chars = [], 0
            else:
                line = piece
            if len(line) > self.max_line_chars:
                raise LineTooLong(f"a line of the stream is over {self.max_line_chars} characters")
            start = match.end()
            event = self._line(line)
            if event is not None:
                events.append(event)
        self._after_cr = text.endswith("\r")
        rest = text[start:]
        if rest:
            self._pending.append(rest)
            self._pending_chars += len(rest)
            if self._pending_chars > self.max_line_chars:
                raise LineTooLong(f"a line of the stream is over {self.max_line_chars} characters")
        return events

    def _line(self, line: str) -> ServerEvent | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id" and "\0" not in value:
            self._id = value
        return None

    def _dispatch(self) -> ServerEvent | None:
        event = None
        if self._data:
            event = ServerEvent(self._event, "\n".join(self._data), self._id or None)
        self._event, self._data, self._id = "", [], None
        return event
