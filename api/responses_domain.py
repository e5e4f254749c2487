"""Responses as the API sees them: a response is a turn (`resp_<turn id>`) in one of its
owner's conversations. Which response a request names (`owned_response`), the turn a
create runs (`turn_request_of`), what a response continuing another runs on
(`unstored_history`, `check_latest`), the approvals a paused response waits on
(`decided_approvals`), and the items it added as its input
(`input_items_of`). The routes are api/routes/responses.py's, as api/routes/conversations.py's
are api/conversations.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from api.conversations import conversation_not_found, decision_error, pending_of, resumption
from api.encodings.responses import (
    ResponsesEncoder,
    response_id,
    response_object,
    response_status,
    turn_id_of,
)
from api.errors import ApiError, invalid, not_found
from api.responses_schema import ResponsesRequest
from api.state import AppState
from shared.conversation_state import ConversationMachine, Decision, Outcome
from shared.errors import ErrorCode
from shared.events import TurnStatus
from shared.records.messages import row_position
from shared.requests import AgentRequest, Delivery, TurnRequest
from shared.results import TurnResult
from shared.turn_record import TurnRecord

# Rows read at a time looking for a response's last one, from its conversation's end.
_HISTORY_PAGE = 100


def response_not_found(response_id: str) -> ApiError:
    return not_found(f"no response with id '{response_id}'", "response_id")


async def owned_response(state: AppState, response_id: str, owner: str) -> TurnRecord:
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


def turn_request_of(
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
            kept=body.store,
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
        ),
    )


async def unstored_history(state: AppState, owner: str, previous: TurnRecord) -> dict[str, Any]:
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
    keeper = state.keeper(owner)
    before = await keeper.length(conversation_id) + 1
    while before > 1:
        rows = await keeper.older(conversation_id, before, _HISTORY_PAGE)
        for row in reversed(rows):
            if row.get("turn_id") == previous.id:
                return {"conversation_id": conversation_id, "through": row_position(row["id"])}
        before -= max(len(rows), 1)
    raise conversation_not_found(conversation_id)


async def check_latest(state: AppState, owner: str, previous: TurnRecord) -> None:
    """A response continues its previous response's conversation only from its latest
    response (409 otherwise); 404 once that conversation is gone."""
    conversation_id = previous.conversation_id or ""
    keeper = state.keeper(owner)
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


@dataclass(frozen=True, slots=True)
class Approvals:
    """The decisions a response's `mcp_approval_response` items make on the calls its
    previous response waits on, checked: each call decided once, nothing else sent."""

    conversation_id: str
    # The previous response's pending proposals, by confirmation id.
    waiting: dict[str, dict[str, Any]]
    # (confirmation id, approved) in the order sent.
    decisions: list[tuple[str, bool]]

    async def resume(
        self, transitions: ConversationMachine, request: TurnRequest, turn_id: str
    ) -> str:
        """Make the decisions for `turn_id`, the turn that carries them out; the
        conversation it resumes once the step's last decision has it resume, else the
        decision's error."""
        for request_id, approve in self.decisions:
            decision = await transitions.decide(
                self.conversation_id,
                request_id,
                "approve" if approve else "reject",
                turn_id=turn_id,
            )
            if decision.outcome is Outcome.RESUMED:
                request.agent.resume = resumption(self.waiting[request_id], decision.decided)
                # The approved calls' items name the approval they ran by.
                request.delivery.echo["approvals"] = approval_ids(request.agent.resume["decisions"])
                return self.conversation_id
            if decision.outcome is not Outcome.DECIDED:
                raise decision_error(decision, self.conversation_id, request_id)
        # Each call was decided, yet the step still waits: one it proposed lapsed meanwhile.
        raise decision_error(Decision(Outcome.EXPIRED), self.conversation_id, self.decisions[-1][0])


async def decided_approvals(
    state: AppState, owner: str, body: ResponsesRequest, approvals: list[dict[str, Any]]
) -> Approvals:
    """The calls a paused response proposed (its `mcp_approval_request` items) as the
    response continuing it decides them, as `POST /v1/conversations/{id}/resume` does one
    by one. Every call the paused response waits on must be decided at once, and nothing
    else may come with the decisions (400 naming what)."""
    if body.previous_response_id is None:
        raise invalid(
            "mcp_approval_response items need previous_response_id", "previous_response_id"
        )
    if len(approvals) != len(body.items()):
        raise invalid("an input of mcp_approval_response items may hold nothing else", "input")
    previous = await owned_response(state, body.previous_response_id, owner)
    conversation_id = previous.conversation_id or ""
    keeper = state.keeper(owner)
    waiting = {
        p["confirmation_id"]: p
        for p in pending_of(await keeper.proposals(conversation_id))
        if p.get("turn_id") == previous.id
    }
    decisions: list[tuple[str, bool]] = []
    for i, item in enumerate(approvals):
        request_id, approve = item.get("approval_request_id"), item.get("approve")
        if not isinstance(request_id, str) or request_id not in waiting:
            raise not_found(
                f"response '{body.previous_response_id}' waits on no approval request "
                f"'{request_id}'",
                f"input[{i}].approval_request_id",
                ErrorCode.CONFIRMATION_NOT_FOUND,
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
    return Approvals(conversation_id, waiting, decisions)


def approval_ids(decisions: list[dict[str, Any]]) -> dict[str, str]:
    """Each approved call's id → the approval request it was approved by."""
    return {
        one["tool_call"]["id"]: one["confirmation_id"]
        for one in decisions
        if one["decision"] == "approve"
    }


async def input_items_of(state: AppState, record: TurnRecord) -> list[dict[str, Any]]:
    """The items the response added to its conversation as its input, oldest first (the
    client's, as stored: instructions included, and the `function_call` /
    `function_call_output` items it sent)."""
    keeper = state.keeper(record.owner)
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
    return [item for row in _input_rows(turn_rows, record) for item in _input_items(row)]


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
