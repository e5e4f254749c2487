"""From a validated request to a response: create the turn, enqueue it, answer.

The answer depends only on the request: a stream relays the turn's stream as SSE, a
background turn answers 202 with the turn object at once, anything else waits for the
turn's `done` entry and answers one JSON body.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import Response
from redis.exceptions import RedisError
from sse_starlette import EventSourceResponse

from api.attachments import attach, detach
from api.encoding import encoder_for, terminal_error
from api.errors import ApiError
from api.metrics import TURNS_CREATED
from api.relay import TURN_LOST, relay
from api.responses import JSONResponse
from api.state import AppState
from shared import keys
from shared.events import Done
from shared.settings import MODEL_ID
from shared.turns import TurnRecord, TurnRequest, failed_done

# A turn left queued this long with no worker is dropped by Redis rather than kept forever.
_UNFINISHED_TTL_S = 7 * 86_400
# HTTP status of a non-stream request whose turn failed, by error code.
_FAILED_STATUS = {
    "upstream_error": 502,
    "upstream_timeout": 504,
    "turn_timeout": 504,
    "worker_lost": 503,
    "worker_shutdown": 503,
    "turn_lost": 503,
    "turn_cancelled": 409,
}
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def check_model(model: str) -> None:
    if model != MODEL_ID:
        raise ApiError(
            404,
            f"The model '{model}' does not exist; use '{MODEL_ID}'",
            param="model",
            code="model_not_found",
        )


async def create_turn(
    state: AppState, owner: str, request: TurnRequest, conversation_id: str | None = None
) -> TurnRecord:
    """Store the turn, open its stream and enqueue it; the worker takes it from there."""
    record = TurnRecord(
        id=uuid.uuid4().hex,
        owner=owner,
        request=request,
        model=MODEL_ID,
        conversation_id=conversation_id,
        created_at=time.time(),
    )
    await state.store.create(record, ttl_s=_UNFINISHED_TTL_S, queue_name=state.settings.queue_name)
    mode = "background" if request.background else "stream" if request.stream else "wait"
    TURNS_CREATED.labels(request.kind, mode).inc()
    return record


def turn_headers(record: TurnRecord) -> dict[str, str]:
    headers = {"X-Bernard-Turn-Id": record.id}
    if record.conversation_id:
        headers["X-Bernard-Conversation-Id"] = record.conversation_id
    return headers


async def respond(state: AppState, record: TurnRecord) -> Response:
    """The response to the request that created `record`."""
    if record.request.background:
        return JSONResponse(turn_object(record), status_code=202, headers=turn_headers(record))
    if record.request.stream:
        return await stream_response(state, record)
    return await wait_for_body(state, record)


async def stream_response(
    state: AppState, record: TurnRecord, after: str | None = None
) -> Response:
    """SSE of the turn from strictly after frame id `after`; the client counts as attached."""
    attachment = await attach(state.redis, record.id)

    async def on_detach(finished: bool) -> None:
        cancel = not finished and record.request.on_disconnect == "cancel"
        await detach(state.redis, state.settings, record.id, attachment, cancel_when_alone=cancel)

    events = relay(
        state.hub,
        encoder_for(record),
        record.id,
        after=after,
        keepalive_s=state.settings.keepalive_s,
        detach=on_detach,
        alive=lambda: turn_exists(state, record.id),
    )
    return EventSourceResponse(events, headers={**SSE_HEADERS, **turn_headers(record)}, ping=3600)


async def wait_for_body(state: AppState, record: TurnRecord) -> Response:
    """Read the turn's stream to its `done` entry and answer one JSON body."""
    async with state.hub.read(record.id) as reader:
        while True:
            try:
                _, stamped = await reader.next(wait_s=state.settings.keepalive_s)
            except TimeoutError:
                if await turn_exists(state, record.id):
                    continue
                done = failed_done(TURN_LOST, "turn_lost")  # no `done` entry will ever come
                break
            if isinstance(stamped.event, Done):
                done = stamped.event
                break
    error = terminal_error(done)
    if error is not None:
        status = _FAILED_STATUS.get(error["code"], 500)
        raise ApiError(status, error["message"], code=error["code"], type=error["type"])
    finished = await state.store.get(record.id)
    result = (finished.result if finished else None) or {}
    body = encoder_for(record).body(result, record.conversation_id)
    return JSONResponse(body, headers=turn_headers(record))


async def turn_exists(state: AppState, turn_id: str) -> bool:
    """Whether the turn's record is still in Redis; True while Redis cannot tell."""
    try:
        return bool(await state.redis.exists(keys.turn(turn_id)))
    except (RedisError, OSError):
        return True


def turn_object(record: TurnRecord) -> dict[str, Any]:
    """The `bernard.turn` resource."""
    result = None
    if record.status == "completed" and record.result is not None:
        result = encoder_for(record).body(record.result, record.conversation_id)
    return {
        "id": record.id,
        "object": "bernard.turn",
        "status": record.status,
        "created_at": record.created_at,
        "started_at": record.started_at,
        "finished_at": record.finished_at,
        "conversation_id": record.conversation_id,
        "model": record.model,
        "error": record.error,
        "result": result,
    }
