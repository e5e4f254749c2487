"""A turn's admission: its tokens from the owner's bucket (shared/rate_limit.py) and a slot
among the owner's queued and running turns, in one script (`_ADMIT`), its reply named by
`TurnAdmission`; and the slot's release for a turn never created.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from typing import Any

from redis.asyncio.client import Pipeline
from redis.commands.core import AsyncScript

from shared import keys
from shared.events import TERMINAL_STATUSES
from shared.lifecycle import STRANDED_AFTER_S
from shared.rate_limit import TAKE_TOKENS_FUNCTION, Rate, RateLimitedError
from shared.scripts import TAKE_SLOT, in_pipeline
from shared.turns.reaping import Reaping


class TooManyTurnsError(Exception):
    """The owner already has as many queued and running turns as they may."""


# KEYS: active turns, rate bucket. ARGV: TAKE_SLOT's, then the refill per s ('' for no
# limit), burst, cost. A turn's admission: its tokens (shared/rate_limit.py), then its
# slot, in one step. Returns TAKE_SLOT's 1 or 0 (the tokens are spent: a refused attempt
# is a request too), or minus the milliseconds until the bucket could pay: `admission_of`
# names them.
_ADMIT = f"""
{TAKE_TOKENS_FUNCTION}
if ARGV[6] ~= '' then
  local wait = take(KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[6]), tonumber(ARGV[7]),
                    tonumber(ARGV[8]))
  if wait > 0 then return -wait end
end
{TAKE_SLOT}
"""


class Admitted(StrEnum):
    """What `_ADMIT` (and `TAKE_SLOT`, its second half) did with a turn."""

    ADMITTED = "admitted"  # its tokens paid and its slot taken
    AT_LIMIT = "at_limit"  # its tokens paid, but the owner has no slot left
    RATE_LIMITED = "rate_limited"  # the bucket cannot pay yet: nothing taken


@dataclass(frozen=True, slots=True)
class TurnAdmission:
    """`_ADMIT`'s reply, named: what it did, and for `RATE_LIMITED` the milliseconds until
    the bucket could pay."""

    outcome: Admitted
    wait_ms: int = 0


def admission_of(reply: int | bytes) -> TurnAdmission:
    """Name `_ADMIT`'s (or `TAKE_SLOT`'s) reply: 1 admitted, 0 at the limit, minus the
    wait in ms when rate limited."""
    value = int(reply)
    if value < 0:
        return TurnAdmission(Admitted.RATE_LIMITED, -value)
    if value == 0:
        return TurnAdmission(Admitted.AT_LIMIT)
    if value == 1:
        return TurnAdmission(Admitted.ADMITTED)
    raise ValueError(f"no admission replies {value}")


class Admitting(Reaping):
    """Admits turns against their owner's rate and active turns, and releases the slot of
    one never created."""

    # The owner's active turns: queued or running, each leaving the set when it ends
    # (`finish`), or at its deadline should that never happen.
    @cached_property
    def _admit(self) -> AsyncScript:
        return self.queue.register_script(_ADMIT)

    @cached_property
    def _take_slot(self) -> AsyncScript:
        return self.queue.register_script(TAKE_SLOT)

    async def admit(
        self,
        owner: str,
        turn_id: str,
        *,
        limit: int,
        ttl_s: int,
        rate: Rate | None = None,
        beside: Callable[[Pipeline], None] | None = None,
    ) -> list[Any]:
        """Take the turn's tokens from the owner's bucket (`rate`; None: no limit) and count
        `turn_id` among the owner's queued and running turns, in one step; raise
        `RateLimitedError` when the bucket cannot pay, `TooManyTurnsError` when they
        already have `limit` turns. The entry leaves when the turn ends (`finish`), on
        `release`, or after `ttl_s` should neither happen. At the limit, the entries of
        turns that have ended (or that no worker will ever run: `settle`) without being
        released are dropped first: one whose `finish` has not reached its release yet,
        or one a crash between the halves of a `finish` left behind.

        `beside` queues reads of the data role that go with the admission (its budgets:
        api/admission.py): in the admission's own pipeline when one Redis holds both roles,
        else at the same time; their replies are returned.
        """
        now = time.time()
        args: list[str | float | int] = [now, limit, turn_id, now + ttl_s, ttl_s]
        paid = [*args, *rate.args(rate.turn_cost, now)[1:]] if rate is not None else [*args, ""]
        slot_keys = [keys.active_turns(owner), keys.rate(owner)]
        read: list[Any] = []
        if beside is None:
            reply = await self._admit(keys=slot_keys, args=paid)
        elif self._one_client:
            async with self.queue.pipeline(transaction=False) as pipe:
                in_pipeline(pipe, _ADMIT, slot_keys, paid)
                beside(pipe)
                reply, *read = await pipe.execute()
        else:
            reply, read = await asyncio.gather(
                self._admit(keys=slot_keys, args=paid), self._read(beside)
            )
        admission = admission_of(reply)
        if admission.outcome is Admitted.RATE_LIMITED:
            raise RateLimitedError(admission.wait_ms)
        if admission.outcome is Admitted.AT_LIMIT and await self._release_ended(owner, ttl_s=ttl_s):
            # The tokens are spent already: only the slot is taken again.
            admission = admission_of(await self._take_slot(keys=slot_keys[:1], args=args))
        if admission.outcome is Admitted.AT_LIMIT:
            raise TooManyTurnsError(owner)
        return read

    async def _read(self, queue_reads: Callable[[Pipeline], None]) -> list[Any]:
        async with self.redis.pipeline(transaction=False) as pipe:
            queue_reads(pipe)
            return list(await pipe.execute())

    async def _release_ended(self, owner: str, *, ttl_s: int) -> bool:
        """Drop the owner's active entries whose turn has ended or is gone; whether any
        went. An ended turn's entry goes whatever its age: its client may have read the
        end and asked again before `finish` released it. One without a record goes only
        once admitted over `STRANDED_AFTER_S` ago: a younger one may be a turn whose
        creation is under way (admitted, not stored yet). An entry's score is its
        admission plus `ttl_s`."""
        active = await self.queue.zrange(keys.active_turns(owner), 0, -1, withscores=True)
        turn_ids = [raw.decode() for raw, _ in active]
        statuses = await self.settle_many(turn_ids) if turn_ids else []
        old_enough = time.time() + ttl_s - STRANDED_AFTER_S
        ended_ids = [
            turn_id
            for turn_id, (_, score), status in zip(turn_ids, active, statuses, strict=True)
            if status in TERMINAL_STATUSES or (status is None and score <= old_enough)
        ]
        if ended_ids:
            await self.queue.zrem(keys.active_turns(owner), *ended_ids)
        return bool(ended_ids)

    async def release(self, owner: str, turn_id: str) -> None:
        """Undo `admit` for a turn that was never created."""
        await self.queue.zrem(keys.active_turns(owner), turn_id)
