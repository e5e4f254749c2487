"""Relays a turn's stream to one client as SSE, the moment each entry lands.

Frame ids: an entry that encodes to one frame has the entry id as its SSE `id`; an entry
that encodes to several (the final `done`: finish, usage, `[DONE]`) numbers them
`<entry id>:<k>`. A client resuming from any id gets exactly the frames after it.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
from sse_starlette import ServerSentEvent

from api.encoding import Encoder
from api.hub import StreamHub
from api.metrics import FRAMES_RELAYED, STREAMS_OPEN, TURNS_ENDED
from shared.events import Done, Error
from shared.streams import Entry, read_entry
from shared.turns import failed_done

Detach = Callable[[bool], Awaitable[None]]
# Whether the turn's record still exists (see `relay`).
Alive = Callable[[], Awaitable[bool]]
TURN_LOST = "the turn was lost: Redis no longer holds it (restarted without persistence?)"


_CURSOR = re.compile(r"^\d+-\d+(:\d+)?$")


def valid_cursor(value: str | None) -> bool:
    """Whether `value` is a frame id this server hands out (or absent: from the start)."""
    return value is None or bool(_CURSOR.match(value))


def parse_cursor(value: str | None) -> tuple[str, int | None]:
    """`"1700-0:1"` → ("1700-0", 1); `"1700-0"` → ("1700-0", None); None → ("0-0", None)."""
    if not value:
        return "0-0", None
    entry_id, _, index = value.partition(":")
    return entry_id, int(index) if index else None


def lost_events(encoder: Encoder) -> list[ServerSentEvent]:
    """The terminal frames of a turn that vanished from Redis before it ended: `turn_lost`."""
    events = [Error(message=TURN_LOST, code="turn_lost"), failed_done(TURN_LOST, "turn_lost")]
    return [ServerSentEvent(data=frame) for event in events for frame in encoder.frames(event)]


def entry_events(
    encoder: Encoder, entry: Entry, skip_through: int | None = None
) -> list[ServerSentEvent]:
    """The SSE events of one entry, leaving out frames up to index `skip_through`."""
    entry_id, stamped = entry
    frames = encoder.frames(stamped.event)
    if len(frames) == 1:
        return [ServerSentEvent(data=frames[0], id=entry_id)] if skip_through is None else []
    return [
        ServerSentEvent(data=frame, id=f"{entry_id}:{k}")
        for k, frame in enumerate(frames)
        if skip_through is None or k > skip_through
    ]


async def relay(
    hub: StreamHub,
    encoder: Encoder,
    turn_id: str,
    *,
    after: str | None = None,
    keepalive_s: float,
    detach: Detach | None = None,
    alive: Alive | None = None,
) -> AsyncIterator[ServerSentEvent]:
    """SSE events of the turn from strictly after the frame id `after` until its `done`.

    `detach(finished)` runs when the client goes away or the stream ends, shielded from
    the cancellation that a disconnect delivers. `alive()` is asked after every quiet
    `keepalive_s`: once the turn's record is gone (Redis restarted without persistence),
    no `done` can ever come, so the stream ends with a `turn_lost` error, not a hang.
    """
    entry_id, index = parse_cursor(after)
    finished = False
    STREAMS_OPEN.inc()
    try:
        if index is not None:
            # Resuming inside a multi-frame entry: first the rest of that entry.
            for entry in await read_entry(hub.redis, turn_id, entry_id):
                for event in entry_events(encoder, entry, skip_through=index):
                    yield event
                finished = isinstance(entry[1].event, Done)
        if finished:
            return
        async with hub.read(turn_id, entry_id) as reader:
            while True:
                try:
                    entry = await reader.next(wait_s=keepalive_s)
                except TimeoutError:
                    if alive is not None and not await alive():
                        for event in lost_events(encoder):
                            yield event
                        finished = True
                        return
                    keepalive = encoder.keepalive()
                    yield (
                        ServerSentEvent(data=keepalive)
                        if keepalive
                        else ServerSentEvent(comment="ping")
                    )
                    continue
                events = entry_events(encoder, entry)
                FRAMES_RELAYED.inc(len(events))
                for event in events:
                    yield event
                if isinstance(done := entry[1].event, Done):
                    TURNS_ENDED.labels(done.status).inc()
                    finished = True
                    return
    finally:
        STREAMS_OPEN.dec()
        if detach is not None:
            with anyio.CancelScope(shield=True):
                await detach(finished)
