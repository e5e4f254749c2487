"""Conversations as the API sees them: which one a request continues, what state each is
in, and the transitions the API drives, with the turns they concern.

Ids are their owner's: a known id continues that conversation, an unknown one starts one
under it (a voice satellite per room), no id starts one under a fresh id; another user's
same id is another conversation. Statuses and every move between them are
shared/conversation_state.py's scripts; here the API reads what those scripts cannot (the
active turn's record, in another slot), applies a message's `Strategy` while a turn runs,
takes a user message to a waiting conversation as the answer to its question
(`answer_in_words`), and ends and forgets the turns of a deleted conversation.
"""

from __future__ import annotations

import contextlib
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from api.errors import ApiError, invalid, not_found
from shared.cancel import Stop, request_cancel
from shared.confirmation_words import Verdict, understand
from shared.connection import REDIS_ERRORS
from shared.conversation_state import (
    DEFAULT_TURN_KEEP_S,
    ConversationMachine,
    ConversationStatus,
    Decision,
    Outcome,
    Strategy,
    derive_status,
    may_run,
)
from shared.errors import ErrorCode
from shared.lifecycle import FORGET_GRACE_S, Cause
from shared.records.conversation import Conversation
from shared.records.history_diff import history_digest
from shared.records.keeper import RecordKeeper
from shared.records.messages import Message
from shared.requests import AgentRequest
from shared.titles import TitleSource, title_problem
from shared.turns import TurnStore
from shared.turns.line import InLine

# The one grammar of the ids a client chooses. Neither end is a dot, so no id is a path's
# `.` or `..` segment (which URL normalization removes: such a conversation could be made
# but never addressed), `...`, or a name that a file system or a proxy hides or trims.
_ID = re.compile(r"[A-Za-z0-9_:-](?:[A-Za-z0-9_.:-]{0,126}[A-Za-z0-9_:-])?")
ID_RULE = "1-128 letters, digits or _ . : -, neither first nor last a dot"


def is_conversation_id(conversation_id: str) -> bool:
    """Whether the id is one a conversation can have (`ID_RULE`)."""
    # fullmatch: `$` would also accept the id followed by a newline, which then cannot be
    # sent back in the `X-Bernard-Conversation-Id` header.
    return _ID.fullmatch(conversation_id) is not None


def check_conversation_id(conversation_id: str, param: str = "conversation_id") -> None:
    """Raise a 400 naming `param` unless the id is one a conversation can have."""
    if not is_conversation_id(conversation_id):
        raise invalid(f"conversation_id must be {ID_RULE}", param)


def conversation_not_found(conversation_id: str) -> ApiError:
    return not_found(
        f"no conversation with id '{conversation_id}'",
        "conversation_id",
        ErrorCode.CONVERSATION_NOT_FOUND,
    )


def machine(
    redis: Redis, owner: str, *, retention_s: int, turn_keep_s: int = DEFAULT_TURN_KEEP_S
) -> ConversationMachine:
    """The owner's conversations' transitions (shared/conversation_state.py)."""
    return ConversationMachine(redis, owner, retention_s=retention_s, turn_keep_s=turn_keep_s)


async def delete_conversation(
    redis: Redis,
    store: TurnStore,
    owner: str,
    conversation_id: str,
    *,
    retention_s: int,
    queue: Redis | None = None,
) -> None:
    """Delete the owner's conversation and everything recorded in it; 404 if they have none.

    Its turn that may still run is asked to stop and ended `conversation_deleted` (the last
    thing its clients read); then every turn that ran on it is forgotten: no route finds
    any of them again (shared/turns/creation.py, `TurnStore.forget`)."""
    if not is_conversation_id(conversation_id):  # no conversation can have it
        raise conversation_not_found(conversation_id)
    deletion = await machine(redis, owner, retention_s=retention_s).delete(conversation_id)
    if deletion.outcome is not Outcome.DELETED:
        raise conversation_not_found(conversation_id)
    if deletion.active_turn is not None:
        active = deletion.active_turn
        # Ended here, so its ending is this one whoever runs it (a turn that ended already
        # is left as it ended); then the cancel stops its worker at once, rather than at
        # its next write or liveness renewal.
        await store.end(active, owner, Cause.CONVERSATION_DELETED)
        await request_cancel(redis, active, ttl_s=FORGET_GRACE_S, queue=queue)
    for waiting in deletion.waiting:  # their clients read why they never ran
        await store.end(waiting, owner, Cause.CONVERSATION_DELETED)
    await store.forget(owner, deletion.turn_ids)


async def retitle(keeper: RecordKeeper, conversation_id: str, title: str) -> None:
    """Give the conversation the user's `title` (400 for one shared/titles.py refuses, 404
    for a conversation the owner does not have), whatever its status: a title is no turn.
    A generated title never replaces it."""
    title = title.strip()  # what surrounds it is no part of it (a shell's last newline)
    problem = title_problem(title)
    if problem is not None:
        raise invalid(problem, "title")
    stored = is_conversation_id(conversation_id) and await keeper.save_title(
        conversation_id, title, TitleSource.USER
    )
    if not stored:
        raise conversation_not_found(conversation_id)


def pending_of(proposals: list[Message], now: float | None = None) -> list[Message]:
    """The proposals still waiting for a decision, oldest first."""
    now = time.time() if now is None else now
    return [p for p in proposals if p.get("state") == "pending" and p["expires_at"] >= now]


def public_proposal(proposal: Message) -> dict[str, Any]:
    """What a client sees of a proposal (no tool schema, no internal state)."""
    return {
        "confirmation_id": proposal["confirmation_id"],
        "tool_call": proposal["tool_call"],
        "summary": proposal["summary"],
        "expires_at": proposal["expires_at"],
    }


async def active_may_run(store: TurnStore, conversation: Conversation, now: float) -> bool:
    """Whether the conversation's active turn may still run (`may_run`); a turn that never
    can end on its own is ended on the way (`TurnStore.settle`)."""
    if conversation.active_turn is None:
        return False
    status = await store.settle(conversation.active_turn)
    return may_run(status, conversation.active_since, now)


async def status_of(
    keeper: RecordKeeper, store: TurnStore, conversation: Conversation
) -> tuple[ConversationStatus, list[Message]]:
    """The conversation's status and its pending proposals."""
    now = time.time()
    status = derive_status(
        exists=True,
        active_turn=conversation.active_turn,
        paused_turn=conversation.paused_turn,
        paused_until=conversation.paused_until,
        active_may_run=await active_may_run(store, conversation, now),
        now=now,
        waiting=bool(conversation.waiting),
    )
    if status is not ConversationStatus.AWAITING_CONFIRMATION:
        return status, []
    return status, pending_of(await keeper.proposals(conversation.id), now)


def conversation_object(
    conversation: Conversation, status: ConversationStatus, pending: list[Message]
) -> dict[str, Any]:
    """The `conversation` resource. `turn_id` is the running turn's (null unless
    `running`), so a client that did not start it can follow it (`GET
    /v1/turns/{id}/events`)."""
    return {
        "id": conversation.id,
        "object": "conversation",
        "created_at": conversation.created_at,
        "updated_at": conversation.updated_at,
        "status": status,
        "turn_id": conversation.active_turn if status is ConversationStatus.RUNNING else None,
        "title": conversation.title,
        "metadata": conversation.metadata,
        "message_count": conversation.message_count,
        "pending_confirmation": public_proposal(pending[0]) if pending else None,
    }


def busy(status: ConversationStatus) -> ApiError:
    why = (
        "answer the pending tool call in words (a message saying yes, no, or what to do "
        "instead) or decide it with POST .../resume"
        if status is ConversationStatus.AWAITING_CONFIRMATION
        else "a turn is running on it; wait for it to end, or send the message with "
        "multitask_strategy 'interrupt' or 'enqueue'"
    )
    return ApiError(
        409,
        f"the conversation is {status.replace('_', ' ')}: {why}",
        param="conversation_id",
        code=ErrorCode.CONVERSATION_BUSY,
    )


@dataclass(frozen=True, slots=True)
class Multitask:
    """What a message does while a turn runs on its conversation: its `strategy`, and how
    many turns may wait in line (`BERNARD_MAX_WAITING_TURNS`)."""

    strategy: Strategy = Strategy.REJECT
    max_waiting: int = 0


@dataclass(frozen=True, slots=True)
class Opened:
    """The conversation a turn was claimed in, and for a turn that joined its line, the
    turn it waits behind (`follows`) and the running turn it interrupts (`stop`)."""

    conversation_id: str
    follows: str | None = None
    stop: str | None = None


def line_full(max_waiting: int) -> ApiError:
    return ApiError(
        409,
        f"{max_waiting} messages already wait in line in this conversation "
        "(BERNARD_MAX_WAITING_TURNS); wait for the running turn to end",
        param="conversation_id",
        code=ErrorCode.CONVERSATION_BUSY,
    )


async def claim_conversation(
    keeper: RecordKeeper,
    transitions: ConversationMachine,
    store: TurnStore,
    conversation_id: str,
    turn_id: str,
    multitask: Multitask | None = None,
    answering: AgentRequest | None = None,
) -> Opened:
    """Let `turn_id` hold the conversation (`START`); while a turn may still run on it, do
    as `multitask` says (`reject`, or none given: 409) or join its line; while tool calls
    wait for the user's decision, `answering` (the turn's request) answers them in words
    (`answer_in_words`), or, with no words to, 409; 409 too when the line is full. 404 for
    a conversation the owner does not have."""
    multitask = multitask or Multitask()
    for _ in range(3):  # the active turn changed between the look and the start
        conversation = await keeper.get_conversation(conversation_id)
        if conversation is None:
            raise conversation_not_found(conversation_id)
        now = time.time()
        ended = None
        if conversation.active_turn is not None:
            if not await active_may_run(store, conversation, now):
                ended = conversation.active_turn
            elif multitask.strategy is Strategy.REJECT:
                raise busy(ConversationStatus.RUNNING)
        claim = await transitions.start(
            conversation_id,
            turn_id,
            ended=ended,
            strategy=multitask.strategy,
            max_waiting=multitask.max_waiting,
        )
        if claim.outcome is Outcome.STARTED:
            return Opened(conversation_id)
        if claim.outcome is Outcome.WAITING:
            return Opened(conversation_id, follows=claim.active_turn or "", stop=claim.stop)
        if claim.outcome is Outcome.NOT_FOUND:
            raise conversation_not_found(conversation_id)
        if claim.outcome is Outcome.AWAITING_DECISION:
            if answering is None or words_of(answering) is None:
                raise busy(ConversationStatus.AWAITING_CONFIRMATION)
            if await answer_in_words(keeper, transitions, conversation_id, turn_id, answering):
                return Opened(conversation_id)
            continue  # nothing waits any more: a message like any
        if claim.outcome is Outcome.LINE_FULL:
            raise line_full(multitask.max_waiting)
        if claim.active_turn == conversation.active_turn:
            raise busy(ConversationStatus.RUNNING)  # the turn seen running still holds it
    raise busy(ConversationStatus.RUNNING)


async def after_claim(
    redis: Redis,
    store: TurnStore,
    owner: str,
    opened: Opened,
    turn_id: str,
    *,
    ttl_s: int,
    queue: Redis | None = None,
) -> None:
    """Once `turn_id`, which joined its conversation's line, is created (its job deferred):
    stop the turn it interrupts, as a cancel does (ended here if no worker took it yet),
    then start it at once should its turn have come already (the line moved before its
    job existed, or the turn it waited behind ended meanwhile)."""
    if opened.stop is not None:
        await request_cancel(redis, opened.stop, ttl_s=ttl_s, queue=queue, stop=Stop.INTERRUPT)
        await store.end(opened.stop, owner, Cause.INTERRUPTED_QUEUED)
    if await store.take_turn(owner, opened.conversation_id, turn_id) is InLine.HOLDS:
        await store.promote(turn_id)


def words_of(request: AgentRequest) -> str | None:
    """The text of the request's last message when it is the user's and holds only text:
    what may answer the calls a conversation waits on."""
    last = request.messages[-1] if request.messages else {}
    if last.get("role") != "user":
        return None
    content = last.get("content")
    if isinstance(content, list):
        parts = [part for part in content if isinstance(part, dict)]
        if len(parts) != len(content) or any(part.get("type") != "text" for part in parts):
            return None
        content = "".join(str(part.get("text", "")) for part in parts)
    return content if isinstance(content, str) and content.strip() else None


async def answer_in_words(
    keeper: RecordKeeper,
    transitions: ConversationMachine,
    conversation_id: str,
    turn_id: str,
    request: AgentRequest,
) -> bool:
    """Let the request's last message (`words_of`) answer the calls the conversation waits
    on, `turn_id` holding it to carry the answer out: a plain "yes" or "no" decides each of
    them (`DECIDE`, as `POST .../resume` does), anything else hands them to the turn, whose
    router reads the words (`ANSWER`). Sets what the turn resumes (`request.resume`); False
    when nothing waits any more. A 409 when a call was decided elsewhere meanwhile."""
    words = words_of(request)
    assert words is not None
    verdict = understand(words)
    if verdict is Verdict.OTHER:
        handed = await transitions.answer(conversation_id, turn_id)
        if handed.outcome is Outcome.NO_PROPOSAL:
            return False
        if handed.outcome is not Outcome.ANSWERING:
            raise busy(ConversationStatus.RUNNING)
        step = handed.decided[0]["turn_id"] if handed.decided else ""
        pending = [public_proposal(p) for p in handed.decided]
        request.resume = {"turn_id": step, "decisions": [], "pending": pending, "words": words}
        return True
    conversation = await keeper.get_conversation(conversation_id)
    step = conversation.paused_turn if conversation is not None else None
    proposals = pending_of(await keeper.proposals(conversation_id))
    waiting = [p for p in proposals if p["turn_id"] == step]
    for proposal in waiting:
        decision = await transitions.decide(
            conversation_id,
            proposal["confirmation_id"],
            "approve" if verdict is Verdict.APPROVE else "reject",
            turn_id=turn_id,
        )
        if decision.outcome is Outcome.RESUMED:
            request.resume = {**resumption(proposal, decision.decided), "words": words}
            return True
        if decision.outcome is not Outcome.DECIDED:
            raise decision_error(decision, conversation_id, proposal["confirmation_id"])
    return False


async def asked_conversation(keeper: RecordKeeper, request: AgentRequest) -> str | None:
    """The owner's conversation whose paused turn asked the question the request's history
    ends on, the request's last message answering it (`words_of`): a client that sends no
    conversation id but resends its whole history (shared/records/history_diff.py
    `history_digest`). None for any other history, or once that turn no longer waits."""
    messages = request.messages
    if len(messages) < 2 or words_of(request) is None:
        return None
    asked = await keeper.asked(history_digest(messages[:-1]))
    if asked is None:
        return None
    conversation_id, turn_id = asked
    conversation = await keeper.get_conversation(conversation_id)
    if conversation is None or conversation.paused_turn != turn_id:
        return None
    return conversation_id


async def open_conversation(
    redis: Redis,
    store: TurnStore,
    owner: str,
    conversation_id: str | None,
    turn_id: str,
    *,
    retention_s: int,
    turn_keep_s: int = DEFAULT_TURN_KEEP_S,
    multitask: Multitask | None = None,
    answering: AgentRequest | None = None,
) -> Opened:
    """The owner's conversation a chat turn continues, claimed for the turn: a new one (no
    id, or an id the owner has no conversation under) starts held by it, in one round
    trip; a known one as `claim_conversation` says (`answering`: the turn's request, whose
    message may answer the calls it waits on)."""
    keeper = RecordKeeper(redis, owner, retention_s=retention_s)
    transitions = machine(redis, owner, retention_s=retention_s, turn_keep_s=turn_keep_s)
    if conversation_id is not None:
        check_conversation_id(conversation_id)
    new_id = conversation_id or f"conv_{uuid.uuid4().hex}"
    if await transitions.create(new_id, turn_id=turn_id) is Outcome.CREATED:
        return Opened(new_id)
    return await claim_conversation(
        keeper, transitions, store, new_id, turn_id, multitask, answering
    )


async def give_back(
    transitions: ConversationMachine, store: TurnStore, conversation_id: str, turn_id: str
) -> None:
    """`turn_id` claimed the conversation but could not be created: unless it may run
    after all, the conversation is as before its claim (`UNCLAIM`: decisions it was to
    carry out wait again)."""
    with contextlib.suppress(*REDIS_ERRORS):
        if await store.never_ran(turn_id, transitions.owner):
            unclaimed = await transitions.unclaim(conversation_id, turn_id)
            if unclaimed.holder is not None:  # a turn waited behind it: its turn now
                await store.promote(unclaimed.holder)


def decision_error(decision: Decision, conversation_id: str, confirmation_id: str) -> ApiError:
    """The answer to a decision that decided nothing."""
    if decision.outcome in (Outcome.ALREADY_APPROVED, Outcome.ALREADY_REJECTED):
        done = "approved" if decision.outcome is Outcome.ALREADY_APPROVED else "rejected"
        return ApiError(
            409,
            f"this tool call was already {done}",
            param="confirmation_id",
            code=ErrorCode.CONFIRMATION_ALREADY_DECIDED,
        )
    if decision.outcome is Outcome.EXPIRED:
        return ApiError(
            409,
            "this tool call waited too long for a decision (BERNARD_CONFIRMATION_TTL_S) and "
            "was not run",
            param="confirmation_id",
            code=ErrorCode.CONFIRMATION_EXPIRED,
        )
    if decision.outcome is Outcome.NO_PROPOSAL:
        return confirmation_not_found(confirmation_id)
    return conversation_not_found(conversation_id)  # deleted meanwhile


def confirmation_not_found(confirmation_id: str) -> ApiError:
    return not_found(
        f"no tool call waits for confirmation '{confirmation_id}'",
        "confirmation_id",
        ErrorCode.CONFIRMATION_NOT_FOUND,
    )


def resumption(proposal: Message, decided: list[Message]) -> dict[str, Any]:
    """What the turn carrying out a step's decisions resumes (worker/harness/resume.py),
    given one of the step's proposals and the decisions `DECIDE` answered with."""
    return {
        "turn_id": proposal["turn_id"],
        "decisions": [
            {
                "confirmation_id": one["confirmation_id"],
                "tool_call": one["tool_call"],
                "decision": "approve" if one["state"] == "approved" else "reject",
                "arguments": one.get("arguments"),
            }
            for one in decided
        ],
    }
