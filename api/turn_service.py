"""The turn service: from a validated request to a response: admit the turn, create it,
enqueue it, answer. The routes (api/routes/) start their turns here, and answer with one
(attach to it, stream it, wait for it, show it) through its functions.

The answer depends only on the request: a stream relays the turn's stream as SSE, a
background turn not streamed answers 202 with the turn object at once (a streamed one, as
the Responses API has them, is streamed, and its end still goes to the webhook), anything
else waits for the turn's `done` entry and answers one JSON body.

Admission comes first, before anything is stored (api/admission.py: the memory guard,
the user's rate, active turns and storage budgets); then a user may have
`BERNARD_MAX_STREAMS_PER_USER` streams open, across every API process; beyond that the
answer is 429 `rate_limit_exceeded` with `Retry-After`.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Response

from api.admission import Storing, admit_turn
from api.attachments import ATTACHMENT_TTL_S, TooManyStreamsError
from api.conversations import (
    Multitask,
    Opened,
    after_claim,
    give_back,
    machine,
    open_conversation,
)
from api.cursors import Resume, after_start
from api.encoding import Encoder, terminal_error
from api.encodings import ENCODINGS, encoder_for, subject_of
from api.errors import RETRY_AFTER_S, ApiError, invalid, not_found
from api.json_response import JSONResponse
from api.metrics import TURNS_CREATED
from api.relay import relay
from api.session import StreamSession
from api.sse import FrameResponse
from api.state import AppState
from shared import traces
from shared.cancel import request_cancel
from shared.connection import REDIS_ERRORS
from shared.conversation_state import ConversationMachine, Strategy
from shared.endings import as_code, http_status, retryable
from shared.errors import ErrorCode
from shared.events import Done, TurnStatus
from shared.lifecycle import Cause
from shared.requests import AgentRequest, Delivery, TurnRequest
from shared.results import TurnResult
from shared.settings import MODEL_ID, Settings
from shared.turn_record import TurnRecord
from shared.webhook_targets import WebhookTargetError, requested_target

logger = logging.getLogger("bernard.api")

# A turn left queued this long with no worker is dropped by Redis rather than kept forever.
UNFINISHED_TTL_S = 7 * 86_400
# How long a stop waits for the turn to end before answering it as it then stands: a
# running turn stops within milliseconds; a dead worker's once its liveness lapses
# (shared/liveness.py).
CANCEL_WAIT_S = 5.0
# Resolves (and claims: api/conversations.py) the conversation a new turn belongs to,
# given the admitted turn's id: its id, or what joining its line came to.
ConversationOpener = Callable[[str], Awaitable[str | Opened | None]]


def _turn_keep_s(settings: Settings) -> int:
    """How long a conversation a turn holds is kept: while the turn may still run or be
    read (`UNFINISHED_TTL_S` + the turns' retention)."""
    return UNFINISHED_TTL_S + settings.turn_retention_s


def conversation_machine(state: AppState, owner: str) -> ConversationMachine:
    """The owner's conversations' transitions as every route runs them."""
    settings = state.settings
    return machine(
        state.redis,
        owner,
        retention_s=settings.conversation_retention_s,
        turn_keep_s=_turn_keep_s(settings),
    )


async def open_turn_conversation(
    state: AppState,
    owner: str,
    requested: str | None,
    turn_id: str,
    *,
    multitask: Multitask,
    answering: AgentRequest,
) -> Opened:
    """`open_conversation` as every route that may start a conversation runs it: kept as
    `conversation_machine` keeps one."""
    settings = state.settings
    return await open_conversation(
        state.redis,
        state.store,
        owner,
        requested,
        turn_id,
        retention_s=settings.conversation_retention_s,
        turn_keep_s=_turn_keep_s(settings),
        multitask=multitask,
        answering=answering,
    )


def multitask_of(state: AppState, requested: str | None) -> Multitask:
    """What a message does while a turn runs on its conversation: as its request says, else
    as the deployment does (`BERNARD_MULTITASK_STRATEGY`)."""
    settings = state.settings
    strategy = Strategy(requested or settings.multitask_strategy)
    return Multitask(strategy, settings.max_waiting_turns)


def check_model(model: str) -> None:
    if model != MODEL_ID:
        raise not_found(
            f"The model '{model}' does not exist; use '{MODEL_ID}'",
            "model",
            ErrorCode.MODEL_NOT_FOUND,
        )


def too_many_streams(state: AppState) -> ApiError:
    limit = state.settings.max_streams_per_user
    return ApiError(
        429,
        f"you already have {limit} streams open (BERNARD_MAX_STREAMS_PER_USER); close one",
        code=ErrorCode.RATE_LIMIT_EXCEEDED,
    )


def webhook_of(delivery: Delivery, settings: Settings) -> str | None:
    """Where the turn's end is POSTed (shared/webhooks.py): a background turn's own
    `webhook_url` when its origin is allowed (else a 400 naming it), else the deployment's
    `BERNARD_WEBHOOK_URL`; only a background turn has one."""
    requested = delivery.webhook_url
    if not delivery.background:
        if requested is not None:
            raise invalid("webhook_url is for a background turn (background: true)", "webhook_url")
        return None
    if requested is None:
        return settings.webhook_url
    try:
        return requested_target(requested, settings)
    except WebhookTargetError as exc:
        raise invalid(str(exc), "webhook_url") from None


async def start_turn(
    state: AppState,
    owner: str,
    request: TurnRequest,
    conversation: ConversationOpener | None = None,
    storing: Storing | None = None,
    accepted: Callable[[TurnRecord], Response] | None = None,
) -> Response:
    """Admit the owner's new turn, create and enqueue it, and answer as the request asks.

    `conversation` claims the turn's conversation once the turn is admitted; should the
    turn then not be created, the claim is given back (api/conversations.py `give_back`).
    `storing` says what it stores in the owner's conversations (None: no
    conversation), for its admission to check against the storage budgets."""
    settings = state.settings
    delivery = request.delivery
    delivery.webhook_url = webhook_of(delivery, settings)
    # The stream holds the rows the turn stores when its encoding shows them.
    request.agent.rows = ENCODINGS[delivery.encoding].shows_rows
    turn_id = uuid.uuid4().hex
    await admit_turn(state, owner, turn_id, storing, ttl_s=UNFINISHED_TTL_S)
    attachment = None
    claimed: str | None = None
    opened: Opened | None = None
    try:
        if delivery.stream:
            try:
                attachment = await state.streams.open(owner)
            except TooManyStreamsError:
                raise too_many_streams(state) from None
        found = await conversation(turn_id) if conversation is not None else None
        opened = found if isinstance(found, Opened) else None
        claimed = found.conversation_id if isinstance(found, Opened) else found
        if opened is not None and opened.follows is not None:
            request.agent.follows = opened.follows
        record = TurnRecord(
            id=turn_id,
            owner=owner,
            request=request,
            model=MODEL_ID,
            conversation_id=claimed,
            created_at=time.time(),
            # The worker continues the request's trace (tracing on; else None).
            traceparent=traces.current_traceparent(),
        )
        start_id = await state.store.create(
            record,
            ttl_s=UNFINISHED_TTL_S,
            queue_name=settings.queue_name,
            attachment=attachment,
            attachment_expiry=time.time() + ATTACHMENT_TTL_S,
            # In line: due once the line reaches it, or at the latest once the turn it
            # waits behind must have ended, should nobody live to move the line on.
            defer_s=settings.turn_timeout_s + 60 if request.agent.follows is not None else 0,
            webhook_subject=subject_of(delivery.encoding, turn_id),
        )
        if opened is not None and request.agent.follows is not None:
            await after_claim(
                state.redis,
                state.store,
                owner,
                opened,
                turn_id,
                ttl_s=settings.turn_retention_s,
                queue=state.queue,
            )
    except BaseException:
        # Each undone on its own: a failed release must not keep the stream counted.
        with contextlib.suppress(*REDIS_ERRORS):
            await state.store.release(owner, turn_id)
        if attachment is not None:
            with contextlib.suppress(*REDIS_ERRORS):
                await state.streams.close(owner, attachment, cancel_when_alone=False)
        if claimed is not None:
            await give_back(conversation_machine(state, owner), state.store, claimed, turn_id)
        raise
    mode = "stream" if delivery.stream else "background" if delivery.background else "wait"
    TURNS_CREATED.labels(delivery.encoding, mode).inc()
    logger.info(
        "turn created",
        extra={
            "turn_id": turn_id,
            "conversation_id": record.conversation_id,
            "user": owner,
            "kind": delivery.encoding,
            "mode": mode,
            "resume": request.agent.resume is not None,
        },
    )
    if delivery.background and not delivery.stream:
        if accepted is not None:
            answer = accepted(record)
            answer.headers.update(turn_headers(record))
            return answer
        return JSONResponse(turn_object(record), status_code=202, headers=turn_headers(record))
    encoder = encoder_for(record)
    if attachment is not None:
        return stream_response(state, record, attachment, after_start(encoder, start_id), encoder)
    return await wait_for_answer(state, record, encoder)


def turn_headers(record: TurnRecord) -> dict[str, str]:
    headers = {"X-Bernard-Turn-Id": record.id}
    if record.conversation_id:
        headers["X-Bernard-Conversation-Id"] = record.conversation_id
    return headers


async def attach(state: AppState, record: TurnRecord) -> str:
    """Open a stream of `record`'s owner on the existing turn; 429 at the owner's limit."""
    try:
        return await state.streams.open(record.owner, record.id)
    except TooManyStreamsError:
        raise too_many_streams(state) from None


def stream_response(
    state: AppState,
    record: TurnRecord,
    attachment: str,
    resume: Resume | None = None,
    encoder: Encoder | None = None,
) -> Response:
    """SSE of the turn from `resume` for the stream `attachment` (see `attach`), by
    `encoder` (the one `resume` was located with; else a fresh one of the turn's)."""

    async def on_detach(finished: bool) -> None:
        if not record.request.agent.kept:
            if not finished:
                # Nobody can come back to it (no route finds it): stopped at once, with
                # no grace for a return, and forgotten.
                await request_cancel(
                    state.redis, record.id, ttl_s=state.settings.turn_retention_s, queue=state.queue
                )
            await forget_unkept(state, record)
        cancel = not finished and record.request.delivery.on_disconnect == "cancel"
        # Once the turn has ended, its set of watchers is nobody's concern: the ending
        # deleted it with the `done` (shared/lifecycle.py, FINISH), and a stream attached
        # after that lapses with it (`ATTACHMENT_TTL_S`). Only the owner's count of open
        # streams is left to give back: one command fewer on every streamed turn.
        turn_id = None if finished else record.id
        await state.streams.close(record.owner, attachment, turn_id, cancel_when_alone=cancel)

    chunks = relay(
        state.hub,
        encoder or encoder_for(record),
        record.id,
        resume=resume,
        keepalive_s=state.settings.keepalive_s,
        detach=on_detach,
        alive=lambda: turn_exists(state, record.id),
        renew=lambda: state.streams.renew(record.owner, attachment),
    )
    return FrameResponse(chunks, headers=turn_headers(record))


def raise_if_failed(record: TurnRecord, done: Done) -> None:
    """The error envelope of a turn that did not complete, with its status code; an ending
    that may work if tried again (a failed upstream, say) says when (`Retry-After`)."""
    error = terminal_error(done)
    if error is not None:
        headers = turn_headers(record)  # the client can still look the turn up
        if retryable(error["code"]):
            headers["retry-after"] = str(RETRY_AFTER_S)
        raise ApiError(
            http_status(error["code"]),
            error["message"],
            code=as_code(error["code"]),
            type=error["type"],
            headers=headers,
        )


async def wait_for_answer(state: AppState, record: TurnRecord, encoder: Encoder) -> Response:
    """Read the turn's stream to its `done` entry, keeping what the encoding's answer is
    built from, and answer one JSON body (a failed turn: its error envelope)."""
    session = StreamSession(
        state.hub,
        record.id,
        state.settings.keepalive_s,
        alive=lambda: turn_exists(state, record.id),
    )
    kept, done = await session.read_to_done(keep=encoder.keep)
    try:
        raise_if_failed(record, done)
        result = TurnResult()
        if encoder.reads_result:
            finished = await state.store.get(record.id)
            result = (finished.result if finished else None) or result
    finally:
        if not record.request.agent.kept:
            await forget_unkept(state, record)
    return JSONResponse(encoder.answer(done, kept, result), headers=turn_headers(record))


async def forget_unkept(state: AppState, record: TurnRecord) -> None:
    """Forget a turn that is not kept (`AgentRequest.kept`) once its end was read: its record
    and stream go (after `FORGET_GRACE_S` for their emptied keys), as a deleted
    conversation's turns do. Should this fail, they expire with the turn's retention."""
    try:
        await state.store.forget(record.owner, [record.id])
    except REDIS_ERRORS as exc:
        logger.warning("unkept turn %s not forgotten (%s); it expires", record.id, exc)


async def turn_exists(state: AppState, turn_id: str) -> bool:
    """Whether the turn's record is still in Redis; True while Redis cannot tell.

    Asked after a quiet while, so it also ends a turn that never can end on its own (no
    worker holds it, or no job will ever run it: `TurnStore.settle`); its `done` follows.
    """
    try:
        return await state.store.settle(turn_id) is not None
    except REDIS_ERRORS:
        return True


async def stopped(state: AppState, record: TurnRecord) -> TurnRecord:
    """The record once its turn has ended, cancelled from this process if it had not (or as
    it stands after `CANCEL_WAIT_S`, or once its stream cannot be read); idempotent."""
    if record.finished:
        return record
    await request_cancel(
        state.redis, record.id, ttl_s=state.settings.turn_retention_s, queue=state.queue
    )
    if record.status == TurnStatus.QUEUED:
        # No worker has it yet, and there may be none: end it here, unless one took it
        # meanwhile (then that worker ends it, having heard the cancel).
        await state.store.end(record.id, record.owner, Cause.CANCELLED_QUEUED)
    await StreamSession(state.hub, record.id, CANCEL_WAIT_S).wait_for_done()
    return await state.store.get(record.id) or record


def turn_object(record: TurnRecord) -> dict[str, Any]:
    """The `bernard.turn` resource."""
    result = None
    if record.status in ("completed", "awaiting_confirmation") and record.result is not None:
        result = encoder_for(record).body(record.result)
    error = terminal_error(Done(status=record.status, error=record.error))
    return {
        "id": record.id,
        "object": "bernard.turn",
        "status": record.status,
        "created_at": record.created_at,
        "started_at": record.started_at,
        "finished_at": record.finished_at,
        "conversation_id": record.conversation_id,
        "model": record.model,
        "preview": record.preview,
        "error": error,
        "result": result,
    }
