"""Whether a worker process lives: one key per worker, renewed once a period for all the
turns it runs, rather than a lease per running turn (which cost most of a slow stream's
Redis commands).

On the queue role (one primary), so one script may span a worker's keys and the running set:
`keys.worker_alive(w)` lives `BERNARD_LEASE_TTL_S` from each renewal (worker/liveness.py),
`keys.worker_turns(w)` holds the turns it claimed. A reaper ends a lapsed worker's turns
`worker_lost`, and the turns a live worker let go of (a negative score in the running set).
The same renewal script tells the worker which of its turns are over or asked to stop. Turn
records are on the data role: ending one checks the worker's key first, then runs the turn's
own FINISH, so a worker that comes back in between finds its turn ended.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from shared import keys
from shared.scripts import in_pipeline

__all__ = ["MEMBERS_PER_COMMAND", "TURNS_TTL_S", "Kept", "Liveness"]

# How long a worker's set of turns outlives its last renewal, and its entry in
# `keys.WORKERS`: an hour for the reapers to end a dead worker's turns (they take seconds).
TURNS_TTL_S = 3600
# The most members one command of a script takes (Lua's `unpack` has a limit).
MEMBERS_PER_COMMAND = 1000

# Removes `members` from the set `key`, MEMBERS_PER_COMMAND at a time.
_SREM_ALL = f"""
local function srem_all(key, members)
  for i = 1, #members, {MEMBERS_PER_COMMAND} do
    redis.call('SREM', key, unpack(members, i, math.min(i + {MEMBERS_PER_COMMAND - 1}, #members)))
  end
end
"""

# KEYS: the worker's alive key, its turns, the running set, the cancels, the workers.
# ARGV: worker id, ttl ms, turns ttl s, now, workers silent since ('' to leave them), then the
# turns the worker let go of since its last call (at most MEMBERS_PER_COMMAND). Renews the
# worker's liveness and says, of its turns: which are over (no longer in the running set: ended
# elsewhere), which were asked to stop, and which it let go of while still running (its job
# returned without a finish that landed: its caller ends them as a reaper would, and should that
# fail, any reaper does: their running-set score becomes minus now). Every turn let go of leaves
# its set; the over ones too. A worker with no turn costs 4 commands a call (as `INFO
# commandstats` counts them), one with some 9. Its first write is a PEXPIRE, which Redis runs at
# its maxmemory, and so lets the rest of the script through (it checks a script's first write
# alone): a full Redis must not make a live worker look dead, or reapers would end its turns
# `worker_lost`.
KEEP = f"""
{_SREM_ALL}
if redis.call('PEXPIRE', KEYS[1], ARGV[2]) == 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
redis.call('ZADD', KEYS[5], ARGV[4], ARGV[1])
if ARGV[5] ~= '' then redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', ARGV[5]) end
if redis.call('EXISTS', KEYS[2]) == 0 then return {{{{}}, {{}}, {{}}}} end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', ARGV[4])
local stray = {{}}
if #ARGV > 5 then
  local released = {{unpack(ARGV, 6)}}
  local scores = redis.call('ZMSCORE', KEYS[3], unpack(released))
  for i = 1, #released do
    if scores[i] then
      stray[#stray + 1] = released[i]
      redis.call('ZADD', KEYS[3], 'XX', -tonumber(ARGV[4]), released[i])
    end
  end
  srem_all(KEYS[2], released)
end
local over = redis.call('ZDIFF', 2, KEYS[2], KEYS[3])
srem_all(KEYS[2], over)
local cancelled = redis.call('ZINTER', 2, KEYS[2], KEYS[4])
redis.call('EXPIRE', KEYS[2], ARGV[3])
return {{over, cancelled, stray}}
"""

# KEYS: the running set, the worker's turns. ARGV: turn id, when it is overdue (epoch s),
# the turns' ttl s. What claiming a turn adds on the queue role, in one command: the turn in
# the running set, where it is overdue then whatever its worker, and among the worker's
# turns, which a reaper ends should the worker die from now on.
_CLAIMING = """
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[3])
"""

# KEYS: the worker's alive key, its turns, the workers. ARGV: worker id. Drops a worker
# from the workers once it is dead and none of its turns is left to end. Returns 1 if so.
_FORGET_WORKER = """
if redis.call('EXISTS', KEYS[1]) == 1 or redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('ZREM', KEYS[3], ARGV[1])
return 1
"""


@dataclass(frozen=True, slots=True)
class Kept:
    """What renewing a worker's liveness found among its turns."""

    over: list[str]  # ended by another process, or gone with the running set
    cancelled: list[str]  # somebody asked them to stop
    stray: list[str]  # let go of by the worker while still running: end them


def _ids(raw: Sequence[bytes | str]) -> list[str]:
    return [item.decode() if isinstance(item, bytes) else str(item) for item in raw]


class Liveness:
    """The workers' liveness on the queue role `queue`."""

    def __init__(self, queue: Redis) -> None:
        self.queue = queue
        self._keep = queue.register_script(KEEP)
        self._forget = queue.register_script(_FORGET_WORKER)

    async def keep(
        self,
        worker_id: str,
        ttl_s: float,
        released: Sequence[str] = (),
        *,
        stale_s: float | None = None,
    ) -> Kept:
        """Renew `worker_id`'s liveness for `ttl_s`, letting go of `released` (at most
        `MEMBERS_PER_COMMAND`), and drop workers silent for `stale_s` (if given) from
        `keys.WORKERS`."""
        now = time.time()
        reply = await self._keep(
            keys=[
                keys.worker_alive(worker_id),
                keys.worker_turns(worker_id),
                keys.RUNNING_TURNS,
                keys.CANCELS,
                keys.WORKERS,
            ],
            args=[
                worker_id,
                int(ttl_s * 1000),
                TURNS_TTL_S,
                now,
                "" if stale_s is None else now - stale_s,
                *released,
            ],
        )
        over, cancelled, stray = reply
        return Kept(_ids(over), _ids(cancelled), _ids(stray))

    @staticmethod
    def claiming(pipe: Pipeline, worker_id: str, turn_id: str, overdue_at: float) -> None:
        """Queue, on a pipeline of the queue role, what claiming a turn adds (`_CLAIMING`):
        the turn in the running set, overdue at `overdue_at` (epoch s) whatever its worker,
        and among the worker's, which a reaper ends should the worker die from now on."""
        claim_keys = [keys.RUNNING_TURNS, keys.worker_turns(worker_id)]
        in_pipeline(pipe, _CLAIMING, claim_keys, [turn_id, repr(overdue_at), TURNS_TTL_S])

    async def let_go(self, worker_id: str, turn_ids: Sequence[str]) -> None:
        """Take turns out of the worker's: a claim refused, or a dead worker's turn ended."""
        if turn_ids:
            await self.queue.srem(keys.worker_turns(worker_id), *turn_ids)  # type: ignore[misc]

    async def lapsed(self) -> list[str]:
        """The workers in `keys.WORKERS` whose liveness lapsed."""
        workers = _ids(await self.queue.zrange(keys.WORKERS, 0, -1))
        if not workers:
            return []
        async with self.queue.pipeline(transaction=False) as pipe:
            for worker_id in workers:
                pipe.exists(keys.worker_alive(worker_id))
            alive = await pipe.execute()
        return [w for w, live in zip(workers, alive, strict=True) if not live]

    async def alive(self, worker_ids: Sequence[str]) -> set[str]:
        """Which of `worker_ids` are alive."""
        unique = sorted(set(worker_ids))
        if not unique:
            return set()
        async with self.queue.pipeline(transaction=False) as pipe:
            for worker_id in unique:
                pipe.exists(keys.worker_alive(worker_id))
            replies = await pipe.execute()
        return {w for w, live in zip(unique, replies, strict=True) if live}

    async def turns_of(self, worker_id: str, count: int) -> list[str]:
        """Up to `count` of the worker's turns."""
        raw = await self.queue.srandmember(keys.worker_turns(worker_id), count)  # type: ignore[misc]
        return _ids(raw or [])

    async def forget(self, worker_id: str) -> bool:
        """Drop a dead worker none of whose turns is left from `keys.WORKERS`; whether it
        went."""
        reply = await self._forget(
            keys=[keys.worker_alive(worker_id), keys.worker_turns(worker_id), keys.WORKERS],
            args=[worker_id],
        )
        return bool(reply)

    async def withdraw(self, worker_id: str) -> None:
        """A worker stopping: it is dead from now on. Turns it still holds (their endings
        failed) are a reaper's; with none, it leaves `keys.WORKERS` at once."""
        await self.queue.delete(keys.worker_alive(worker_id))
        await self.forget(worker_id)
