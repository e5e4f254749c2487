"""`/v1/turns`: the owner's turns; `/v1/turns/{id}`: a turn's status, its events from any
point, and stopping it.

Every route answers 404 for a turn that belongs to somebody else, so turn ids cannot be
probed across users.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Header, Query, Response

from api.auth import Owner
from api.conversations import pending_of
from api.cursors import bad_cursor_is_400, locate, parse_cursor
from api.encodings import encoder_for
from api.errors import not_found
from api.pages import list_page
from api.relay import fixed
from api.sse import FrameResponse
from api.state import AppState, State
from api.turn_service import attach, stopped, stream_response, turn_headers, turn_object
from shared import keys
from shared.errors import ErrorCode
from shared.turn_record import TurnRecord

router = APIRouter()


async def _owned_turn(state: AppState, turn_id: str, owner: str) -> TurnRecord:
    record = await state.store.get(turn_id)
    if record is None or not record.found_by(owner):
        raise not_found(f"no turn with id '{turn_id}'", "turn_id", ErrorCode.TURN_NOT_FOUND)
    return record


@router.get("/turns")
async def list_turns(
    owner: Owner,
    state: State,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: Annotated[str | None, Query(max_length=256)] = None,
) -> dict[str, Any]:
    """The owner's turns, newest first; page with `after` (a turn id)."""
    found, more = await state.store.recent(owner, after=after, limit=limit)
    kept = [record for record in found if record.found_by(owner)]
    return list_page(await _turn_objects(state, owner, kept), more)


@router.get("/turns/{turn_id}")
async def get_turn(turn_id: str, owner: Owner, state: State) -> dict[str, Any]:
    (turn,) = await _turn_objects(state, owner, [await _owned_turn(state, turn_id, owner)])
    return turn


async def _turn_objects(
    state: AppState, owner: str, records: list[TurnRecord]
) -> list[dict[str, Any]]:
    """The turn objects, a paused turn's status saying whether it still waits: a turn that
    ended `awaiting_confirmation` keeps that status in its record for good, while its
    proposals (shared/records/keeper.py) are decided, or lapse, later. One that no longer waits
    reads `decided` (each of its proposals was approved or rejected: the turns that
    carried out the decisions are turns of their own) or `expired` (none waits, not all
    were decided: they lapsed, or the conversation was deleted)."""
    objects = [turn_object(record) for record in records]
    paused = sorted(
        {
            record.conversation_id
            for record in records
            if record.status == "awaiting_confirmation" and record.conversation_id
        }
    )
    if not paused:
        return objects
    async with state.redis.pipeline(transaction=False) as pipe:
        for conversation_id in paused:
            pipe.hvals(keys.conversation_proposals(owner, conversation_id))
        replies = await pipe.execute()
    proposals = [orjson.loads(raw) for values in replies for raw in values]
    now = time.time()
    for record, turn in zip(records, objects, strict=True):
        if record.status == "awaiting_confirmation" and record.conversation_id:
            own = [p for p in proposals if p.get("turn_id") == record.id]
            turn["status"] = waiting_status(own, now)
    return objects


def waiting_status(proposals: list[dict[str, Any]], now: float) -> str:
    """What a paused turn's proposals (those it made) say of it: see `_turn_objects`."""
    if pending_of(proposals, now):
        return "awaiting_confirmation"
    if proposals and all(p.get("state") in ("approved", "rejected") for p in proposals):
        return "decided"
    return "expired"


@router.post("/turns/{turn_id}/cancel")
async def cancel_turn(turn_id: str, owner: Owner, state: State) -> dict[str, Any]:
    """Stop the turn from any API process; idempotent. Answers the turn once it has ended
    (api/turn_service.py `stopped`)."""
    return turn_object(await stopped(state, await _owned_turn(state, turn_id, owner)))


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
    with bad_cursor_is_400(last_event_id):
        cursor = parse_cursor(last_event_id or after)
    if not await state.redis.exists(keys.events(turn_id)):
        if record.finished:
            return _compacted_replay(record)
        raise not_found(f"turn '{turn_id}' has no events", code=ErrorCode.TURN_NOT_FOUND)
    encoder = encoder_for(record)
    with bad_cursor_is_400(last_event_id):
        resume = await locate(state.redis, encoder, turn_id, cursor)
    return stream_response(state, record, await attach(state, record), resume, encoder)


def _compacted_replay(record: TurnRecord) -> Response:
    """After the stream's retention: the stored result as one content frame, the ending
    (shared/endings.py), [DONE]."""
    frames = encoder_for(record).compacted(record)
    return FrameResponse(fixed(frames), headers=turn_headers(record))
