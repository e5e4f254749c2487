"""A turn's moves between its states: `claim` (`queued` → `running`), `finish` and `end`,
each a data half (shared/lifecycle.py's scripts) and a queue half (its release, its count,
its webhook); and, as a turn of a conversation ends, its line moving on (`advance`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import orjson
from redis.commands.core import AsyncScript
from redis.exceptions import OutOfMemoryError

from shared import budgets, keys
from shared import conversation_state as conversation_machine
from shared.cancel import Stop
from shared.connection import REDIS_ERRORS, reply_text
from shared.conversation_state import Advance
from shared.events import TERMINAL_STATUSES, Done, Event, TurnStatus, encode
from shared.lifecycle import (
    CLAIM,
    FINISH,
    RULES,
    SEALED_ID,
    Cause,
    Claimed,
    Finished,
    Guard,
    Who,
    ending_events_of,
)
from shared.liveness import Liveness
from shared.queue import promote
from shared.results import TurnResult
from shared.scripts import in_pipeline
from shared.turn_record import TurnRecord
from shared.turns.deliveries import ending_of
from shared.turns.roles import TurnRoles
from shared.webhooks import Target, enqueue_delivery

logger = logging.getLogger("bernard.turns")


@dataclass(slots=True)
class TurnClaim:
    """What claiming a turn found: `CLAIMED` with the record, or the status that refused
    (or `MISSING`)."""

    outcome: Claimed | TurnStatus
    record: TurnRecord | None = None
    cancel_requested: bool = False
    # What the cancel asked for, when one was (shared/cancel.py).
    stop: Stop = Stop.CANCEL


def _claimed(reply: bytes) -> Claimed | TurnStatus:
    text = reply.decode()
    return Claimed(text) if text in Claimed.__members__.values() else TurnStatus(text)


# KEYS: the running set, the owner's active turns, the counts of endings. ARGV: turn id,
# then what to count, '' for nothing: its status, its status and error code. The queue half
# of a turn's ending, in one command: released from both sets, counted if this call ended
# it. The releases come first, and are deletions: Redis runs them at its maxmemory, and lets
# the counts through after them when they deleted anything (it checks a script's first write
# alone); else it refuses the first count, and the turn is released all the same.
_RELEASE = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
for i = 2, 3 do
  if ARGV[i] and ARGV[i] ~= '' then redis.call('HINCRBY', KEYS[3], ARGV[i], 1) end
end
"""


def _code_of(done: Done) -> str:
    """The field a failed ending is counted under beside its status ('' for none)."""
    return f"{done.status}:{done.error['code']}" if done.error else ""


def _raise_unless_counts_refused(replies: Sequence[Any], queued: bool) -> None:
    """Raise the first error among the replies of `finish`'s queue half, unless Redis at its
    maxmemory only refused to count the ending (the releases, ZREMs, always run): a full
    Redis loses a count, not the turn's release. `queued`: a delivery was queued too."""
    errors = [reply for reply in replies if isinstance(reply, Exception)]
    if not errors:
        return
    if queued or not all(isinstance(error, OutOfMemoryError) for error in errors):
        raise errors[0]
    logger.warning("turn ending not counted: %s", errors[0])


class Moving(TurnRoles):
    """Claims, finishes and ends turns: the one place that writes a turn's status."""

    @cached_property
    def _finish(self) -> AsyncScript:
        return self.redis.register_script(FINISH)

    async def claim(self, turn_id: str, worker_id: str, overdue_s: float) -> TurnClaim:
        """Move `queued` → `running` under `worker_id`, once the turn is on the reapers'
        lists: among the worker's turns, which are ended should its liveness lapse
        (shared/liveness.py), and in the running set, where it is overdue `overdue_s` from
        now whatever its worker (`reap_lapsed`)."""
        now = time.time()
        claim_keys = [keys.turn(turn_id), keys.cancel(turn_id)]
        claim_args = [worker_id, repr(now)]
        if self._one_client:
            async with self.redis.pipeline(transaction=False) as pipe:
                Liveness.claiming(pipe, worker_id, turn_id, now + overdue_s)
                in_pipeline(pipe, CLAIM, claim_keys, claim_args)
                *_, reply = await pipe.execute()
        else:
            async with self.queue.pipeline(transaction=False) as pipe:
                Liveness.claiming(pipe, worker_id, turn_id, now + overdue_s)
                await pipe.execute()
            async with self.redis.pipeline(transaction=False) as pipe:
                in_pipeline(pipe, CLAIM, claim_keys, claim_args)
                (reply,) = await pipe.execute()
        outcome = _claimed(reply[0])
        if outcome is not Claimed.CLAIMED:
            # A turn that ended while queued (a cancel, say) whose ending process died before
            # queueing its webhook: its job is the one thing left that finds it (FINISH).
            ended = outcome in TERMINAL_STATUSES
            webhook = Target.restored(reply[1]) if ended and len(reply) > 1 else None
            ending = await ending_of(self.redis, turn_id) if webhook is not None else None
            async with self.queue.pipeline(transaction=False) as pipe:
                if outcome is not TurnStatus.RUNNING:  # ended or gone: nothing reaps it
                    pipe.zrem(keys.RUNNING_TURNS, turn_id)
                pipe.srem(keys.worker_turns(worker_id), turn_id)  # another worker's, or none's
                if webhook is not None and ending is not None:
                    enqueue_delivery(pipe, webhook, reply_text(reply[2]), turn_id, *ending)
                await pipe.execute()
            return TurnClaim(outcome)
        fields = reply[2]
        record = TurnRecord.from_redis(dict(zip(fields[::2], fields[1::2], strict=True)))
        asked = reply[1]
        return TurnClaim(outcome, record, cancel_requested=asked is not None, stop=Stop.of(asked))

    async def finish(
        self,
        turn_id: str,
        owner: str,
        done: Done,
        *,
        before: Sequence[Event] = (),
        result: TurnResult | None = None,
        guard: Guard = Guard.ALWAYS,
    ) -> Finished:
        """End the turn: append `before` then `done`, set status, start retention. Once only
        (shared/lifecycle.py, FINISH).

        `guard` `QUEUED` leaves alone a turn that a worker has taken. Then, unless the guard
        refused, release it on the queue (the running set, the owner's active turns) and, if
        this call ended it, count how it ended.
        """
        payloads = [encode(event) for event in [*before, done]]
        now = time.time()
        finish_keys = [keys.turn(turn_id), keys.events(turn_id), keys.attached(turn_id)]
        finish_args = [
            done.status,
            repr(now),
            orjson.dumps(done.error) if done.error else "",
            orjson.dumps(result) if result is not None else "",
            self.retention_s,
            self.stream_maxlen,
            guard,
            SEALED_ID,
            *payloads,
        ]
        # Its `done` entry, and what wakes the stream's readers.
        reply = await self.backend.run_and_wake(self._finish, finish_keys, finish_args, turn_id)
        # `ended` comes with the turn's webhook target when it has one, `over` when no
        # delivery job took it yet; `ended` with the bytes its owner's ledger counts; both
        # with its conversation, when it has one.
        listed = isinstance(reply, list)
        webhook = Target.restored(reply[1]) if listed and reply[1] else None
        counted = listed and len(reply) > 2 and reply[2] is not None
        conversation = reply_text(reply[3]) if listed and len(reply) > 3 and reply[3] else None
        finished = Finished(reply_text(reply[0] if listed else reply))
        if conversation is not None and finished in (Finished.ENDED, Finished.OVER):
            # Before the queue half: should this process die first, the turn stays on the
            # reapers' lists, and their ending ("over") moves the line on.
            await self._advance_quietly(owner, conversation, turn_id)
        ending: tuple[Done, float] | None = None
        if finished is Finished.OVER and webhook is not None:
            # The call that ended it may have died before its queue half (or be about to run
            # it): queued again, under the same job id, so at most one waits on the queue.
            ending = await ending_of(self.redis, turn_id)
        if counted and not self._one_client:
            # The record now goes with the retention, and its count with it (on the data
            # role: with one Redis, beside the release below).
            async with self.redis.pipeline(transaction=False) as pipe:
                budgets.kept_until(pipe, owner, turn_id, now + self.retention_s)
                await pipe.execute()
        if finished is not Finished.REFUSED:
            async with self.queue.pipeline(transaction=False) as pipe:
                if counted and self._one_client:
                    budgets.kept_until(pipe, owner, turn_id, now + self.retention_s)
                ended = finished is Finished.ENDED
                # How it ended is counted once, by the call that ended it.
                counts = [done.status, _code_of(done)] if ended else []
                release_keys = [keys.RUNNING_TURNS, keys.active_turns(owner), keys.METRICS]
                in_pipeline(pipe, _RELEASE, release_keys, [turn_id, *counts])
                if ended:
                    if webhook is not None:
                        # The call that ended the turn queues its delivery; should it die
                        # first, the next call that finds the turn ended queues it (above).
                        enqueue_delivery(pipe, webhook, owner, turn_id, done, now)
                elif webhook is not None and ending is not None:
                    enqueue_delivery(pipe, webhook, owner, turn_id, *ending)
                try:
                    replies = await pipe.execute(raise_on_error=False)
                    _raise_unless_counts_refused(replies, webhook is not None)
                except BaseException:
                    if webhook is not None:
                        # Left pending in the record: the reaper's ending queues it.
                        logger.error("the webhook of turn %s was not queued yet", turn_id)
                    raise
        return finished

    async def _advance_quietly(self, owner: str, conversation_id: str, ended: str) -> None:
        """`advance`; a Redis failure is logged, not raised: the turn has ended whatever
        its line does, and the waiting turn's deferred job finds the line as it was."""
        try:
            await self.advance(owner, conversation_id, ended)
        except REDIS_ERRORS as exc:
            logger.warning(
                "conversation %s: the turn after %s was not started (%s)",
                conversation_id,
                ended,
                exc,
            )

    async def advance(self, owner: str, conversation_id: str, ended: str) -> Advance:
        """`ended` (a turn of the owner's conversation that has ended, or "" for no active
        turn) leaves the conversation's line; if it held the conversation, the first turn
        in line holds it now, and its job is made due (shared/conversation_state.py,
        `ADVANCE`)."""
        advanced = await conversation_machine.advance(self.redis, owner, conversation_id, ended)
        if advanced.holder is not None:
            await self.promote(advanced.holder)
        return advanced

    async def promote(self, turn_id: str) -> None:
        """Make the deferred job of `turn_id` due now (shared/queue.py `promote`)."""
        if self.queue_name is None:
            return
        async with self.queue.pipeline(transaction=False) as pipe:
            promote(pipe, self.queue_name, turn_id)
            await pipe.execute()

    async def end(
        self,
        turn_id: str,
        owner: str,
        cause: Cause,
        message: str | None = None,
        *,
        usage: dict[str, int] | None = None,
    ) -> Finished:
        """End the turn short of completing, as shared/lifecycle.py's `RULES[cause]` says
        (its code, under its guard), unless it already ended; `message` replaces the code's
        words, and `usage` goes into a `done` that carries it."""
        rule = RULES[cause]
        if rule.who is Who.READER:
            raise ValueError(f"{cause} is a reader's ending: nothing is written for it")
        *before, done = ending_events_of(cause, message, usage=usage)
        assert isinstance(done, Done)
        return await self.finish(turn_id, owner, done, before=before, guard=rule.guard)
