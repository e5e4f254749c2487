"""`/v1/conversations`: create, list, read, retitle and delete conversations, post a message
to one, decide on the tool calls it waits on, and undo its last change to the house.

Owner-scoped like every route: another user's conversation, or a missing one, is the same
404. Posting a message and resuming run a turn on the stored history; the answer is JSON
(wait for the turn, then its rows) unless the client's `Accept` prefers `text/event-stream`
(api/negotiation.py), which streams the turn's named events (api/encoding.py:
`ConversationEncoder`). A conversation runs one turn at a time: a message posted while one
runs interrupts it, waits in line, or is refused (409 `conversation_busy`), as its
`multitask_strategy` says (api/conversations.py).
While tool calls wait, a message is their answer in words (api/conversations.py).
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Response
from pydantic import BaseModel, ConfigDict, Field

from api.admission import Storing, admit_storing
from api.auth import Owner, TurnOwner
from api.conversations import (
    Multitask,
    Opened,
    check_conversation_id,
    claim_conversation,
    confirmation_not_found,
    conversation_not_found,
    conversation_object,
    decision_error,
    delete_conversation,
    is_conversation_id,
    pending_of,
    public_proposal,
    resumption,
    retitle,
    status_of,
)
from api.encodings.conversation import awaiting_frame, done_frame, rows_answer
from api.errors import ApiError, invalid, not_found
from api.json_response import JSONResponse
from api.json_route import OrjsonRoute
from api.limits import check_message_chars
from api.negotiation import EVENT_STREAM, JSON, language, negotiate
from api.pages import list_page
from api.relay import fixed
from api.sse import FrameResponse
from api.state import AppState, State
from api.turn_service import conversation_machine, multitask_of, start_turn
from shared.confirmation_words import LANGUAGES
from shared.conversation_state import ConversationStatus, Outcome
from shared.errors import ErrorCode
from shared.events import Done, TurnStatus
from shared.records.conversation import ConversationExistsError
from shared.records.messages import row_position
from shared.records.undo import LOOKBACK, TooLate, find_undo
from shared.requests import AgentRequest, Delivery, MultitaskStrategy, TurnRequest
from shared.schema_checks import Invalid

router = APIRouter(route_class=OrjsonRoute)
# OpenAI's limits on `metadata`: 16 pairs, keys up to 64 characters, values up to 512.
_METADATA_PAIRS, _METADATA_KEY, _METADATA_VALUE = 16, 64, 512


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class NewConversation(_Body):
    """`POST /v1/conversations`: an id of the client's choosing (else a fresh one)."""

    id: str | None = None
    metadata: dict[str, str] | None = Field(None, max_length=_METADATA_PAIRS)


class ConversationChange(_Body):
    """`PATCH /v1/conversations/{id}`: its title (checked in api/conversations.py)."""

    title: str


class NewMessage(_Body):
    """`POST /v1/conversations/{id}/messages`: the new message only; the rest is stored."""

    content: str = Field(min_length=1)
    metadata: dict[str, str] | None = Field(None, max_length=_METADATA_PAIRS)
    # Stream the prompts sent to each model, each call's latency and usage (`trace` events).
    trace: bool = False
    # What the message does while a turn runs on the conversation (None:
    # BERNARD_MULTITASK_STRATEGY; shared/conversation_state.py `Strategy`).
    multitask_strategy: MultitaskStrategy | None = None


class UndoRequest(_Body):
    """`POST /v1/conversations/{id}/undo`: nothing but whether to trace the turn."""

    trace: bool = False


# The user's words an undo turn stores: the history reads as the user asked it.
UNDO_WORDS = "Undo that."


class ResumeRequest(_Body):
    """`POST /v1/conversations/{id}/resume`: the user's decision on one proposal."""

    confirmation_id: str = Field(min_length=1, max_length=256)
    decision: Literal["approve", "reject"]
    arguments: dict[str, Any] | None = None
    trace: bool = False  # as `NewMessage.trace`, for the turn the decision starts


def _wants_stream(accept: str | None) -> bool:
    return negotiate(accept, (JSON, EVENT_STREAM)) == EVENT_STREAM


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
    conversation = await state.keeper(owner).get_conversation(conversation_id)
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
    await admit_storing(state, owner, Storing(body.id))
    keeper = state.keeper(owner)
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
    return JSONResponse(
        conversation_object(conversation, ConversationStatus.IDLE, []), status_code=201
    )


@router.get("/conversations")
async def list_conversations(
    owner: Owner,
    state: State,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: Annotated[str | None, Query(max_length=256)] = None,
) -> dict[str, Any]:
    """The owner's conversations, last used first; page with `after` (an id)."""
    keeper = state.keeper(owner)
    found, more = await keeper.list_conversations(after=after, limit=limit)
    data = []
    for conversation in found:
        status, pending = await status_of(keeper, state.store, conversation)
        data.append(conversation_object(conversation, status, pending))
    return list_page(data, more)


@router.get("/conversations/{conversation_id}")
async def get_conversation(conversation_id: str, owner: Owner, state: State) -> dict[str, Any]:
    conversation = await _owned(state, owner, conversation_id)
    status, pending = await status_of(state.keeper(owner), state.store, conversation)
    return conversation_object(conversation, status, pending)


@router.patch("/conversations/{conversation_id}")
async def change(
    conversation_id: str, owner: Owner, state: State, body: ConversationChange
) -> dict[str, Any]:
    """Set the conversation's title (the user's: the generated one never replaces it)."""
    keeper = state.keeper(owner)
    await retitle(keeper, conversation_id, body.title)
    conversation = await _owned(state, owner, conversation_id)
    status, pending = await status_of(keeper, state.store, conversation)
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
    rows, more = await state.keeper(owner).rows(conversation_id, after=after, limit=limit)
    return list_page(rows, more)


@router.delete("/conversations/{conversation_id}")
async def delete(conversation_id: str, owner: Owner, state: State) -> dict[str, Any]:
    """Remove the conversation's metadata, messages, call records and proposals, and every
    turn that ran on it, at once (the answer is OpenAI's deletion object)."""
    await delete_conversation(
        state.redis,
        state.store,
        owner,
        conversation_id,
        retention_s=state.settings.conversation_retention_s,
        queue=state.queue,
    )
    return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}


@router.post("/conversations/{conversation_id}/messages")
async def post_message(
    conversation_id: str,
    owner: TurnOwner,
    state: State,
    body: NewMessage,
    accept: Annotated[str | None, Header()] = None,
    accept_language: Annotated[str | None, Header()] = None,
) -> Response:
    """Run a turn on the stored history plus this message (while a turn runs: as its
    `multitask_strategy` says, api/conversations.py; while tool calls wait, it answers them:
    `answer_in_words`); JSON or named SSE events by `Accept`."""
    await _owned(state, owner, conversation_id)
    check_message_chars(len(body.content), state.settings, "content", "a message")
    _check_metadata(body.metadata)
    stream = _wants_stream(accept)
    request = TurnRequest(
        AgentRequest(
            [{"role": "user", "content": body.content}],
            trace=body.trace,
            resends_history=False,
            language=language(accept_language, LANGUAGES),
        ),
        Delivery("conversation", stream=stream, on_disconnect="continue"),
    )
    # The stored row holds at least the text's bytes: a message over the cap is refused
    # before its turn (api/admission.py).
    adds = len(body.content.encode())
    multitask = multitask_of(state, body.multitask_strategy)
    return await _run(state, owner, conversation_id, request, multitask, adds=adds)


@router.post("/conversations/{conversation_id}/resume")
async def resume(
    conversation_id: str,
    owner: TurnOwner,
    state: State,
    body: ResumeRequest,
    accept: Annotated[str | None, Header()] = None,
    accept_language: Annotated[str | None, Header()] = None,
) -> Response:
    """Decide one waiting tool call. Once every call its turn proposed is decided, the
    conversation goes on as a new turn: what was approved runs, the model hears what was
    declined, and answers. 409 for a second decision or one after the proposal expired.

    The decision that completes its step and the claim of the conversation for the turn
    that carries it out are one transition (shared/conversation_state.py, `DECIDE`): the
    turn is admitted first (a 429 decides nothing), and a message arriving meanwhile finds
    the conversation held. So every decision admits a turn, even one that leaves others of
    its step waiting (its admission is then given back)."""
    await _owned(state, owner, conversation_id)
    keeper = state.keeper(owner)
    proposal = await keeper.proposal(conversation_id, body.confirmation_id)
    if proposal is None:
        raise confirmation_not_found(body.confirmation_id)
    if body.decision == "approve" and body.arguments is not None:
        await _check_arguments(state, body.arguments, proposal.get("parameters") or {})
    stream = _wants_stream(accept)
    transitions = conversation_machine(state, owner)
    # The turn's record is built with this request; the claim below fills in what it
    # resumes before the record is stored.
    request = TurnRequest(
        AgentRequest(
            [],
            trace=body.trace,
            resends_history=False,
            language=language(accept_language, LANGUAGES),
        ),
        Delivery("conversation", stream=stream, on_disconnect="continue"),
    )

    async def decide(turn_id: str) -> str:
        decision = await transitions.decide(
            conversation_id,
            body.confirmation_id,
            body.decision,
            turn_id=turn_id,
            arguments=body.arguments if body.decision == "approve" else None,
        )
        if decision.outcome is Outcome.DECIDED:
            raise _StillWaiting
        if decision.outcome is not Outcome.RESUMED:
            raise decision_error(decision, conversation_id, body.confirmation_id)
        request.agent.resume = resumption(proposal, decision.decided)
        return conversation_id

    try:
        storing = Storing(conversation_id)
        return await start_turn(state, owner, request, decide, storing)
    except _StillWaiting:
        # Another call of the same step still waits: nothing runs until all are decided.
        left = pending_of(await keeper.proposals(conversation_id))
        return _still_waiting(public_proposal(left[0]) if left else None, stream)


@router.post("/conversations/{conversation_id}/undo")
async def undo(
    conversation_id: str,
    owner: TurnOwner,
    state: State,
    body: UndoRequest | None = None,
    accept: Annotated[str | None, Header()] = None,
) -> Response:
    """Put back the entity of the conversation's last change to the house, as saying "undo
    that" does: a turn that calls the `undo` tool through the household's policy (it may
    ask, or be refused). 404 `nothing_to_undo`, 409 `undo_expired` past
    `BERNARD_UNDO_WINDOW_S` (shared/records/undo.py), before any turn starts."""
    await _owned(state, owner, conversation_id)
    records = await state.keeper(owner).latest_calls(conversation_id, LOOKBACK)
    window = state.settings.undo_window_s
    found = find_undo(records, now=time.time(), window_s=window)
    if found is None:
        raise not_found(
            f"conversation '{conversation_id}' made no change to the house that can be undone",
            code=ErrorCode.NOTHING_TO_UNDO,
        )
    if isinstance(found, TooLate):
        raise ApiError(
            409,
            f"the last change to the house was made {time.time() - found.at:.0f} s ago; a "
            f"change can be undone for {window:g} s (BERNARD_UNDO_WINDOW_S)",
            code=ErrorCode.UNDO_EXPIRED,
        )
    request = TurnRequest(
        AgentRequest(
            [{"role": "user", "content": UNDO_WORDS}],
            trace=(body or UndoRequest()).trace,
            resends_history=False,
            undo=True,
        ),
        Delivery("conversation", stream=_wants_stream(accept), on_disconnect="continue"),
    )
    # While a turn runs, as a message saying it would (the deployment's strategy).
    multitask = multitask_of(state, None)
    return await _run(state, owner, conversation_id, request, multitask, adds=len(UNDO_WORDS))


class _StillWaiting(Exception):
    """The decision left another call of its step waiting: no turn starts."""


async def _run(
    state: AppState,
    owner: str,
    conversation_id: str,
    request: TurnRequest,
    multitask: Multitask,
    *,
    adds: int = 0,
) -> Response:
    keeper, transitions = state.keeper(owner), conversation_machine(state, owner)

    async def claim(turn_id: str) -> Opened:
        return await claim_conversation(
            keeper, transitions, state.store, conversation_id, turn_id, multitask, request.agent
        )

    storing = Storing(conversation_id, adds=adds)
    return await start_turn(state, owner, request, claim, storing)


async def _check_arguments(state: AppState, arguments: dict[str, Any], schema: Any) -> None:
    """Edited arguments must pass the tool's own schema (400 naming where they fail, or why
    they could not be checked: the schema is anyone's, and checked off the loop)."""
    problem = await state.schema_checks.arguments(schema, arguments)
    if isinstance(problem, Invalid):
        raise invalid(f"{problem.where}: {problem.message}", problem.where)
    if problem is not None:
        raise invalid(
            f"the arguments could not be checked against the tool's schema ({problem.reason})",
            "arguments",
        )


def _still_waiting(pending: dict[str, Any] | None, stream: bool) -> Response:
    """The answer to a decision that leaves another of its turn's calls waiting: as a turn
    that paused on `pending` answers (api/encodings/conversation.py), with no turn."""
    done = Done(status=TurnStatus.AWAITING_CONFIRMATION)
    if not stream:
        return JSONResponse(rows_answer(None, done, [], pending))
    return FrameResponse(fixed([awaiting_frame(pending), done_frame(None, done)]))
