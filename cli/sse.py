"""Server-sent events, parsed line by line as the WHATWG spec says
(https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation).

`SseParser.feed` takes one line (without its line ending) and returns the event that a
blank line completes. Comments (`: ping`) and `retry:` are dropped; an event with no data
is dropped too, as a browser would.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ServerEvent:
    """One dispatched event: its name ("" when it has none: a browser dispatches those as
    `message`, which is also a name Bernard's conversation streams use), data and id, if it
    had one."""

    event: str
    data: str
    id: str | None = None


@dataclass(slots=True)
class SseParser:
    """The fields of the event being read, until a blank line dispatches it."""

    _event: str = ""
    _data: list[str] = field(default_factory=list)
    _id: str | None = None

    def feed(self, line: str) -> ServerEvent | None:
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
