"""Ending the turns that cannot end on their own: those of a worker that died or let go of
them, those overdue (`reap_lapsed`), and those a reader finds stuck (`settle`).

Any process may reap: the turn ends once, whoever gets there first (shared/lifecycle.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Container, Sequence

from arq.constants import in_progress_key_prefix, job_key_prefix
from redis.exceptions import ResponseError

from shared import keys
from shared.connection import reply_text
from shared.events import TurnStatus
from shared.lifecycle import RULES, Cause, Finished, stuck
from shared.turns.moves import Moving

logger = logging.getLogger("bernard.turns")

# What a reaper's log line says of a turn it ended, by cause.
_REAPED = {Cause.LEASE_LAPSED: "its worker was lost", Cause.LET_GO: "its worker let go of it"}


class Reaping(Moving):
    """Ends lost, let go, overdue and stuck turns; `settle` is the read that writes."""

    async def settle(self, turn_id: str) -> TurnStatus | None:
        """The turn's status, None once it is gone; first ends a turn that never can end
        on its own (shared/lifecycle.py, `stuck`), which is what makes it a write.

        Those are a turn `running` whose worker's liveness lapsed (`LEASE_LAPSED`, as a
        reaper would) and one still `queued` past `STRANDED_AFTER_S` with no job on the queue
        (`STRANDED`: its creation stopped between its halves, or a failover of the queue
        lost the job). Called by whoever waits on a quiet turn, so no turn waits forever on
        a worker that cannot come.
        """
        (status,) = await self.settle_many([turn_id])
        return status

    async def settle_many(self, turn_ids: Sequence[str]) -> list[TurnStatus | None]:
        """`settle` each turn, in order, with what decides each one's status read in one
        round trip (only the turns it ends, or may end, take more)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for turn_id in turn_ids:
                pipe.hmget(keys.turn(turn_id), ["status", "owner", "created_at", "worker"])
            stored = await pipe.execute()
        # The workers of the running ones: whether each lives is on the queue role.
        workers = [
            reply_text(values[3]) if values[0] == b"running" and values[3] else ""
            for values in stored
        ]
        alive = await self.liveness.alive([w for w in workers if w])
        return [
            await self._settle_one(turn_id, values[:3], worker in alive)
            for turn_id, values, worker in zip(turn_ids, stored, workers, strict=True)
        ]

    async def _settle_one(
        self, turn_id: str, stored: list[bytes | None], leased: bool
    ) -> TurnStatus | None:
        """`settle` one turn, from its stored status, owner and creation time and whether a
        live worker holds it."""
        raw_status, raw_owner, created_at = stored
        if raw_status is None:
            return None
        status, owner = TurnStatus(raw_status.decode()), raw_owner.decode() if raw_owner else ""
        now = time.time()
        cause = stuck(status, leased=leased, created_at=float(created_at or 0), now=now)
        if cause is Cause.STRANDED:
            async with self.queue.pipeline(transaction=False) as pipe:
                pipe.exists(job_key_prefix + turn_id)
                pipe.exists(in_progress_key_prefix + turn_id)
                job, taken = await pipe.execute()
            if job or taken:  # a worker will take it yet
                cause = None
        if cause is not None and await self.end(turn_id, owner, cause) is Finished.ENDED:
            return RULES[cause].status
        return status

    async def reap_lapsed(self, *, skip: Container[str] = (), limit: int = 50) -> list[str]:
        """End the turns of workers whose liveness lapsed (they died: `LEASE_LAPSED`), then
        running turns their live worker let go of (`LET_GO`: a negative score in the
        running set, shared/liveness.py), then those overdue whatever their worker (past
        the deadline their claim set: a claim or a finish cut off between its halves);
        return the ids of those this call ended, at most `limit` looked at.

        Any process may call this: the turn ends once, whoever gets there first. What it
        costs does not grow with the turns running: one look at each worker's liveness and
        one range of the running set; only a dead worker's turns are read one by one.
        """
        lost: list[str] = []
        for worker_id in await self.liveness.lapsed():
            turn_ids = [t for t in await self.liveness.turns_of(worker_id, limit) if t not in skip]
            if not turn_ids:
                await self.liveness.forget(worker_id)
                continue
            lost += await self.end_lapsed(turn_ids, worker_id=worker_id)
            limit -= len(turn_ids)
            if limit <= 0:
                return lost
        due = await self.queue.zrangebyscore(
            keys.RUNNING_TURNS, "-inf", time.time(), start=0, num=limit, withscores=True
        )
        let_go: list[str] = []
        overdue: list[str] = []
        for raw, score in due:
            turn_id = reply_text(raw)
            if turn_id not in skip:
                (let_go if score < 0 else overdue).append(turn_id)
        lost += await self.end_lapsed(let_go, cause=Cause.LET_GO)
        return lost + await self.end_lapsed(overdue)

    async def end_lapsed(
        self,
        turn_ids: Sequence[str],
        *,
        worker_id: str | None = None,
        cause: Cause = Cause.LEASE_LAPSED,
    ) -> list[str]:
        """End `turns_ids` for `cause` (`LEASE_LAPSED` or `LET_GO`), as a reaper does (those
        another process ended are left as they ended, and released), and let the worker
        `worker_id` go of them; log and return the ids of those this call ended."""
        if not turn_ids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for turn_id in turn_ids:
                pipe.hget(keys.turn(turn_id), "owner")
            owners = await pipe.execute()
        lost, handled = [], []
        for turn_id, owner in zip(turn_ids, owners, strict=True):
            # No record: the finish script only drops what is left of it.
            name = owner.decode() if isinstance(owner, bytes) else (owner or "")
            try:
                finished = await self.end(turn_id, name, cause)
            except ResponseError as exc:
                # Its keys are not what a turn's are (a stream clobbered by another write): no
                # script can end it. Left on the running set, it would come first in every
                # sweep and stop every process's reaping here, so it leaves; its record
                # expires with its TTL.
                logger.error("turn %s cannot be ended (%s); no longer reaping it", turn_id, exc)
                await self.queue.zrem(keys.RUNNING_TURNS, turn_id)
                handled.append(turn_id)
                continue
            if finished is not Finished.REFUSED:
                handled.append(turn_id)
            if finished is Finished.ENDED:
                lost.append(turn_id)
                ending = RULES[cause]
                logger.warning(
                    "turn %s failed: %s",
                    turn_id,
                    _REAPED[cause],
                    extra={"turn_id": turn_id, "status": ending.status, "error": ending.code},
                )
        if worker_id is not None:
            await self.liveness.let_go(worker_id, handled)
        return lost
