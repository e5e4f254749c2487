"""Reading turns: one record (`get`) and an owner's turns newest first (`recent`); neither
writes (`settle`, the read that may end a turn, is shared/turns/reaping.py's)."""

from __future__ import annotations

from shared import keys
from shared.turn_record import TurnRecord
from shared.turns.roles import TurnRoles

# What `TurnStore.recent` reads of each turn: everything but the prompt (`messages`).
_LISTED_FIELDS = (
    "id",
    "owner",
    "model",
    "status",
    "created_at",
    "request",
    "conversation_id",
    "started_at",
    "finished_at",
    "error",
    "result",
    "preview",
)


class Reading(TurnRoles):
    """Reads turn records."""

    async def get(self, turn_id: str) -> TurnRecord | None:
        """The turn's record; None once it is gone or forgotten (`forget`)."""
        raw = await self.redis.hgetall(keys.turn(turn_id))  # type: ignore[misc]
        if not raw or b"forgotten" in raw:
            return None
        return TurnRecord.from_redis(raw)

    async def recent(
        self, owner: str, *, after: str | None = None, limit: int = 20
    ) -> tuple[list[TurnRecord], bool]:
        """The owner's turns, newest first, from just after the one with id `after`; at most
        `limit`, and whether more follow. A listed turn comes without its prompt. Entries of
        turns that expired are dropped from the index on the way."""
        index = keys.turns(owner)
        start = 0
        if after is not None:
            rank = await self.redis.zrevrank(index, after)
            if rank is None:
                return [], False
            start = rank + 1
        found: list[TurnRecord] = []
        gone: list[str] = []
        while len(found) <= limit:
            raw = await self.redis.zrevrange(index, start, start + limit)
            if not raw:
                break
            start += len(raw)
            turn_ids = [item.decode() for item in raw]
            async with self.redis.pipeline(transaction=False) as pipe:
                for turn_id in turn_ids:
                    pipe.hmget(keys.turn(turn_id), list(_LISTED_FIELDS))
                replies = await pipe.execute()
            for turn_id, values in zip(turn_ids, replies, strict=True):
                fields = {
                    name.encode(): value
                    for name, value in zip(_LISTED_FIELDS, values, strict=True)
                    if value is not None
                }
                if b"request" not in fields:
                    gone.append(turn_id)
                elif fields[b"owner"].decode() == owner:
                    found.append(TurnRecord.from_redis(fields))
        if gone:
            await self.redis.zrem(index, *gone)
        return found[:limit], len(found) > limit
