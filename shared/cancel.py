"""Asking a running turn to stop, from any API process.

The cancel key is the durable fact (a worker that starts the turn later still sees it);
the published message is the fast path that lets the worker abort at once without polling.
The key is the turn's, on the data role; the channel is on the queue role, which every
worker listens to (shared/keys.py). The key goes first. Beside the message, the turn's
entry in `keys.CANCELS` (queue role) is what a worker that missed the message finds at its
next liveness renewal (shared/liveness.py).

The key's value says why (`Stop`): a cancel, or a newer message in the turn's conversation
that interrupts it (shared/conversation_state.py `Strategy.INTERRUPT`); the worker reads it
once the turn has stopped, to end it with the right cause (worker/supervisor.py).
"""

from __future__ import annotations

import time
from enum import StrEnum

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from shared import keys

# How long a turn's entry in `keys.CANCELS` lasts: a worker renews its liveness every
# second, so a cancel is seen in seconds, but one whose worker stalls must still find it.
CANCEL_NOTICE_S = 3600


class Stop(StrEnum):
    """Why a turn is asked to stop: its cancel key's value."""

    CANCEL = "1"  # as every cancel key said before there were reasons
    INTERRUPT = "interrupt"

    @classmethod
    def of(cls, value: bytes | str | None) -> Stop:
        """The stop a cancel key's value asks for; any value but `INTERRUPT`'s is a cancel."""
        text = value.decode() if isinstance(value, bytes) else value
        return cls.INTERRUPT if text == cls.INTERRUPT else cls.CANCEL


def _notify(pipe: Pipeline, turn_id: str, ttl_s: int) -> None:
    lasts_s = min(ttl_s, CANCEL_NOTICE_S)
    pipe.zadd(keys.CANCELS, {turn_id: time.time() + lasts_s})
    # Longer than any entry: the keepers drop lapsed entries, the TTL the set once idle.
    pipe.expire(keys.CANCELS, CANCEL_NOTICE_S)
    pipe.publish(keys.CANCEL_CHANNEL, turn_id)


async def request_cancel(
    redis: Redis,
    turn_id: str,
    *,
    ttl_s: int,
    queue: Redis | None = None,
    stop: Stop = Stop.CANCEL,
) -> None:
    """Set the turn's cancel key (on `redis`, the data role) to `stop` and tell every
    worker about it (on `queue`, the queue role; the same client when one Redis holds
    both)."""
    queue = queue if queue is not None else redis
    if queue is redis:
        async with redis.pipeline(transaction=False) as pipe:
            pipe.set(keys.cancel(turn_id), stop.value, ex=ttl_s)
            _notify(pipe, turn_id, ttl_s)
            await pipe.execute()
        return
    await redis.set(keys.cancel(turn_id), stop.value, ex=ttl_s)
    async with queue.pipeline(transaction=False) as pipe:
        _notify(pipe, turn_id, ttl_s)
        await pipe.execute()
