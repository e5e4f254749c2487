"""Server-sent events read from the bytes Bernard streams, as the WHATWG spec says
(https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation).

`SseDecoder.feed` takes whatever bytes arrived (a chunk may end mid-line, even mid-character)
and returns the events that blank lines completed. Lines end with CRLF, LF or CR. Comments
(`: ping`, Bernard's keepalives) and `retry:` are dropped, and so is an event with no data,
as a browser would. No line length limit: a stored row Bernard streams may be long.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass, field

# Only these end a line: str.splitlines would also split on U+2028 and others inside data.
_BREAK = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True, slots=True)
class ServerEvent:
    """One dispatched event: its name ("" when it had none), data and id, if it had one."""

    event: str
    data: str
    id: str | None = None


@dataclass(slots=True)
class SseDecoder:
    """The text not yet ended by a line break, and the fields of the event being read."""

    _utf8: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace")
    )
    _pending: str = ""
    _event: str = ""
    _data: list[str] = field(default_factory=list)
    _id: str | None = None

    def feed(self, chunk: bytes) -> list[ServerEvent]:
        text = self._pending + self._utf8.decode(chunk)
        events = []
        start = 0
        for match in _BREAK.finditer(text):
            if match.group() == "\r" and match.end() == len(text):
                break  # maybe the first half of a CRLF: wait for the next chunk
            event = self._line(text[start : match.start()])
            start = match.end()
            if event is not None:
                events.append(event)
        self._pending = text[start:]
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
