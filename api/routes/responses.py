"""`/v1/responses`: OpenAI's Responses API on Bernard's turns (a response is a turn; its
encoding is api/encodings/responses.py, its body api/responses_schema.py).

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

from fastapi import APIRouter, Depends, Header, Query, Response

from api.admission import Storing
from api.auth import Owner, TurnOwner
from api.client_tools import check_no_clash, check_schemas
from api.conversations import (
    Opened,
    check_conversation_id,
    conversation_not_found,
    decision_error,
    open_conversation,
    pending_of,
    resumption,
)
from api.encodings.responses import (
    ResponsesEncoder,
    response_id,
    response_object,
    response_status,
    turn_id_of,
)
from api.errors import ApiError, invalid
from api.json_route import OrjsonRoute
from api.negotiation import language
from api.pages import list_page
from api.relay import fixed
from api.replays import Replayed, replay
from api.responses import JSONResponse
from api.responses_schema import ResponsesRequest, chat_messages
from api.session import StreamSession
from api.sse import FrameResponse
from api.state import AppState, get_state
from api.turn_service import (
    UNFINISHED_TTL_S,
    attach,
    check_model,
    conversation_machine,
    multitask_of,
    start_turn,
    stream_response,
)
from shared.cancel import request_cancel
from shared.client_tools import tool_names
from shared.confirmation_words import LANGUAGES
from shared.connection import REDIS_ERRORS
from shared.conversation_state import Decision, Outcome
from shared.errors import ErrorCode
from shared.events import TurnStatus
from shared.lifecycle import Cause
from shared.records.keeper import RecordKeeper
from shared.records.messages import row_position
from shared.requests import AgentRequest, Delivery, TurnRequest
from shared.results import TurnResult
from shared.turn_record import TurnRecord

router = APIRouter(route_class=OrjsonRoute)
State = Annotated[AppState, Depends(get_state)]
# As `POST /v1/turns/{id}/cancel` waits (api/routes/turns.py).
CANCEL_WAIT_S = 5.0
# Rows read at a time looking for a response's last one, from its conversation's end.
_HISTORY_PAGE = 100


def response_not_found(response_id: str) -> ApiError:
    return ApiError(
        404,
        f"no response with id '{response_id}'",
        param="response_id",
        code=ErrorCode.NOT_FOUND,
    )


async def _owned(state: AppState, response_id: str, owner: str) -> TurnRecord:
    """The owner's response of that id, made by this API: else 404."""
    turn_id = turn_id_of(response_id)
    record = await state.store.get(turn_id) if turn_id else None
    # One with `store: false` is no more to be found, even while it runs (`found_by`).
    if record is None or not record.found_by(owner):
        raise response_not_found(response_id)
    if record.request.delivery.encoding != "responses":
        raise response_not_found(response_id)
    return record


def polled(record: TurnRecord) -> dict[str, Any]:
    """The Response as it stands: finished, from its stored result; else queued or in
    progress, with no output yet."""
    encoder = ResponsesEncoder(record)
    if record.finished:
        return encoder.body(record.result or TurnResult())
    return response_object(record, response_status(record.status, None), [])


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
        previous = await _owned(state, body.previous_response_id, owner)
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
        request = _turn_request(body, messages, client_tools)
        if previous is not None:
            # The turn runs on its previous response's history, read by the worker from
            # that conversation (never copied into the request), and writes to none:
            # nothing of it is stored (api/admission.py: `None`).
            request.agent.history_of = await _history_of(state, owner, previous)
        return await start_turn(state, owner, request)
    request = _turn_request(body, messages, client_tools)
    request.agent.language = language(accept_language, LANGUAGES)
    requested = body.conversation_id
    if requested is not None:
        check_conversation_id(requested, "conversation")
    if previous is not None:
        requested = previous.conversation_id
    retention_s = state.settings.conversation_retention_s
    turn_keep_s = UNFINISHED_TTL_S + state.settings.turn_retention_s

    multitask = multitask_of(state, body.multitask_strategy)

    async def conversation(turn_id: str) -> Opened:
        if previous is not None:
            await _check_latest(state, owner, previous)
        opened = await open_conversation(
            state.redis,
            state.store,
            owner,
            requested,
            turn_id,
            retention_s=retention_s,
            turn_keep_s=turn_keep_s,
            multitask=multitask,
            answering=request.agent,
        )
        # A "yes" approved calls: their items name the approval they ran by.
        approvals = _approvals((request.agent.resume or {}).get("decisions", []))
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


def _turn_request(
    body: ResponsesRequest,
    messages: list[dict[str, Any]],
    client_tools: list[dict[str, Any]] | None = None,
) -> TurnRequest:
    """The turn a create runs: the messages (only the new ones: with
    `previous_response_id` or `conversation` the rest is the conversation's, and
    worker/recording.py stores all of them) and the body's options."""
    echo: dict[str, Any] = {
        "instructions": body.instructions,
        "metadata": body.metadata,
        "previous_response_id": body.previous_response_id,
        "tools": body.tools,
        "tool_choice": body.tool_choice,
        "truncation": body.truncation,
        "background": body.background,
    }
    return TurnRequest(
        AgentRequest(
            messages,
            resends_history=False,
            max_tokens=body.max_output_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            user=body.user,
            client_tools=client_tools or [],
            tool_choice=body.chat_tool_choice(),
            parallel_tool_calls=body.parallel_tool_calls,
        ),
        Delivery(
            "responses",
            stream=body.stream,
            # A background response that is also streamed is streamed from the start (as
            # OpenAI's is); its client may leave and come back (`on_disconnect` continue),
            # and its end is POSTed to the webhook either way.
            background=body.background,
            on_disconnect="cancel" if body.stream and not body.background else "continue",
            webhook_url=body.webhook_url,
            echo={k: v for k, v in echo.items() if v is not None},
            kept=body.store,
        ),
    )


async def _history_of(state: AppState, owner: str, previous: TurnRecord) -> dict[str, Any]:
    """What an unstored response (`store: false`) continuing `previous` runs on before its
    own input (`AgentRequest.history_of`): its conversation's messages up to the end of
    `previous` (later ones are left out: the new response writes nothing, so it may
    continue any response of the conversation, as OpenAI's may). 409 while `previous`
    runs, 400 while it waits on approvals (only a stored response can answer them), 404
    once its conversation is gone.

    `previous`'s last row is looked for from the conversation's end, a page at a time: a
    response continued is most often its conversation's latest, whose rows end it."""
    name = response_id(previous.id)
    if not previous.finished:
        raise ApiError(
            409,
            f"response '{name}' has not ended yet: continue it once it has",
            param="previous_response_id",
            code=ErrorCode.CONVERSATION_BUSY,
        )
    if previous.status == TurnStatus.AWAITING_CONFIRMATION:
        raise invalid(
            f"response '{name}' waits on approval requests: answer them with store: true",
            "store",
        )
    conversation_id = previous.conversation_id or ""
    keeper = RecordKeeper(state.redis, owner, retention_s=state.settings.conversation_retention_s)
    before = await keeper.length(conversation_id) + 1
    while before > 1:
        rows = await keeper.older(conversation_id, before, _HISTORY_PAGE)
        for row in reversed(rows):
            if row.get("turn_id") == previous.id:
                return {"conversation_id": conversation_id, "through": row_position(row["id"])}
        before -= max(len(rows), 1)
    raise conversation_not_found(conversation_id)


async def _check_latest(state: AppState, owner: str, previous: TurnRecord) -> None:
    """A response continues its previous response's conversation only from its latest
    response (409 otherwise); 404 once that conversation is gone."""
    conversation_id = previous.conversation_id or ""
    keeper = RecordKeeper(state.redis, owner, retention_s=state.settings.conversation_retention_s)
    found = await keeper.get_conversation(conversation_id)
    if found is None:
        raise conversation_not_found(conversation_id)
    # The latest: the last in line behind the running one, if messages wait in line.
    last = found.waiting[-1] if found.waiting else found.active_turn
    if last != previous.id:
        latest = response_id(last) if last else "none"
        raise ApiError(
            409,
            f"response '{response_id(previous.id)}' is not the latest of its conversation "
            f"'{conversation_id}' (that is '{latest}'): continue from the latest response; "
            "Bernard does not fork a conversation",
            param="previous_response_id",
            code=ErrorCode.CONVERSATION_BUSY,
        )


async def _decide(
    state: AppState, owner: str, body: ResponsesRequest, approvals: list[dict[str, Any]]
) -> Response:
    """Decide the calls a paused response proposed (its `mcp_approval_request` items), as
    `POST /v1/conversations/{id}/resume` does one by one: the response continues its
    previous response's conversation as a new turn that runs what was approved and tells
    the model what was declined. Every call the paused response waits on must be decided
    at once, and nothing else may come with the decisions (400 naming what)."""
    if body.previous_response_id is None:
        raise invalid(
            "mcp_approval_response items need previous_response_id", "previous_response_id"
        )
    if len(approvals) != len(body.items()):
        raise invalid("an input of mcp_approval_response items may hold nothing else", "input")
    previous = await _owned(state, body.previous_response_id, owner)
    conversation_id = previous.conversation_id or ""
    keeper = RecordKeeper(state.redis, owner, retention_s=state.settings.conversation_retention_s)
    waiting = {
        p["confirmation_id"]: p
        for p in pending_of(await keeper.proposals(conversation_id))
        if p.get("turn_id") == previous.id
    }
    decisions: list[tuple[str, bool]] = []
    for i, item in enumerate(approvals):
        request_id, approve = item.get("approval_request_id"), item.get("approve")
        if not isinstance(request_id, str) or request_id not in waiting:
            raise ApiError(
                404,
                f"response '{body.previous_response_id}' waits on no approval request "
                f"'{request_id}'",
                param=f"input[{i}].approval_request_id",
                code=ErrorCode.CONFIRMATION_NOT_FOUND,
            )
        if not isinstance(approve, bool):
            raise invalid("approve must be true or false", f"input[{i}].approve")
        unknown = sorted(set(item) - {"type", "id", "approval_request_id", "approve", "reason"})
        if unknown:
            raise invalid(f"unknown field {unknown[0]!r}", f"input[{i}]")
        decisions.append((request_id, approve))
    undecided = sorted(set(waiting) - {request_id for request_id, _ in decisions})
    if undecided:
        raise invalid(
            f"decide every call the response waits on: '{undecided[0]}' is not decided",
            "input",
        )
    request = _turn_request(body, [], body.client_tools())
    transitions = conversation_machine(state, owner)

    async def decide(turn_id: str) -> str:
        for request_id, approve in decisions:
            decision = await transitions.decide(
                conversation_id,
                request_id,
                "approve" if approve else "reject",
                turn_id=turn_id,
            )
            if decision.outcome is Outcome.RESUMED:
                request.agent.resume = resumption(waiting[request_id], decision.decided)
                # The approved calls' items name the approval they ran by.
                request.delivery.echo["approvals"] = _approvals(request.agent.resume["decisions"])
                return conversation_id
            if decision.outcome is not Outcome.DECIDED:
                raise decision_error(decision, conversation_id, request_id)
        # Each call was decided, yet the step still waits: one it proposed lapsed meanwhile.
        raise decision_error(Decision(Outcome.EXPIRED), conversation_id, decisions[-1][0])

    return await start_turn(
        state,
        owner,
        request,
        decide,
        Storing(conversation_id),
        accepted=lambda record: JSONResponse(polled(record)),
    )


def _approvals(decisions: list[dict[str, Any]]) -> dict[str, str]:
    """Each approved call's id → the approval request it was approved by."""
    return {
        one["tool_call"]["id"]: one["confirmation_id"]
        for one in decisions
        if one["decision"] == "approve"
    }


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
    record = await _owned(state, response_id, owner)
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
            raise ApiError(404, f"response '{response_id}' has no events", code=ErrorCode.NOT_FOUND)
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
    record = await _stopped(state, await _owned(state, response_id, owner))
    return polled(record)


async def _stopped(state: AppState, record: TurnRecord) -> TurnRecord:
    """The record once its turn has ended, cancelled if it had not (as
    `POST /v1/turns/{id}/cancel` does: api/routes/turns.py)."""
    if record.finished:
        return record
    await request_cancel(
        state.redis, record.id, ttl_s=state.settings.turn_retention_s, queue=state.queue
    )
    if record.status == TurnStatus.QUEUED:
        # No worker has it yet, and there may be none: end it here.
        await state.store.end(record.id, record.owner, Cause.CANCELLED_QUEUED)
    await StreamSession(state.hub, record.id, CANCEL_WAIT_S).wait_for_done()
    return await state.store.get(record.id) or record


@router.delete("/responses/{response_id}")
async def delete_response(response_id: str, owner: Owner, state: State) -> dict[str, Any]:
    """Forget the response (a running one is cancelled first): no route finds it again.
    The messages it added stay in its conversation (`DELETE /v1/conversations/{id}`
    removes them)."""
    record = await _stopped(state, await _owned(state, response_id, owner))
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
    record = await _owned(state, response_id, owner)
    keeper = RecordKeeper(state.redis, owner, retention_s=state.settings.conversation_retention_s)
    turn_rows: list[dict[str, Any]] = []
    cursor: str | None = None
    more, seen = True, False
    while more and record.conversation_id:
        rows, more = await keeper.rows(record.conversation_id, after=cursor, limit=100)
        for row in rows:
            if row.get("turn_id") != record.id:
                # A turn's rows are together (one turn at a time writes to a
                # conversation): past them, there are no more.
                more = more and not seen
                continue
            seen = True
            turn_rows.append(row)
        cursor = rows[-1]["id"] if rows else None
        more = more and cursor is not None
    data = [item for row in _input_rows(turn_rows, record) for item in _input_items(row)]
    if order == "desc":
        data.reverse()
    if after is not None:
        ids = [item["id"] for item in data]
        if after not in ids:
            raise invalid(f"response '{response_id}' has no input item '{after}'", "after")
        data = data[ids.index(after) + 1 :]
    return list_page(data[:limit], len(data) > limit)


def _input_rows(rows: list[dict[str, Any]], record: TurnRecord) -> list[dict[str, Any]]:
    """Of the turn's rows, those of its input: all but its output's. An output row is a
    tool call the turn made (Bernard's, the client's it handed over, one waiting for
    approval) or its result, or the answer, the last row. The input comes first (the turn
    stores it as it begins, its output as it ends: worker/recording.py), but for a message
    that answered approval requests in words, which follows the results of the calls it
    decided (worker/harness/answers.py)."""
    result = record.result or TurnResult()
    made = {call.get("id") for call in [*result.tool_calls, *result.client_calls]}
    made |= {pending.get("tool_call", {}).get("id") for pending in result.pending}
    made.discard(None)
    answered = record.finished and record.result is not None and bool(result.content)
    ends_answered = answered and rows and rows[-1].get("role") == "assistant"
    last = len(rows) - 1 if ends_answered and not rows[-1].get("tool_calls") else len(rows)

    def output(i: int, row: dict[str, Any]) -> bool:
        called = {call.get("id") for call in row.get("tool_calls") or ()}
        return i == last or bool(called & made) or row.get("tool_call_id") in made

    first = next((i for i, row in enumerate(rows) if output(i, row)), len(rows))
    # Past the first output, only the client's own messages are input.
    return [
        row
        for i, row in enumerate(rows)
        if i < first or (row.get("role") in ("user", "system", "developer") and i != last)
    ]


def _input_items(row: dict[str, Any]) -> list[dict[str, Any]]:
    """A stored input row as OpenAI lists input items: a message, each of an assistant
    row's `function_call`s, or a `function_call_output`."""
    role, content = row.get("role"), row.get("content")
    if role == "tool":
        return [
            {
                "id": row["id"],
                "type": "function_call_output",
                "call_id": row.get("tool_call_id"),
                "output": content if isinstance(content, str) else "",
                "status": "completed",
            }
        ]
    if role == "assistant" and row.get("tool_calls"):
        return [
            {
                # One row may hold parallel calls: each item's id is its own.
                "id": f"fc_{row['id']}_{k}",
                "type": "function_call",
                "call_id": call.get("id"),
                "name": call.get("function", {}).get("name"),
                "arguments": call.get("function", {}).get("arguments") or "",
                "status": "completed",
            }
            for k, call in enumerate(row["tool_calls"])
        ]
    text = content if isinstance(content, str) else ""
    if role == "assistant":
        return [
            {
                "id": row["id"],
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ]
    return [
        {
            "id": row["id"],
            "type": "message",
            "role": role,
            "status": "completed",
            "content": [{"type": "input_text", "text": text}],
        }
    ]
