"""The webhook side of a turn's ending: what a delivery queued again carries.

The call that ends a turn queues its delivery (shared/webhooks.py); should it die first,
the next call that finds the turn ended (a claim, a finish refused as `over`) queues it
again from the `done` the stream closes with, under the same job id.
"""

from __future__ import annotations

from redis.asyncio import Redis

from shared import keys
from shared.events import Done, decode
from shared.lifecycle import SEALED_ID


async def ending_of(redis: Redis, turn_id: str) -> tuple[Done, float] | None:
    """The `done` an ended turn's stream closes with, and when the turn ended; None if
    its stream no longer holds it (forgotten, trimmed away)."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.xrange(keys.events(turn_id), SEALED_ID, SEALED_ID)
        pipe.hget(keys.turn(turn_id), "finished_at")
        entries, finished_at = await pipe.execute()
    if not entries or finished_at is None:
        return None
    done = decode(entries[0][1][b"e"]).event
    return (done, float(finished_at)) if isinstance(done, Done) else None
