"""A turn's record coming into being and going: `create` stores it, opens its stream and
queues its job; `never_ran` makes sure one whose creation failed never runs; `forget`
drops the turns of a deleted conversation.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

from redis.exceptions import RedisError

from shared import budgets, keys, scripts
from shared.events import TERMINAL_STATUSES, Start, encode
from shared.lifecycle import CREATE, FORGET, FORGET_GRACE_S, SEALED_ID, Cause
from shared.queue import enqueue
from shared.scripts import in_pipeline
from shared.turn_record import TurnRecord
from shared.turns.moves import Moving
from shared.webhooks import TARGET_FIELD, Target


class Creating(Moving):
    """Creates turns, and forgets them."""

    async def create(
        self,
        record: TurnRecord,
        *,
        ttl_s: int,
        queue_name: str | None,
        attachment: str | None = None,
        attachment_expiry: float = 0.0,
        defer_s: float = 0.0,
        webhook_subject: str | None = None,
    ) -> str:
        """Store the record and open its stream with a `start` entry (one script), then
        enqueue its job on `queue_name` (None: no job), deferred `defer_s` (a turn waiting
        in its conversation's line: due once the line reaches it, `advance`); return the
        `start` entry's id.

        `attachment` counts a client as watching the turn from the start
        (api/attachments.py), until `attachment_expiry` (epoch seconds). `ttl_s` bounds a
        turn that no worker ever finishes; finishing resets it to retention. The turn also
        enters its owner's index (`recent`), which outlives every turn it lists. Should the
        enqueue fail, the turn is ended `turn_lost` before the error goes on.
        `webhook_subject` is the id a webhook event names the turn by (None: its id).
        """
        stored = record.to_redis()
        counted = int(stored.get("counted", 0))
        fields = [item for pair in stored.items() for item in pair]
        webhook_url = record.request.delivery.webhook_url
        if webhook_url is not None and queue_name is not None:
            # Where its ending finds it (`finish`).
            subject = webhook_subject or record.id
            fields += [TARGET_FIELD, Target(webhook_url, queue_name, subject).stored()]
        lapse_s = max(1, int(attachment_expiry - time.time()) + 1)
        async with self.redis.pipeline(transaction=False) as pipe:
            in_pipeline(
                pipe,
                CREATE,
                [keys.turn(record.id), keys.events(record.id), keys.attached(record.id)],
                [
                    ttl_s,
                    encode(Start()),
                    attachment or "",
                    attachment_expiry,
                    lapse_s,
                    *fields,
                ],
            )
            scripts.index(
                pipe,
                keys.turns(record.owner),
                record.id,
                record.created_at,
                ttl_s=ttl_s + self.retention_s,
                keep=keys.TURN_INDEX_MAX,
            )
            if counted:
                # Until the longest its record can live: `finish` moves it to the end's.
                until = time.time() + ttl_s + self.retention_s
                budgets.keep_turn(pipe, record.owner, record.id, counted, until=until)
            if queue_name is not None and self._one_client:
                enqueue(pipe, queue_name, record.id, record.owner, defer_s)
            start, *_ = await pipe.execute()
        start_id = start.decode() if isinstance(start, bytes) else str(start)
        if queue_name is None or self._one_client:
            return start_id
        try:
            async with self.queue.pipeline(transaction=False) as pipe:
                enqueue(pipe, queue_name, record.id, record.owner, defer_s)
                await pipe.execute()
        except BaseException:
            with contextlib.suppress(RedisError, OSError):
                await self.end(record.id, record.owner, Cause.NOT_CREATED)
            raise
        return start_id

    async def forget(self, owner: str, turn_ids: Sequence[str]) -> None:
        """Forget the owner's turns (their conversation was deleted): every read takes them
        for gone at once, and what their keys held of the conversation goes with it
        (shared/lifecycle.py, FORGET). End a turn that may still run first (`end`): its
        ending is what is left for the clients still reading it."""
        if not turn_ids:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for turn_id in turn_ids:
                in_pipeline(
                    pipe,
                    FORGET,
                    [
                        keys.turn(turn_id),
                        keys.events(turn_id),
                        keys.attached(turn_id),
                        keys.cancel(turn_id),
                    ],
                    [FORGET_GRACE_S, SEALED_ID],
                )
            pipe.zrem(keys.turns(owner), *turn_ids)
            budgets.forget_turns(pipe, owner, turn_ids)
            await pipe.execute()

    async def never_ran(self, turn_id: str, owner: str) -> bool:
        """Make sure a turn whose creation failed never runs: ended `turn_lost` if no worker
        took it yet; whether no worker ever did (its record is gone, or ended unclaimed)."""
        await self.end(turn_id, owner, Cause.NOT_CREATED)
        fields = ["status", "started_at"]
        status, started_at = await self.redis.hmget(keys.turn(turn_id), fields)  # type: ignore[misc]
        return status is None or (status.decode() in TERMINAL_STATUSES and not started_at)
