"""`/v1/conversations`: create, list, read and delete conversations, post a message to one
and decide on the tool calls it waits on.

Owner-scoped like every route: another user's conversation, or a missing one, is the same
404. Posting a message and resuming run a turn on the stored history; the answer is JSON
(wait for the turn, then its rows) unless the client sends `Accept: text/event-stream`,
which streams the turn's named events (api/encoding.py: `ConversationEncoder`). A
conversation runs one turn at a time (409 `conversation_busy`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import jsonschema
import orjson
from fastapi import APIRouter, Depends, Header, Query, Response
from pydantic import BaseModel, ConfigDict, Field
from sse_starlette import ServerSentEvent

from api.auth import Owner
from api.conversations import (
    check_conversation_id,
    claim_conversation,
    conversation_not_found,
    conversation_object,
    delete_conversation,
    is_conversation_id,
    pending_of,
    public_proposal,
    status_of,
)
from api.errors import ApiError, invalid
from api.json_route import OrjsonRoute
from api.pages import list_page
from api.pipeline import start_turn
from api.responses import JSONResponse
from api.sse import FrameResponse
from api.state import AppState, get_state
from shared.errors import ErrorCode
from shared.records import ConversationExistsError, RecordKeeper, row_position
from shared.turns import TurnRequest

router = APIRouter(route_class=OrjsonRoute)
State = Annotated[AppState, Depends(get_state)]
# OpenAI's limits on `metadata`: 16 pairs, keys up to 64 characters, values up to 512.
_METADATA_PAIRS, _METADATA_KEY, _METADATA_VALUE = 16, 64, 512


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class NewConversation(_Body):
    """`POST /v1/conversations`: an id of the client's choosing (else a fresh one)."""

    id: str | None = None
    metadata: dict[str, str] | None = Field(None, max_length=_METADATA_PAIRS)


class NewMessage(_Body):
    """`POST /v1/conversations/{id}/messages`: the new message only; the rest is stored."""

    content: str = Field(min_length=1)
    metadata: dict[str, str] | None = Field(None, max_length=_METADATA_PAIRS)
    # Stream the prompts sent to each model, each call's latency and usage (`trace` events).
    trace: bool = False


class ResumeRequest(_Body):
    """`POST /v1/conversations/{id}/resume`: the user's decision on one proposal."""

    confirmation_id: str = Field(min_length=1, max_length=256)
    decision: Literal["approve", "reject"]
    arguments: dict[str, Any] | None = None
    trace: bool = False  # as `NewMessage.trace`, for the turn the decision starts


def _keeper(state: AppState, owner: str) -> RecordKeeper:
    return RecordKeeper(state.redis, owner, retention_s=state.settings.conversation_retention_s)


def _wants_stream(accept: str | None) -> bool:
    return "text/event-stream" in (accept or "")


def _check_metadata(metadata: dict[str, str] | None) -> None:
    for key, value in (metadata or {}).items():
        if len(key) > _METADATA_KEY or len(value) > _METADATA_VALUE:
            raise invalid(
                f"metadata keys may have {_METADATA_KEY} characters and values {_METADATA_VALUE}",
                "metadata",
            )


async def _owned(state: AppState, owner: str, conversation_id: str) -> Any:
    if not is_conversation_id(conversation_id):
        raise conversation_not_found(conversation_id)
    conversation = await _keeper(state, owner).get_conversation(conversation_id)
    if conversation is None:
        raise conversation_not_found(conversation_id)
    return conversation


@router.post("/conversations", status_code=201)
async def create(owner: Owner, state: State, body: NewConversation | None = None) -> JSONResponse:
    """Start a conversation (201), under the client's id if it gives one (409 if taken)."""
    body = body or NewConversation()
    if body.id is not None:
        check_conversation_id(body.id, "id")
    _check_metadata(body.metadata)
    keeper = _keeper(state, owner)
    try:
        conversation_id = await keeper.create_conversation(body.id, metadata=body.metadata)
    except ConversationExistsError:
        raise ApiError(
            409,
            f"you already have a conversation with id '{body.id}'",
            param="id",
            code=ErrorCode.CONVERSATION_EXISTS,
        ) from None
    conversation = await keeper.get_conversation(conversation_id)
    assert conversation is not None
    return JSONResponse(conversation_object(conversation, "idle", []), status_code=201)


@router.get("/conversations")
async def list_conversations(
    owner: Owner,
    state: State,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: Annotated[str | None, Query(max_length=256)] = None,
) -> dict[str, Any]:
    """The owner's conversations, last used first; page with `after` (an id)."""
    keeper = _keeper(state, owner)
    found, more = await keeper.list_conversations(after=after, limit=limit)
    data = []
    for conversation in found:
        status, pending = await status_of(keeper, state.store, conversation)
        data.append(conversation_object(conversation, status, pending))
    return list_page(data, more)


@router.get("/conversations/{conversation_id}")
async def get_conversation(conversation_id: str, owner: Owner, state: State) -> dict[str, Any]:
    conversation = await _owned(state, owner, conversation_id)
    status, pending = await status_of(_keeper(state, owner), state.store, conversation)
    return conversation_object(conversation, status, pending)


@router.get("/conversations/{conversation_id}/messages")
async def list_messages(
    conversation_id: str,
    owner: Owner,
    state: State,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: Annotated[str | None, Query(max_length=64)] = None,
) -> dict[str, Any]:
    """The stored rows, oldest first; page with `after` (a message id)."""
    await _owned(state, owner, conversation_id)
    if after is not None:
        try:
            row_position(after)
        except ValueError:
            raise invalid(f"'{after}' is not a message id (msg_<n>)", "after") from None
    rows, more = await _keeper(state, owner).rows(conversation_id, after=after, limit=limit)
    return list_page(rows, more)


@router.delete("/conversations/{conversation_id}")
async def delete(conversation_id: str, owner: Owner, state: State) -> dict[str, Any]:
    """Remove the conversation's metadata, messages, call records and proposals at once
    (the answer is OpenAI's deletion object)."""
    await delete_conversation(
        state.redis, owner, conversation_id, retention_s=state.settings.conversation_retention_s
    )
    return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}


@router.post("/conversations/{conversation_id}/messages")
async def post_message(
    conversation_id: str,
    owner: Owner,
    state: State,
    body: NewMessage,
    accept: Annotated[str | None, Header()] = None,
) -> Response:
    """Run a turn on the stored history plus this message (409 while the conversation is
    busy); JSON or named SSE events by `Accept`."""
    await _owned(state, owner, conversation_id)
    if len(body.content) > state.settings.max_message_chars:
        raise invalid(
            f"a message may hold at most {state.settings.max_message_chars} characters "
            "(BERNARD_MAX_MESSAGE_CHARS)",
            "content",
        )
    _check_metadata(body.metadata)
    stream = _wants_stream(accept)
    request = TurnRequest(
        kind="conversation",
        messages=[{"role": "user", "content": body.content}],
        stream=stream,
        trace=body.trace,
        on_disconnect="continue",
    )
    return await _run(state, owner, conversation_id, request)


@router.post("/conversations/{conversation_id}/resume")
async def resume(
    conversation_id: str,
    owner: Owner,
    state: State,
    body: ResumeRequest,
    accept: Annotated[str | None, Header()] = None,
) -> Response:
    """Decide one waiting tool call. Once every call its turn proposed is decided, the
    conversation goes on as a new turn: what was approved runs, the model hears what was
    declined, and answers. 409 for a second decision or one after the proposal expired."""
    await _owned(state, owner, conversation_id)
    keeper = _keeper(state, owner)
    proposal = next(
        (
            p
            for p in await keeper.proposals(conversation_id)
            if p["confirmation_id"] == body.confirmation_id
        ),
        None,
    )
    if proposal is None:
        raise ApiError(
            404,
            f"no tool call waits for confirmation '{body.confirmation_id}'",
            param="confirmation_id",
            code=ErrorCode.CONFIRMATION_NOT_FOUND,
        )
    if body.decision == "approve" and body.arguments is not None:
        _check_arguments(body.arguments, proposal.get("parameters") or {})
    decision = await keeper.decide(
        conversation_id,
        body.confirmation_id,
        body.decision,
        arguments=body.arguments if body.decision == "approve" else None,
    )
    if decision.outcome in ("approved", "rejected"):
        raise ApiError(
            409,
            f"this tool call was already {decision.outcome}",
            param="confirmation_id",
            code=ErrorCode.CONFIRMATION_ALREADY_DECIDED,
        )
    if decision.outcome == "expired":
        raise ApiError(
            409,
            "this tool call waited too long for a decision (BERNARD_CONFIRMATION_TTL_S) and "
            "was not run",
            param="confirmation_id",
            code=ErrorCode.CONFIRMATION_EXPIRED,
        )
    if decision.outcome == "missing":
        raise conversation_not_found(conversation_id)  # deleted meanwhile
    stream = _wants_stream(accept)
    if decision.pending:
        # Another call of the same step still waits: nothing runs until all are decided.
        left = pending_of(await keeper.proposals(conversation_id))
        return _still_waiting(public_proposal(left[0]) if left else None, stream)
    request = TurnRequest(
        kind="conversation",
        messages=[],
        stream=stream,
        trace=body.trace,
        on_disconnect="continue",
        resume={
            "turn_id": proposal["turn_id"],
            "decisions": [
                {
                    "confirmation_id": decided["confirmation_id"],
                    "tool_call": decided["tool_call"],
                    "decision": "approve" if decided["state"] == "approved" else "reject",
                    "arguments": decided.get("arguments"),
                }
                for decided in decision.decided
            ],
        },
    )
    try:
        return await _run(state, owner, conversation_id, request, resuming=True)
    except ApiError:
        # The turn that was to carry the decision out did not start (a 429 at the user's
        # limits, a 409): the decision stands undone, so the user can make it again.
        await keeper.undecide(conversation_id, body.confirmation_id)
        raise


async def _run(
    state: AppState,
    owner: str,
    conversation_id: str,
    request: TurnRequest,
    *,
    resuming: bool = False,
) -> Response:
    keeper = _keeper(state, owner)

    async def claim(turn_id: str) -> str:
        await claim_conversation(keeper, state.store, conversation_id, turn_id, resuming=resuming)
        return conversation_id

    return await start_turn(state, owner, request, claim)


def _check_arguments(arguments: dict[str, Any], schema: dict[str, Any]) -> None:
    """Edited arguments must pass the tool's own schema (400 naming where they fail)."""
    try:
        jsonschema.validate(arguments, schema)
    except jsonschema.ValidationError as exc:
        where = "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in exc.absolute_path)
        raise invalid(f"arguments{where}: {exc.message}", f"arguments{where}") from None
    except jsonschema.SchemaError:
        pass  # a schema the tool got wrong: the worker checks the arguments when it runs


def _still_waiting(pending: dict[str, Any] | None, stream: bool) -> Response:
    """The answer to a decision that leaves another of its turn's calls waiting."""
    if not stream:
        body: dict[str, Any] = {
            "turn_id": None,
            "status": "awaiting_confirmation",
            "messages": [],
            "pending_confirmation": pending,
        }
        return JSONResponse(body)
    done = {"turn_id": None, "status": "awaiting_confirmation", "usage": None}
    events = [ServerSentEvent(data=orjson.dumps(pending).decode(), event="awaiting_confirmation")]
    events.append(ServerSentEvent(data=orjson.dumps(done).decode(), event="done"))
    return FrameResponse(events)
