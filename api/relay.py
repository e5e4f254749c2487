"""Relays a turn's stream to one client as SSE, the moment each entry lands.

Frame ids are cursors (api/cursors.py): a client resuming from any id it got receives
exactly the frames after it. The relay ends at the first `done` entry, whatever follows
it, and always with a terminal frame: the turn's own, or `turn_lost` when the turn's
record vanished, or `stream_unreadable` when Redis refused this reader's read.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Awaitable, Callable

import anyio
from sse_starlette import ServerSentEvent

from api.attachments import RENEW_S
from api.cursors import Resume, numbered
from api.encoding import Encoder, Frame, Named
from api.hub import Hub, StreamReadError
from api.metrics import FRAMES_RELAYED, STREAMS_OPEN
from shared.events import Done
from shared.lifecycle import Cause, ending_events_of
from shared.streams import Entry

Detach = Callable[[bool], Awaitable[None]]
# Whether the turn's record still exists (see `relay`).
Alive = Callable[[], Awaitable[bool]]
# Called every `RENEW_S` while the stream is open (api/attachments.py).
Renew = Callable[[], Awaitable[None]]


def sse(frame: Frame, frame_id: str | None = None) -> ServerSentEvent:
    """One frame on the wire (a named one with its `event:` line)."""
    if isinstance(frame, Named):
        return ServerSentEvent(data=frame.data, event=frame.event, id=frame_id)
    return ServerSentEvent(data=frame, id=frame_id)


def ending_frames(encoder: Encoder, cause: Cause) -> list[ServerSentEvent]:
    """The closing frames of a stream that cannot go on (shared/lifecycle.py: a reader's
    causes, `RECORD_GONE` and `UNREADABLE`)."""
    return [sse(frame) for event in ending_events_of(cause) for frame in encoder.frames(event)]


def entry_events(encoder: Encoder, entry: Entry) -> list[ServerSentEvent]:
    """The SSE events of one entry, with their ids (api/cursors.py `numbered`)."""
    entry_id, stamped = entry
    return [
        sse(frame, frame_id)
        for frame_id, frame in numbered(entry_id, encoder.frames(stamped.event))
    ]


async def relay(
    hub: Hub,
    encoder: Encoder,
    turn_id: str,
    *,
    resume: Resume | None = None,
    keepalive_s: float,
    detach: Detach | None = None,
    alive: Alive | None = None,
    renew: Renew | None = None,
) -> AsyncGenerator[list[ServerSentEvent], None]:
    """SSE events of the turn from `resume` (api/cursors.py: `locate`) until its `done`,
    in batches: every entry that has arrived by the time the client can take more goes
    out together (api/sse.py writes a batch in one send).

    `detach(finished)` runs when the client goes away or the stream ends, shielded from
    the cancellation that a disconnect delivers. `alive()` is asked after every quiet
    `keepalive_s`: once the turn's record is gone (Redis restarted without persistence),
    no `done` can ever come, so the stream ends with a `turn_lost` error, not a hang.
    """
    resume = resume or Resume()
    finished = resume.finished
    STREAMS_OPEN.inc()
    renewed = time.monotonic()
    try:
        if resume.head:
            yield [sse(frame, frame_id) for frame_id, frame in resume.head]
        if finished:
            return
        async with hub.read(turn_id, resume.after) as reader:
            while True:
                if renew is not None and time.monotonic() - renewed > RENEW_S:
                    renewed = time.monotonic()
                    await renew()
                try:
                    first = await reader.next(wait_s=keepalive_s)
                except TimeoutError:
                    if alive is not None and not await alive():
                        yield ending_frames(encoder, Cause.RECORD_GONE)
                        finished = True
                        return
                    keepalive = encoder.keepalive()
                    yield [
                        ServerSentEvent(data=keepalive)
                        if keepalive
                        else ServerSentEvent(comment="ping")
                    ]
                    continue
                except StreamReadError:
                    yield ending_frames(encoder, Cause.UNREADABLE)
                    return
                batch: list[ServerSentEvent] = []
                for entry in (first, *reader.ready()):
                    batch += entry_events(encoder, entry)
                    if isinstance(entry[1].event, Done):
                        finished = True
                        break
                FRAMES_RELAYED.inc(len(batch))
                if batch:
                    yield batch
                if finished:
                    return
    finally:
        STREAMS_OPEN.dec()
        if detach is not None:
            with anyio.CancelScope(shield=True):
                await detach(finished)
