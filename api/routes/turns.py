"""`/v1/turns/{id}`: a turn's status, its events from any point, and stopping it.

Every route answers 404 for a turn that belongs to somebody else, so turn ids cannot be
probed across users.
"""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Header, Response
from sse_starlette import EventSourceResponse, ServerSentEvent

from api.auth import Owner
from api.encoding import encoder_for
from api.errors import ApiError
from api.pipeline import SSE_HEADERS, stream_response, turn_headers, turn_object
from api.relay import valid_cursor
from api.state import AppState, get_state
from shared import keys
from shared.cancel import request_cancel
from shared.turns import TurnRecord

router = APIRouter()
State = Annotated[AppState, Depends(get_state)]


async def _owned_turn(state: AppState, turn_id: str, owner: str) -> TurnRecord:
    record = await state.store.get(turn_id)
    if record is None or record.owner != owner:
        raise ApiError(404, f"no turn with id '{turn_id}'", param="turn_id", code="turn_not_found")
    return record


@router.get("/turns/{turn_id}")
async def get_turn(turn_id: str, owner: Owner, state: State) -> dict[str, Any]:
    return turn_object(await _owned_turn(state, turn_id, owner))


@router.post("/turns/{turn_id}/cancel")
async def cancel_turn(turn_id: str, owner: Owner, state: State) -> dict[str, Any]:
    """Stop the turn from any API process; idempotent, answers the turn as it now stands."""
    record = await _owned_turn(state, turn_id, owner)
    if not record.finished:
        await request_cancel(state.redis, turn_id, ttl_s=state.settings.turn_retention_s)
    return turn_object(record)


@router.get("/turns/{turn_id}/events")
async def turn_events(
    turn_id: str,
    owner: Owner,
    state: State,
    after: str | None = None,
    last_event_id: Annotated[str | None, Header()] = None,
) -> Response:
    """The turn's SSE from the start, or strictly after `Last-Event-ID` (or `?after=`)."""
    record = await _owned_turn(state, turn_id, owner)
    cursor = last_event_id or after
    if not valid_cursor(cursor):
        raise ApiError(400, f"malformed event id '{cursor}'", param="after", code="invalid_value")
    if not await state.redis.exists(keys.events(turn_id)):
        if record.finished:
            return _compacted_replay(record)
        raise ApiError(404, f"turn '{turn_id}' has no events", code="turn_not_found")
    return await stream_response(state, record, after=cursor)


def _compacted_replay(record: TurnRecord) -> Response:
    """After the stream's retention: the stored result as one content frame, finish, [DONE]."""
    encoder = encoder_for(record)
    body = encoder.body(record.result or {}, record.conversation_id)
    frames: list[ServerSentEvent] = []
    if record.status == "completed":
        chunk = {
            "id": body["id"],
            "object": "chat.completion.chunk" if record.request.kind == "chat" else body["object"],
            "created": body["created"],
            "model": body["model"],
            "bernard": {"type": "replay", "compacted": True},
        }
        content = (record.result or {}).get("content", "")
        finish = body["choices"][0]["finish_reason"]
        if record.request.kind == "chat":
            delta = {"role": "assistant", "content": content}
            choices = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]
            final = [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish}]
        else:
            choices = [{"text": content, "index": 0, "logprobs": None, "finish_reason": None}]
            final = [{"text": "", "index": 0, "logprobs": None, "finish_reason": finish}]
        frames.append(ServerSentEvent(data=_dumps({**chunk, "choices": choices})))
        frames.append(ServerSentEvent(data=_dumps({**chunk, "choices": final})))
    else:
        error = record.error or {"message": f"the turn {record.status}", "code": record.status}
        frames.append(ServerSentEvent(data=_dumps({"error": {**error, "param": None}})))
    frames.append(ServerSentEvent(data="[DONE]"))
    return EventSourceResponse(
        iter(frames), headers={**SSE_HEADERS, **turn_headers(record)}, ping=3600
    )


def _dumps(body: dict[str, Any]) -> str:
    return orjson.dumps(body).decode()
