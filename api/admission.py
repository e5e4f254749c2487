"""Admission: what a request must pass before Bernard stores anything for it.

A request that starts a turn passes, in order:

1. the memory guard (api/store_guard.py): no round trip, a verdict sampled in the
   background; 503 `store_full` while Redis is nearly full;
2. the owner's rate and active turns (shared/turns/admission.py `TurnStore.admit`, one script on the
   queue role): 429 `rate_limit_exceeded` with the `Retry-After` the bucket says, or at
   `BERNARD_MAX_ACTIVE_TURNS_PER_USER`;
3. the storage budgets (shared/budgets.py), read from the data role with the admission
   (in its pipeline when one Redis holds both roles, else at the same time): 429
   `storage_quota_exceeded` when the owner stores `BERNARD_MAX_USER_BYTES` (conversations,
   and what finished turns keep of their requests), 429
   `too_many_conversations` when the request would start a conversation and the owner has
   `BERNARD_MAX_CONVERSATIONS_PER_USER`, 413 `conversation_too_large` when the conversation
   it continues holds `BERNARD_MAX_CONVERSATION_BYTES` (or a posted message would take it
   over).

A refusal comes before the turn, its conversation or anything else of it is stored; a
turn admitted on the queue and then refused for storage gives its slot back (its tokens
stay spent: a refused request is a request). The budgets full are 429s that retrying soon
does not cure, so they also say `x-should-retry: false` (the OpenAI SDKs would retry
them otherwise).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio.client import Pipeline

from api.errors import ApiError
from api.state import AppState
from shared import budgets, keys
from shared.budgets import Usage
from shared.connection import REDIS_ERRORS
from shared.errors import ErrorCode
from shared.rate_limit import RateLimitedError
from shared.settings import Settings
from shared.turns.admission import TooManyTurnsError

# A full storage budget does not empty in the seconds an SDK waits before it retries.
_NO_RETRY = {"x-should-retry": "false"}


@dataclass(frozen=True, slots=True)
class Storing:
    """What a request is about to store in its owner's conversations.

    `conversation_id` is the conversation it continues, or starts under that id when the
    owner has none; None starts one under a fresh id. `adds` is how many bytes it adds to
    the conversation for sure (a posted message's text: the stored row holds at least that),
    0 when only the worker can tell (what of a resent history is new).
    """

    conversation_id: str | None = None
    adds: int = 0


def rate_limited(settings: Settings, error: RateLimitedError) -> ApiError:
    return ApiError(
        429,
        f"too many requests: at most {settings.rate_limit_burst} at once and "
        f"{settings.rate_limit_per_minute:g} a minute, a turn counting "
        f"{settings.rate_limit_turn_cost} (BERNARD_RATE_LIMIT_BURST, "
        f"BERNARD_RATE_LIMIT_PER_MINUTE, BERNARD_RATE_LIMIT_TURN_COST); try again in "
        f"{error.retry_after_s} s",
        code=ErrorCode.RATE_LIMIT_EXCEEDED,
        headers={"retry-after": str(error.retry_after_s)},
    )


def too_many_turns(settings: Settings) -> ApiError:
    limit = settings.max_active_turns_per_user
    return ApiError(
        429,
        f"you already have {limit} turns queued or running "
        "(BERNARD_MAX_ACTIVE_TURNS_PER_USER); wait for one to end",
        code=ErrorCode.RATE_LIMIT_EXCEEDED,
    )


def conversation_too_large(conversation_id: str, held: int, limit: int) -> ApiError:
    return ApiError(
        413,
        f"the conversation '{conversation_id}' holds {held} bytes and may hold {limit} "
        "(BERNARD_MAX_CONVERSATION_BYTES): start a new conversation or delete this one",
        param="conversation_id",
        code=ErrorCode.CONVERSATION_TOO_LARGE,
    )


def check_storage(settings: Settings, storing: Storing, usage: Usage, held: int) -> None:
    """Refuse what `storing` would store beyond the owner's budgets: `usage` is the owner's,
    `held` the bytes of the conversation it continues (0 for none)."""
    if usage.bytes >= settings.max_user_bytes:
        raise ApiError(
            429,
            f"you store {usage.bytes} bytes of conversations and kept responses and may "
            f"store {settings.max_user_bytes} (BERNARD_MAX_USER_BYTES): delete "
            "conversations or responses you no longer need (DELETE /v1/conversations/{id}, "
            "DELETE /v1/responses/{id}), or wait for unused ones to expire "
            "(BERNARD_CONVERSATION_RETENTION_S, BERNARD_TURN_RETENTION_S)",
            code=ErrorCode.STORAGE_QUOTA_EXCEEDED,
            headers=_NO_RETRY,
        )
    creates = storing.conversation_id is None or not usage.known
    if creates and usage.conversations >= settings.max_conversations_per_user:
        raise ApiError(
            429,
            f"you have {usage.conversations} conversations and may have "
            f"{settings.max_conversations_per_user} (BERNARD_MAX_CONVERSATIONS_PER_USER): "
            "continue one (conversation_id) or delete some",
            code=ErrorCode.TOO_MANY_CONVERSATIONS,
            headers=_NO_RETRY,
        )
    if storing.conversation_id is not None and not creates:
        limit = settings.max_conversation_bytes
        if held >= limit or held + storing.adds > limit:
            raise conversation_too_large(storing.conversation_id, held, limit)


def storage_reads(state: AppState, owner: str, storing: Storing) -> Callable[[Pipeline], None]:
    """What queues, on a pipeline of the data role, the reads `storage_of` answers: the
    owner's usage and the bytes of the conversation `storing` continues (a Cluster's
    pipeline reaches both slots at once)."""
    retention_s = state.settings.conversation_retention_s
    conversation_id = storing.conversation_id

    def queue(pipe: Pipeline) -> None:
        budgets.queue_usage(pipe, owner, retention_s=retention_s, conversation_id=conversation_id)
        if conversation_id is not None:
            pipe.hget(keys.conversation(owner, conversation_id), "bytes")

    return queue


def storage_of(replies: Sequence[Any]) -> tuple[Usage, int]:
    """The owner's usage and the conversation's bytes (0 for none), from `storage_reads`."""
    usage, *held = replies
    return budgets.usage_of(usage), int(held[0] or 0) if held else 0


async def admit_storing(state: AppState, owner: str, storing: Storing) -> None:
    """Admit a request that stores without starting a turn (a new conversation)."""
    state.guard.check()
    async with state.redis.pipeline(transaction=False) as pipe:
        storage_reads(state, owner, storing)(pipe)
        replies = await pipe.execute()
    check_storage(state.settings, storing, *storage_of(replies))


async def admit_turn(
    state: AppState, owner: str, turn_id: str, storing: Storing | None, *, ttl_s: int
) -> None:
    """Admit the owner's new turn `turn_id` (see the module's docstring), its slot held at
    most `ttl_s`; `storing` None for a turn that stores no conversation (a legacy
    completion)."""
    state.guard.check()
    settings = state.settings
    try:
        read = await state.store.admit(
            owner,
            turn_id,
            limit=settings.max_active_turns_per_user,
            ttl_s=ttl_s,
            rate=state.limiter.rate,
            beside=storage_reads(state, owner, storing) if storing is not None else None,
        )
    except RateLimitedError as exc:
        raise rate_limited(settings, exc) from None
    except TooManyTurnsError:
        raise too_many_turns(settings) from None
    except BaseException:  # the reads beside failed: the slot may be taken
        await _release(state, owner, turn_id)
        raise
    if storing is None:
        return
    try:
        check_storage(settings, storing, *storage_of(read))
    except ApiError:
        await _release(state, owner, turn_id)
        raise


async def _release(state: AppState, owner: str, turn_id: str) -> None:
    with contextlib.suppress(*REDIS_ERRORS):
        await state.store.release(owner, turn_id)
