"""Relays a stream to one client as SSE bytes, the moment each entry lands.

Frame ids are cursors (api/cursors.py): a client resuming from any id it got receives
exactly the frames after it. The relay ends at the first `done` entry, whatever follows
it, and always with a terminal frame: the turn's own, or `turn_lost` when the turn's
record vanished, `stream_unreadable` when Redis refused this reader's read, or
`stream_trimmed` when entries this client had not read yet were trimmed from the stream
(`BERNARD_STREAM_MAXLEN`), rather than a stream with a hole in it (api/session.py reads
the stream; the encoder says what each event is on the wire).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing

import anyio

from api.cursors import Resume, numbered
from api.encoding import Frame, Framing, Named
from api.hub import Hub
from api.metrics import FRAMES_RELAYED, STREAMS_OPEN
from api.session import QUIET, Alive, Broken, Renew, StreamSession
from api.sse import PING, text
from shared.events import Done
from shared.lifecycle import Cause, ending_events_of
from shared.streams import Entry

Detach = Callable[[bool], Awaitable[None]]

__all__ = [
    "Alive",
    "Detach",
    "Renew",
    "ending_frames",
    "entry_frames",
    "fixed",
    "relay",
    "sse_text",
]


def sse_text(frame: Frame, frame_id: str | None = None) -> str:
    """One frame on the wire (a named one with its `event:` line)."""
    if isinstance(frame, Named):
        return text(frame.data, frame.event, frame_id)
    return text(frame, None, frame_id)


def fixed(frames: list[Frame]) -> bytes:
    """Frames known at once (no ids: a replay or an answer that is not a stream's)."""
    return "".join(sse_text(frame) for frame in frames).encode()


def ending_frames(encoder: Framing, cause: Cause) -> list[Frame]:
    """The closing frames of a stream that cannot go on (shared/lifecycle.py: a reader's
    causes, `RECORD_GONE`, `UNREADABLE` and `TRIMMED`)."""
    return [frame for event in ending_events_of(cause) for frame in encoder.frames(event)]


def entry_frames(encoder: Framing, entry: Entry) -> list[tuple[str, Frame]]:
    """The frames of one entry, with their ids (api/cursors.py `numbered`)."""
    entry_id, stamped = entry
    return numbered(entry_id, encoder.frames(stamped.event))


async def relay(
    hub: Hub,
    encoder: Framing,
    stream_id: str,
    *,
    resume: Resume | None = None,
    keepalive_s: float,
    detach: Detach | None = None,
    alive: Alive | None = None,
    renew: Renew | None = None,
) -> AsyncGenerator[bytes, None]:
    """The SSE bytes of the stream from `resume` (api/cursors.py: `locate`) until its
    `done`, in chunks: every entry that has arrived by the time the client can take more
    goes out in one (api/sse.py sends a chunk in one send).

    `detach(finished)` runs when the client goes away or the stream ends, shielded from
    the cancellation that a disconnect delivers. `alive()` is asked after every quiet
    `keepalive_s`: once the turn's record is gone (Redis restarted without persistence),
    no `done` can ever come, so the stream ends with a `turn_lost` error, not a hang.
    """
    resume = resume or Resume()
    finished = resume.finished
    session = StreamSession(hub, stream_id, keepalive_s, alive=alive, renew=renew)
    STREAMS_OPEN.inc()
    try:
        if resume.head:
            yield "".join(sse_text(frame, frame_id) for frame_id, frame in resume.head).encode()
        if finished:
            return
        async with aclosing(session.watch(resume.after)) as seen:
            async for batch in seen:
                if batch is QUIET:
                    keepalive = encoder.keepalive()
                    yield (sse_text(keepalive) if keepalive is not None else PING).encode()
                elif isinstance(batch, Broken):
                    # A lost turn has nothing left to cancel; an unreadable stream's may run.
                    finished = batch.cause == Cause.RECORD_GONE
                    yield fixed(ending_frames(encoder, batch.cause))
                else:
                    chunk = []
                    for entry_id, stamped in batch:
                        frames = encoder.frames(stamped.event)
                        chunk += [sse_text(f, i) for i, f in numbered(entry_id, frames)]
                    finished = isinstance(batch[-1][1].event, Done)
                    FRAMES_RELAYED.inc(len(chunk))
                    if chunk:
                        yield "".join(chunk).encode()
    finally:
        STREAMS_OPEN.dec()
        if detach is not None:
            with anyio.CancelScope(shield=True):
                await detach(finished)
