"""Conversations as the API sees them: which one a request continues, and what state each
is in.

Conversation ids are their owner's: a known id continues that conversation (the worker
appends only the messages it has not stored yet); an unknown id starts one under that id,
so a client may choose its own (a voice satellite per room, say); no id starts one under a
fresh id. Another user using the same id has a conversation of their own, and neither can
tell that the other exists.

A conversation runs one turn at a time. Its status is `running` while the turn it last
started (`active_turn`) is queued or running, `awaiting_confirmation` while a tool call
waits for the user's decision (and has not expired), else `idle`. It is worked out from the
turn record and the proposals each time, so a turn that ends in any way (a reaper, a
crash) frees its conversation without anyone having to remember to.
"""

from __future__ import annotations

import re
import time
from typing import Any, Literal

from redis.asyncio import Redis

from api.errors import ApiError, invalid
from shared.errors import ErrorCode
from shared.records import Conversation, ConversationExistsError, Message, RecordKeeper
from shared.turns import TurnStore

Status = Literal["idle", "running", "awaiting_confirmation"]

_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


def is_conversation_id(conversation_id: str) -> bool:
    """Whether the id is 1-128 letters, digits or `_ . : -`: one a conversation can have."""
    # fullmatch: `$` would also accept the id followed by a newline, which then cannot be
    # sent back in the `X-Bernard-Conversation-Id` header.
    return _ID.fullmatch(conversation_id) is not None


def check_conversation_id(conversation_id: str, param: str = "conversation_id") -> None:
    """Raise a 400 naming `param` unless the id is one a conversation can have."""
    if not is_conversation_id(conversation_id):
        raise invalid("conversation_id must be 1-128 letters, digits or _ . : -", param)


def conversation_not_found(conversation_id: str) -> ApiError:
    return ApiError(
        404,
        f"no conversation with id '{conversation_id}'",
        param="conversation_id",
        code=ErrorCode.CONVERSATION_NOT_FOUND,
    )


async def delete_conversation(
    redis: Redis, owner: str, conversation_id: str, *, retention_s: int
) -> None:
    """Delete the owner's conversation and everything recorded in it; 404 if they have none."""
    if not is_conversation_id(conversation_id):  # no conversation can have it
        raise conversation_not_found(conversation_id)
    keeper = RecordKeeper(redis, owner, retention_s=retention_s)
    if not await keeper.delete_conversation(conversation_id):
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


async def status_of(
    keeper: RecordKeeper, store: TurnStore, conversation: Conversation
) -> tuple[Status, list[Message]]:
    """The conversation's status and its pending proposals."""
    if conversation.active_turn is not None:
        turn = await store.get(conversation.active_turn)
        if turn is not None and turn.status in ("queued", "running"):
            return "running", []
    pending = pending_of(await keeper.proposals(conversation.id))
    return ("awaiting_confirmation" if pending else "idle"), pending


def conversation_object(
    conversation: Conversation, status: Status, pending: list[Message]
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
        "turn_id": conversation.active_turn if status == "running" else None,
        "metadata": conversation.metadata,
        "message_count": conversation.message_count,
        "pending_confirmation": public_proposal(pending[0]) if pending else None,
    }


def busy(status: Status) -> ApiError:
    why = (
        "approve or reject the pending tool call first (POST .../resume)"
        if status == "awaiting_confirmation"
        else "a turn is running on it; wait for it to end"
    )
    return ApiError(
        409,
        f"the conversation is {status.replace('_', ' ')}: {why}",
        param="conversation_id",
        code=ErrorCode.CONVERSATION_BUSY,
    )


async def claim_conversation(
    keeper: RecordKeeper,
    store: TurnStore,
    conversation_id: str,
    turn_id: str,
    *,
    resuming: bool = False,
) -> None:
    """Make `turn_id` the conversation's one running turn, or answer 409 when it is busy:
    a turn runs on it, or (unless this turn is `resuming` it) a tool call waits for the
    user's decision. 404 for a conversation the owner does not have."""
    for _ in range(3):  # another request may take it between the look and the swap
        conversation = await keeper.get_conversation(conversation_id)
        if conversation is None:
            raise conversation_not_found(conversation_id)
        status, _ = await status_of(keeper, store, conversation)
        if status == "running" or (status == "awaiting_confirmation" and not resuming):
            raise busy(status)
        if await keeper.activate(conversation_id, turn_id, expected=conversation.active_turn):
            return
    raise busy("running")


async def open_conversation(
    redis: Redis,
    store: TurnStore,
    owner: str,
    conversation_id: str | None,
    turn_id: str,
    *,
    retention_s: int,
) -> str:
    """The id of the owner's conversation a chat turn continues, claimed for the turn: a
    new one (no id, or an id the owner has no conversation under) starts with it running,
    in one round trip; a known one must not be busy (`claim_conversation`)."""
    keeper = RecordKeeper(redis, owner, retention_s=retention_s)
    if conversation_id is not None:
        check_conversation_id(conversation_id)
    try:
        return await keeper.create_conversation(conversation_id, active_turn=turn_id)
    except ConversationExistsError:
        assert conversation_id is not None
    await claim_conversation(keeper, store, conversation_id, turn_id)
    return conversation_id
