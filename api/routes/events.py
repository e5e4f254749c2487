"""`GET /v1/events`: the user's own event stream, for clients that stay connected (a voice
satellite, the playground): `timer_fired` when a timer rings (shared/timers.py).

Named SSE events, each with its stream entry id; a client that reconnects with
`Last-Event-ID` (or `?after=`) gets what it missed, as far back as the stream keeps (its
latest 1,000 events); from further back, an `error` event (`stream_trimmed`) ends it, and
the client reconnects without a cursor. Without a cursor the stream starts with the next
event. It counts as one of the user's open streams (`BERNARD_MAX_STREAMS_PER_USER`). It is
relayed as a turn's stream is (api/relay.py); should Redis refuse to read it, an `error`
event (`stream_unreadable`) ends it, and the client reconnects with its last id.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Response

from api.attachments import TooManyStreamsError
from api.auth import Owner
from api.cursors import Resume, bad_cursor_is_400, parse_cursor
from api.encodings.user_events import UserEventsEncoder
from api.relay import relay
from api.sse import FrameResponse
from api.state import State
from api.turn_service import too_many_streams
from shared import keys
from shared.streams import parse_entries

router = APIRouter()


@router.get("/events")
async def user_events(
    owner: Owner,
    state: State,
    after: str | None = None,
    last_event_id: Annotated[str | None, Header()] = None,
) -> Response:
    with bad_cursor_is_400(last_event_id):
        cursor = parse_cursor(last_event_id or after)
    stream_id = keys.user_stream_id(owner)
    if cursor is not None:
        start = cursor.entry_id
    else:  # from the next event: after the latest there is
        latest = parse_entries(await state.redis.xrevrange(keys.events(stream_id), count=1))
        start = latest[0][0] if latest else "0-0"
    try:
        attachment = await state.streams.open(owner)
    except TooManyStreamsError:
        raise too_many_streams(state) from None

    async def detach(finished: bool) -> None:
        await state.streams.close(owner, attachment, cancel_when_alone=False)

    chunks = relay(
        state.hub,
        UserEventsEncoder(),
        stream_id,
        resume=Resume(after=start),
        keepalive_s=state.settings.keepalive_s,
        detach=detach,
        renew=lambda: state.streams.renew(owner, attachment),
    )
    return FrameResponse(chunks)
