"""`/v1/responses`: OpenAI's Responses API on Bernard's turns (a response is a turn; its
encoding is api/encodings/responses.py, its body api/responses_schema.py, what the API
knows of responses api/responses_domain.py).

- `POST /v1/responses` runs a turn: answered as one Response, streamed as OpenAI's events
  (`stream`), or, `background`, answered at once with the queued Response (then polled or
  streamed by id).
- `GET /v1/responses/{id}`: the Response as it stands; with `stream=true`, its events from
  the start or strictly after `starting_after` (a `sequence_number`), on any API process,
  during the turn and after it ended.
- `POST /v1/responses/{id}/cancel` stops the turn (and its upstream call) as
  `POST /v1/turns/{id}/cancel` does; `DELETE /v1/responses/{id}` forgets it.
- `GET /v1/responses/{id}/input_items`: the items the response added to its conversation
  as its input (messages, and the client's `function_call` / `function_call_output`).

Every response lives in one of its owner's conversations (api/conversations.py): a new one,
the one `conversation` names, or the one `previous_response_id`'s response is in, which it
must be the latest response of (409 otherwise: Bernard does not fork a conversation). A
response of another user is a 404, as a turn is. A response with `store: false` lives in
none: it runs on the history its request holds (after its `previous_response_id`'s, which
the worker reads from that conversation), and once delivered it is forgotten; by id it is
a 404, as OpenAI's.
"""

from __future__ import annotations

import contextlib
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Response

from api.admission import Storing
from api.auth import Owner, TurnOwner
from api.client_tools import check_no_clash, check_schemas
from api.conversations import Opened, check_conversation_id
from api.encodings.responses import ResponsesEncoder
from api.errors import ApiError, invalid, not_found
from api.json_response import JSONResponse
from api.json_route import OrjsonRoute
from api.negotiation import language
from api.pages import list_page
from api.relay import fixed
from api.replays import Replayed, replay
from api.responses_domain import (
    approval_ids,
    check_latest,
    decided_approvals,
    input_items_of,
    owned_response,
    polled,
    turn_request_of,
    unstored_history,
)
from api.responses_schema import ResponsesRequest, chat_messages
from api.sse import FrameResponse
from api.state import AppState, State
from api.turn_service import (
    attach,
    check_model,
    conversation_machine,
    multitask_of,
    open_turn_conversation,
    start_turn,
    stopped,
    stream_response,
)
from shared.client_tools import tool_names
from shared.confirmation_words import LANGUAGES
from shared.connection import REDIS_ERRORS
from shared.errors import ErrorCode
from shared.turn_record import TurnRecord

router = APIRouter(route_class=OrjsonRoute)


@router.post("/responses")
async def create_response(
    owner: TurnOwner,
    state: State,
    body: ResponsesRequest,
    accept_language: Annotated[str | None, Header()] = None,
) -> Response:
    """Run one turn as a Response: JSON, OpenAI's event stream, or queued (`background`).
    A message continuing a response that waits on approvals answers them in words
    (api/conversations.py `answer_in_words`)."""
    check_model(body.model)
    body.check_limits(state.settings)
    items = body.items()
    approvals = [item for item in items if item.get("type") == "mcp_approval_response"]
    if approvals:
        if not body.store:
            raise invalid(
                "an approval continues its stored response's conversation: send store: true",
                "store",
            )
        return await _decide(state, owner, body, approvals)
    client_tools = body.client_tools()
    await check_no_clash(state.queue, tool_names(client_tools), "tools[{i}].name")
    await check_schemas(state.schema_checks, client_tools, "tools[{i}].parameters")
    previous: TurnRecord | None = None
    if body.previous_response_id is not None:
        previous = await owned_response(state, body.previous_response_id, owner)
    # A follow-up of function_call_output items alone answers calls the previous response
    # handed over, which its turn stored (worker/recording.py): they come before.
    messages = chat_messages(items)
    # Instructions go into the conversation as a system message, once: a client that sends
    # the same ones with every response of a chain (as the SDKs' agents do) adds none again.
    repeated = previous is not None and (
        previous.request.delivery.echo.get("instructions") == body.instructions
    )
    if body.instructions and not repeated:
        messages.insert(0, {"role": "system", "content": body.instructions})
    if not body.store:
        request = turn_request_of(body, messages, client_tools)
        if previous is not None:
            # The turn runs on its previous response's history, read by the worker from
            # that conversation (never copied into the request), and writes to none:
            # nothing of it is stored (api/admission.py: `None`).
            request.agent.history_of = await unstored_history(state, owner, previous)
        return await start_turn(state, owner, request)
    request = turn_request_of(body, messages, client_tools)
    request.agent.language = language(accept_language, LANGUAGES)
    requested = body.conversation_id
    if requested is not None:
        check_conversation_id(requested, "conversation")
    if previous is not None:
        requested = previous.conversation_id
    multitask = multitask_of(state, body.multitask_strategy)

    async def conversation(turn_id: str) -> Opened:
        if previous is not None:
            await check_latest(state, owner, previous)
        opened = await open_turn_conversation(
            state, owner, requested, turn_id, multitask=multitask, answering=request.agent
        )
        # A "yes" approved calls: their items name the approval they ran by.
        approvals = approval_ids((request.agent.resume or {}).get("decisions", []))
        if approvals:
            request.delivery.echo["approvals"] = approvals
        return opened

    return await start_turn(
        state,
        owner,
        request,
        conversation,
        Storing(requested),
        accepted=lambda record: JSONResponse(polled(record)),
    )


async def _decide(
    state: AppState, owner: str, body: ResponsesRequest, approvals: list[dict[str, Any]]
) -> Response:
    """Decide the calls a paused response proposed: the response continues its previous
    response's conversation as a new turn that runs what was approved and tells the model
    what was declined (api/responses_domain.py `decided_approvals`)."""
    decided = await decided_approvals(state, owner, body, approvals)
    request = turn_request_of(body, [], body.client_tools())
    transitions = conversation_machine(state, owner)

    async def decide(turn_id: str) -> str:
        return await decided.resume(transitions, request, turn_id)

    return await start_turn(
        state,
        owner,
        request,
        decide,
        Storing(decided.conversation_id),
        accepted=lambda record: JSONResponse(polled(record)),
    )


@router.get("/responses/{response_id}")
async def get_response(
    response_id: str,
    owner: Owner,
    state: State,
    stream: bool = False,
    starting_after: Annotated[int | None, Query(ge=0)] = None,
) -> Response:
    """The Response; with `stream=true`, its events strictly after `starting_after`.

    The numbering is the encoder's count from the turn's first event, so the stream is
    replayed from its start (api/replays.py: a chunk at a time, a few replays at once, each
    holding one of its user's streams first), and one that no longer holds that event
    cannot number what it still holds: one whose retention is over, or that
    `BERNARD_STREAM_MAXLEN` trimmed. Its finished response is then replayed whole
    from its record, which numbers its own events (each output item added and done, no
    deltas or tool events), and a resume after an event is refused (409
    `resume_unavailable`): the events after N are exactly the live stream's, or none."""
    record = await owned_response(state, response_id, owner)
    if not stream:
        return JSONResponse(polled(record))
    after = -1 if starting_after is None else starting_after
    encoder = ResponsesEncoder(record, starting_after=after)
    # The stream the user opens counts before any of the replay's work is done.
    attachment = await attach(state, record)
    try:
        async with state.replays.slot(owner):
            found = await replay(state.redis, record.id, encoder)
        if found.outcome is Replayed.WHOLE:
            return stream_response(state, record, attachment, found.resume, encoder)
        if starting_after is None and record.finished:
            answer = FrameResponse(fixed(encoder.compacted(record)))
        elif found.outcome is Replayed.EMPTY and not record.finished:
            raise not_found(f"response '{response_id}' has no events")
        else:
            expired = found.outcome is Replayed.EMPTY
            raise _not_resumable(response_id, record, starting_after, expired=expired)
    except BaseException:
        await _close_quietly(state, record.owner, attachment)
        raise
    await _close_quietly(state, record.owner, attachment)
    return answer


async def _close_quietly(state: AppState, owner: str, attachment: str) -> None:
    with contextlib.suppress(*REDIS_ERRORS):
        await state.streams.close(owner, attachment, cancel_when_alone=False)


def _not_resumable(
    response_id: str, record: TurnRecord, starting_after: int | None, *, expired: bool
) -> ApiError:
    """The 409 of a stream that can no longer number its events as it did."""
    lost = (
        "its stream's retention is over"
        if expired
        else "BERNARD_STREAM_MAXLEN trimmed its stream's first events"
    )
    then = (
        f"GET /v1/responses/{response_id} gives the response as it ended, and a stream "
        "without starting_after replays it"
        if record.finished
        else f"poll GET /v1/responses/{response_id} until it ends"
    )
    return ApiError(
        409,
        f"the events of response '{response_id}' can no longer be streamed with the numbers "
        f"they had: {lost}; {then}",
        param="starting_after" if starting_after is not None else "stream",
        code=ErrorCode.RESUME_UNAVAILABLE,
    )


@router.post("/responses/{response_id}/cancel")
async def cancel_response(response_id: str, owner: Owner, state: State) -> dict[str, Any]:
    """Stop the response's turn from any API process (its upstream call is closed); the
    Response once it has ended. A finished response is answered as it is."""
    record = await stopped(state, await owned_response(state, response_id, owner))
    return polled(record)


@router.delete("/responses/{response_id}")
async def delete_response(response_id: str, owner: Owner, state: State) -> dict[str, Any]:
    """Forget the response (a running one is cancelled first): no route finds it again.
    The messages it added stay in its conversation (`DELETE /v1/conversations/{id}`
    removes them)."""
    record = await stopped(state, await owned_response(state, response_id, owner))
    await state.store.forget(owner, [record.id])
    return {"id": response_id, "object": "response", "deleted": True}


@router.get("/responses/{response_id}/input_items")
async def input_items(
    response_id: str,
    owner: Owner,
    state: State,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
    after: Annotated[str | None, Query(max_length=64)] = None,
) -> dict[str, Any]:
    """The items the response added to its conversation as its input (the client's, as
    stored: instructions included, and the `function_call` / `function_call_output` items
    it sent), newest first unless `order=asc` (as OpenAI lists them), a page of `limit`
    from just after the item `after` (the SDK's pages ask for the next one so)."""
    record = await owned_response(state, response_id, owner)
    data = await input_items_of(state, record)
    if order == "desc":
        data.reverse()
    if after is not None:
        ids = [item["id"] for item in data]
        if after not in ids:
            raise invalid(f"response '{response_id}' has no input item '{after}'", "after")
        data = data[ids.index(after) + 1 :]
    return list_page(data[:limit], len(data) > limit)
