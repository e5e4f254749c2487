"""Who is watching a turn, so that a disconnect stops it only when nobody is left.

Each attached stream is a member of the turn's `attached` sorted set, scored with the time
it stops counting, so a crashed API process's entries lapse on their own (after an hour:
an entry lapsing too early could stop a watched turn, a stale one only lets a turn
finish). A client detaching under the `cancel` policy cancels the turn once no
attachment is left `BERNARD_DISCONNECT_GRACE_S` later.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from redis.asyncio import Redis

from shared import keys
from shared.cancel import request_cancel
from shared.settings import Settings

_ATTACHMENT_TTL_S = 3600.0
_pending: set[asyncio.Task[None]] = set()


async def attach(redis: Redis, turn_id: str) -> str:
    attachment = uuid.uuid4().hex
    await redis.zadd(keys.attached(turn_id), {attachment: time.time() + _ATTACHMENT_TTL_S})
    return attachment


async def detach(
    redis: Redis, settings: Settings, turn_id: str, attachment: str, *, cancel_when_alone: bool
) -> None:
    """Forget the attachment; under the `cancel` policy, stop the turn if nobody returns."""
    await redis.zrem(keys.attached(turn_id), attachment)
    if not cancel_when_alone:
        return
    if settings.disconnect_grace_s <= 0:
        await _cancel_if_alone(redis, settings, turn_id)
        return
    task = asyncio.create_task(_cancel_after_grace(redis, settings, turn_id))
    _pending.add(task)
    task.add_done_callback(_pending.discard)


async def _cancel_after_grace(redis: Redis, settings: Settings, turn_id: str) -> None:
    await asyncio.sleep(settings.disconnect_grace_s)
    await _cancel_if_alone(redis, settings, turn_id)


async def _cancel_if_alone(redis: Redis, settings: Settings, turn_id: str) -> None:
    watching = await redis.zcount(keys.attached(turn_id), time.time(), "+inf")
    if not watching:
        await request_cancel(redis, turn_id, ttl_s=settings.turn_retention_s)
