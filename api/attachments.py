"""Who is watching which turn, and how many streams each user holds open.

Each open SSE stream is an attachment: a member of its turn's `attached` sorted set and of
its owner's `open_streams` set, both scored with the time it stops counting. An API
process renews the streams it relays (`renew`), so a crashed process's entries lapse on
their own within `STREAM_LEASE_S`; the per-turn entry keeps a longer expiry (an entry
lapsing early could stop a watched turn; a stale one only lets a turn finish).

Opening a stream is refused (`TooManyStreamsError`) once the owner holds
`BERNARD_MAX_STREAMS_PER_USER`, checked and counted in one script, so the limit holds
across every API process. A client detaching under the `cancel` policy cancels the turn
once no attachment is left `BERNARD_DISCONNECT_GRACE_S` later.

The owner's count is on the queue role, the turn's attachments on the data role
(shared/keys.py): opening sends both at once and takes the attachment back if the count
refused it.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from shared import keys
from shared.cancel import request_cancel
from shared.scripts import TAKE_SLOT, in_pipeline
from shared.settings import Settings

ATTACHMENT_TTL_S = 3600.0
# How long an open stream counts against its owner without being renewed; `RENEW_S` is
# how often the relay renews it.
STREAM_LEASE_S = 60.0
RENEW_S = 20.0
_pending: set[asyncio.Task[None]] = set()


class TooManyStreamsError(Exception):
    """The owner already holds as many open streams as they may."""


class Streams:
    """Opens, renews and closes the streams of one API process: `redis` is the data role,
    `queue` the queue role (the same client when one Redis holds both)."""

    def __init__(self, redis: Redis, settings: Settings, *, queue: Redis | None = None) -> None:
        self.redis = redis
        self.queue = queue if queue is not None else redis
        self.settings = settings

    async def open(self, owner: str, turn_id: str | None = None) -> str:
        """Count a new stream of `owner` (attached to `turn_id` when given); its id.

        Raises `TooManyStreamsError` at the owner's limit. A stream of a turn not created
        yet passes no `turn_id`; the turn's creation attaches it (`TurnStore.create`).
        """
        attachment = uuid.uuid4().hex
        now = time.time()
        count_args = [
            now,
            self.settings.max_streams_per_user,
            attachment,
            now + STREAM_LEASE_S,
            int(ATTACHMENT_TTL_S),
        ]
        count_keys = [keys.open_streams(owner)]
        if turn_id is None or self.queue is self.redis:
            async with self.queue.pipeline(transaction=False) as pipe:
                in_pipeline(pipe, TAKE_SLOT, count_keys, count_args)
                if turn_id is not None:
                    self._attach(pipe, turn_id, attachment, now)
                opened, *_ = await pipe.execute()
        else:  # the count on the queue role, the attachment on the data role, sent at once
            async with self.queue.pipeline(transaction=False) as counting:
                in_pipeline(counting, TAKE_SLOT, count_keys, count_args)
                async with self.redis.pipeline(transaction=False) as attaching:
                    self._attach(attaching, turn_id, attachment, now)
                    (opened,), _ = await asyncio.gather(counting.execute(), attaching.execute())
        if not int(opened):
            if turn_id is not None:
                await self.redis.zrem(keys.attached(turn_id), attachment)
            raise TooManyStreamsError(owner)
        return attachment

    @staticmethod
    def _attach(pipe: Pipeline, turn_id: str, attachment: str, now: float) -> None:
        pipe.zadd(keys.attached(turn_id), {attachment: now + ATTACHMENT_TTL_S})
        pipe.expire(keys.attached(turn_id), int(ATTACHMENT_TTL_S))

    async def renew(self, owner: str, attachment: str) -> None:
        """The stream is still open: keep counting it."""
        await self.queue.zadd(
            keys.open_streams(owner), {attachment: time.time() + STREAM_LEASE_S}, xx=True
        )

    async def close(
        self, owner: str, attachment: str, turn_id: str | None = None, *, cancel_when_alone: bool
    ) -> None:
        """Forget the stream; under the `cancel` policy, stop the turn if nobody returns."""
        if turn_id is not None and self.queue is not self.redis:
            await asyncio.gather(
                self.queue.zrem(keys.open_streams(owner), attachment),
                self.redis.zrem(keys.attached(turn_id), attachment),
            )
        else:  # one client for both, or no turn
            async with self.queue.pipeline(transaction=False) as pipe:
                pipe.zrem(keys.open_streams(owner), attachment)
                if turn_id is not None:
                    pipe.zrem(keys.attached(turn_id), attachment)
                await pipe.execute()
        if turn_id is None or not cancel_when_alone:
            return
        if self.settings.disconnect_grace_s <= 0:
            await self._cancel_if_alone(turn_id)
            return
        task = asyncio.create_task(self._cancel_after_grace(turn_id))
        _pending.add(task)
        task.add_done_callback(_pending.discard)

    async def _cancel_after_grace(self, turn_id: str) -> None:
        await asyncio.sleep(self.settings.disconnect_grace_s)
        await self._cancel_if_alone(turn_id)

    async def _cancel_if_alone(self, turn_id: str) -> None:
        watching = await self.redis.zcount(keys.attached(turn_id), time.time(), "+inf")
        if not watching:
            await request_cancel(
                self.redis, turn_id, ttl_s=self.settings.turn_retention_s, queue=self.queue
            )
