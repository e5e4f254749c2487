"""Asking a running turn to stop, from any API process.

The cancel key is the durable fact (a worker that starts the turn later still sees it);
the published message is the fast path that lets the worker abort at once without polling.
The key is the turn's, on the data role; the channel is on the queue role, which every
worker listens to (shared/keys.py). The key goes first.
"""

from __future__ import annotations

from redis.asyncio import Redis

from shared import keys


async def request_cancel(
    redis: Redis, turn_id: str, *, ttl_s: int, queue: Redis | None = None
) -> None:
    """Set the turn's cancel key (on `redis`, the data role) and tell every worker about it
    (on `queue`, the queue role; the same client when one Redis holds both)."""
    queue = queue if queue is not None else redis
    if queue is redis:
        async with redis.pipeline(transaction=False) as pipe:
            pipe.set(keys.cancel(turn_id), b"1", ex=ttl_s)
            pipe.publish(keys.CANCEL_CHANNEL, turn_id)
            await pipe.execute()
        return
    await redis.set(keys.cancel(turn_id), b"1", ex=ttl_s)
    await queue.publish(keys.CANCEL_CHANNEL, turn_id)
