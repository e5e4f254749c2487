"""Asking a running turn to stop, from any API process.

The cancel key is the durable fact (a worker that starts the turn later still sees it);
the published message is the fast path that lets the worker abort at once without polling.
"""

from __future__ import annotations

from redis.asyncio import Redis

from shared import keys


async def request_cancel(redis: Redis, turn_id: str, *, ttl_s: int) -> None:
    """Set the turn's cancel key and tell every worker about it."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.set(keys.cancel(turn_id), b"1", ex=ttl_s)
        pipe.publish(keys.CANCEL_CHANNEL, turn_id)
        await pipe.execute()
