"""Frame ids as cursors: what a client sends back to resume a stream, checked strictly.

An entry that encodes to one frame has the entry id as its SSE `id` (`1700000000000-3`); an
entry that encodes to several (the final `done`: finish, usage, `[DONE]`) numbers them
`<entry id>:<k>`. The `done` entry's id is the sentinel that seals the stream
(shared/lifecycle.py, `SEALED_ID`, the largest id Redis has): its frames show it as `done`
(`done:0`, `done:1`, ...), not as the 64-bit numbers. A client resumes with the last id it
got (`Last-Event-ID` or `?after=`).

`parse_cursor` accepts exactly what this server hands out: ASCII digits, each part of the
entry id within Redis's 64-bit range, or `done`. `locate` then checks the cursor against
the turn's stream before any response starts (a frame index the entry does not have, an id
past the stream's last entry, or one between its entries that no entry has, was never
handed out; one before its first entry was, and trimmed since) and says what the client
still needs from the entry it names. Either raises `BadCursorError`, which the route
answers with a 400.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from redis.asyncio import Redis

from api.encoding import Encoder, Frame
from api.errors import invalid
from shared import keys
from shared.events import Done, Start
from shared.lifecycle import SEALED_ID
from shared.streams import Entry, entry_key, parse_entries

U64_MAX = 2**64 - 1
# `[0-9]`, not `\d`: `\d` also matches other scripts' digits ("٣-٣"), which Redis refuses.
_CURSOR = re.compile(r"(?:([0-9]{1,20})-([0-9]{1,20})|done)(?::([0-9]{1,9}))?")
# How the `done` entry's frames name it (SEALED_ID is no id to show a client).
DONE_ID = "done"


class BadCursorError(ValueError):
    """The cursor is not a frame id this server handed out for this turn."""


@dataclass(frozen=True, slots=True)
class Cursor:
    """A parsed frame id: the entry and, inside a multi-frame entry, the frame index."""

    entry_id: str
    frame: int | None = None

    @property
    def key(self) -> tuple[int, int]:
        return entry_key(self.entry_id)


@contextmanager
def bad_cursor_is_400(last_event_id: str | None) -> Iterator[None]:
    """A `BadCursorError` inside becomes a 400 naming where the cursor came from: the
    `Last-Event-ID` header when the request sent one, else the `after` parameter."""
    try:
        yield
    except BadCursorError as exc:
        raise invalid(str(exc), "Last-Event-ID" if last_event_id else "after") from None


def parse_cursor(text: str | None) -> Cursor | None:
    """`"1700-0:1"` → Cursor("1700-0", 1); `"1700-0"` → Cursor("1700-0"); None or "" → None
    (from the start). Raises `BadCursorError` for anything else."""
    if not text:
        return None
    match = _CURSOR.fullmatch(text)
    if match is None:
        raise BadCursorError(f"malformed event id {text!r}: expected <ms>-<seq> or <ms>-<seq>:<k>")
    frame = int(match[3]) if match[3] is not None else None
    if match[1] is None:
        return Cursor(SEALED_ID, frame)
    ms, seq = int(match[1]), int(match[2])
    if ms > U64_MAX or seq > U64_MAX:
        raise BadCursorError(f"event id {text!r} is out of range")
    return Cursor(f"{ms}-{seq}", frame)


@dataclass(slots=True)
class Resume:
    """Where a stream resumes: strictly after the entry `after`, once `head` is sent.

    `head` holds the frames (SSE id, data) still owed from the entry the cursor named;
    `finished` says nothing comes after them: the turn's `done` is at or before the cursor.
    """

    after: str = "0-0"
    head: list[tuple[str | None, Frame]] = field(default_factory=list)
    finished: bool = False


def numbered(entry_id: str, frames: list[Frame]) -> list[tuple[str, Frame]]:
    """The SSE ids of one entry's frames: the entry id for a single frame, `<id>:<k>` for
    each of several; the `done` entry's id shown as `DONE_ID`."""
    shown = DONE_ID if entry_id == SEALED_ID else entry_id
    if len(frames) == 1:
        return [(shown, frames[0])]
    return [(f"{shown}:{k}", frame) for k, frame in enumerate(frames)]


def after_start(encoder: Encoder, start_id: str) -> Resume:
    """A new turn's stream, whose `start` entry (id `start_id`) its creation just wrote:
    that entry's frames go out at once, without reading them back from Redis."""
    return Resume(after=start_id, head=list(numbered(start_id, encoder.frames(Start()))))


async def locate(redis: Redis, encoder: Encoder, turn_id: str, cursor: Cursor | None) -> Resume:
    """Check `cursor` against the turn's stream; raises `BadCursorError` if it was never
    handed out. One round trip."""
    if cursor is None:
        return Resume()
    stream = keys.events(turn_id)
    async with redis.pipeline(transaction=False) as pipe:
        pipe.xrange(stream, min=cursor.entry_id, max=cursor.entry_id)
        pipe.xrevrange(stream, count=2)
        pipe.xrange(stream, count=1)
        at_raw, last_raw, first_raw = await pipe.execute()
    ends = [entry_id for entry_id, _ in parse_entries(last_raw)]
    if ends and ends[0] == SEALED_ID:
        # A finished turn: its `done` has the largest id there is. Past the entry before
        # it, only the `done` itself was ever handed out.
        ends = ends[1:] if cursor.entry_id != SEALED_ID else []
    if ends and cursor.key > entry_key(ends[0]):
        raise BadCursorError(f"event id '{cursor.entry_id}' is beyond the end of the stream")
    resume = Resume(after=cursor.entry_id)
    at: list[Entry] = parse_entries(at_raw)
    if not at:
        first = parse_entries(first_raw)
        if first and cursor.key >= entry_key(first[0][0]):
            # Between entries the stream still holds: an id no entry ever had.
            raise BadCursorError(f"event id '{cursor.entry_id}' was never sent on this stream")
        # Trimmed from the stream (MAXLEN), or the stream is gone: go on after it. What
        # was trimmed after it, the hub finds and ends the stream `stream_trimmed` for
        # (api/hub.py `StreamHead`).
        return resume
    entry_id, stamped = at[0]
    frames = encoder.frames(stamped.event)
    if cursor.frame is not None:
        if len(frames) < 2 or cursor.frame >= len(frames):
            shown = DONE_ID if entry_id == SEALED_ID else entry_id
            raise BadCursorError(f"event '{shown}' has no frame {cursor.frame}")
        resume.head = list(numbered(entry_id, frames)[cursor.frame + 1 :])
    if isinstance(stamped.event, Done):
        resume.finished = True
        if not resume.head and encoder.END is not None:
            # Nothing is left to send, but the client still needs to hear that it ended.
            resume.head = [(None, encoder.END)]
    return resume
