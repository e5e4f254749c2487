"""Relays a turn's stream to one client as SSE, the moment each entry lands.

Frame ids: an entry that encodes to one frame has the entry id as its SSE `id`; an entry
that encodes to several (the final `done`: finish, usage, `[DONE]`) numbers them
`<entry id>:<k>`. A client resuming from any id gets exactly the frames after it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
from sse_starlette import ServerSentEvent

from api.encoding import Encoder
from api.hub import StreamHub
from shared.events import Done
from shared.streams import Entry

Detach = Callable[[bool], Awaitable[None]]


def parse_cursor(value: str | None) -> tuple[str, int | None]:
    """`"1700-0:1"` → ("1700-0", 1); `"1700-0"` → ("1700-0", None); None → ("0-0", None)."""
    if not value:
        return "0-0", None
    entry_id, _, index = value.partition(":")
    return entry_id, int(index) if index else None


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
    after: str = "0-0",
    first: list[ServerSentEvent] | None = None,
    keepalive_s: float,
    detach: Detach | None = None,
) -> AsyncIterator[ServerSentEvent]:
    """SSE events of the turn from strictly after `after` until its `done` entry.

    `detach(finished)` runs when the client goes away or the stream ends, shielded from
    the cancellation that a disconnect delivers.
    """
    finished = False
    try:
        for event in first or []:
            yield event
        async with hub.read(turn_id, after) as reader:
            while True:
                try:
                    entry = await reader.next(wait_s=keepalive_s)
                except TimeoutError:
                    keepalive = encoder.keepalive()
                    yield (
                        ServerSentEvent(data=keepalive)
                        if keepalive
                        else ServerSentEvent(comment="ping")
                    )
                    continue
                for event in entry_events(encoder, entry):
                    yield event
                if isinstance(entry[1].event, Done):
                    finished = True
                    return
    finally:
        if detach is not None:
            with anyio.CancelScope(shield=True):
                await detach(finished)
