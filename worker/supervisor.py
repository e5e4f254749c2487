"""Runs turns on this worker process and guarantees each one ends.

For every turn it claims, the supervisor writes the turn's events to its stream, counts it
among this worker's (whose liveness `worker.liveness` renews), and aborts it the moment a
cancel arrives. It reaps the turns of workers that stopped renewing, so an attached client
always gets a terminal frame, and publishes the tools the worker offers. What a turn's task
raised, or why it was stopped, is named as a shared/lifecycle.py `Cause` here; how the turn
then ends is that module's `RULES`. A cancelled task writes its ending and returns, so arq
never sees a `CancelledError` (it would run the job again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import httpx
from langchain_core.tools import BaseTool
from redis.asyncio import Redis
from redis.exceptions import OutOfMemoryError, RedisError

from shared import keys
from shared.backends import backend_of
from shared.cancel import Stop
from shared.connection import REDIS_ERRORS, STORE_LOST
from shared.endings import completed
from shared.errors import ErrorCode
from shared.events import Event, MessageStored, Trace, TurnStatus
from shared.lifecycle import RULES, After, Cause, Claimed, Finished
from shared.liveness import Liveness
from shared.logs import TURN_FIELDS
from shared.records.conversation import ConversationFullError
from shared.records.keeper import RecordKeeper
from shared.records.writes import Recorder
from shared.redis_pool import backoff_s
from shared.settings import Settings
from shared.streams import StreamBatcher, StreamWriter, TurnOverError
from shared.turn_record import TurnRecord
from shared.turns import TurnStore
from shared.turns.line import InLine
from worker.calls import Item, stream_events
from worker.context import ConversationGoneError, TurnContext
from worker.liveness import LivenessKeeper
from worker.llm import Llm, LlmError
from worker.telemetry import TurnTelemetry
from worker.tools import catalog
from worker.tools.runtime import ToolRuntime
from worker.tools.settings import ToolSettings
from worker.tools.toolbox import Toolbox
from worker.turn import Sink

logger = logging.getLogger("bernard.worker")
# An error message a client reads is cut to this: it may quote what the client sent.
_MESSAGE_CHARS = 500
# How long a turn's ending that Redis cannot take (its store lost: `STORE_LOST`) is tried
# again: longer than a failover takes (a Cluster's node timeout and election, Sentinels'
# down-after and promotion). Past it, a reaper ends the turn once Redis is back.
ENDING_RETRY_S = 120.0
# How often a turn that waits in its conversation's line looks again, at first and at most.
_LINE_POLL_S, _LINE_POLL_MAX_S = 0.05, 1.0

# The turn runner (worker/turn.py `run_to_sinks`): the context, the sinks of its items, and the
# recorder it alone may write the turn's records with.
TurnRunner = Callable[[TurnContext, Sequence[Sink], Recorder | None], Awaitable[None]]

# What each exception a turn's task ends with means, the first that matches (an upstream
# failure and a cancellation are told apart in `_cause_of`). Only `Exception`s: anything
# else (`KeyboardInterrupt`, `SystemExit`) stops the process, and a reaper ends the turn.
_RAISED: tuple[tuple[type[Exception] | tuple[type[Exception], ...], Cause], ...] = (
    # Its stream refused a write: another process ended the turn (a reaper took this
    # worker for dead) or its record is gone.
    (TurnOverError, Cause.OVER),
    (TimeoutError, Cause.TIMED_OUT),  # `turn_timeout_s`
    # Deleted between the turn's creation and its start: it does not run, and is forgotten
    # as the deletion forgot the conversation's other turns.
    (ConversationGoneError, Cause.CONVERSATION_GONE),
    # The request's messages were refused whole (shared/budgets.py): nothing stored.
    (ConversationFullError, Cause.CONVERSATION_FULL),
    # Redis at its maxmemory refused one of its writes (its ending still lands: FINISH).
    (OutOfMemoryError, Cause.STORE_FULL),
    # Its store was lost under it (a write gave up on reaching the primary holding the
    # turn's keys): what it wrote last may be gone with that primary.
    (STORE_LOST, Cause.FAILED_OVER),
    (Exception, Cause.CRASHED),
)


@dataclass(slots=True)
class _Running:
    """A turn running here: its task, the failovers of its primary when it was claimed (a
    change means its stream may have lost writes), why it was told to stop (None: it was
    not), and whether it is writing its ending (then nothing stops it any more); for a
    cancel, the read of what it asked for (shared/cancel.py `Stop`), begun as it came."""

    task: asyncio.Task[str]
    failovers: int
    stop: Cause | None = None
    ending: bool = False
    asked: asyncio.Task[Cause] | None = None


# The cause a turn stopped by its cancel key ends with, by what the key asks for.
_STOPS: dict[Stop, Cause] = {Stop.CANCEL: Cause.CANCELLED, Stop.INTERRUPT: Cause.INTERRUPTED}


class TurnSupervisor:
    """Claims, runs, renews and stops the turns of one worker process."""

    def __init__(
        self,
        redis: Redis,
        settings: Settings,
        *,
        router: Llm,
        responder: Llm,
        run_to_sinks: TurnRunner,
        worker_id: str,
        tool_settings: ToolSettings,
        tools: Sequence[BaseTool] | None = None,
        http: httpx.AsyncClient | None = None,
        queue: Redis | None = None,
    ) -> None:
        self.redis = redis
        # The queue role (shared/keys.py); the same client when one Redis holds both.
        self.queue = queue if queue is not None else redis
        self.settings = settings
        self.router = router
        self.responder = responder
        self.run_to_sinks = run_to_sinks
        self.worker_id = worker_id
        # Each tool source's own settings (worker/tools/settings.py).
        self.tool_settings = tool_settings
        # The tools it offers (worker/tools/toolbox.py): `tools` replaces the built-in ones.
        self.toolbox = Toolbox(settings, tools, tool_settings)
        # The HTTP client the tools share (worker/tools/runtime.py); the worker owns it.
        self.http = http
        self.streams = StreamBatcher(redis, maxlen=settings.stream_maxlen)
        self.store = TurnStore(
            redis,
            retention_s=settings.turn_retention_s,
            stream_maxlen=settings.stream_maxlen,
            queue=self.queue,
            queue_name=settings.queue_name,
        )
        self.backend = backend_of(redis)
        self._running: dict[str, _Running] = {}
        self._background: list[asyncio.Task[None]] = []
        self._tools_published = 0.0  # `time.monotonic()` of the last publish

    async def start(self) -> None:
        self.toolbox.start()  # MCP servers connect in the background
        await self._publish_tools()
        self.liveness = LivenessKeeper(
            self.settings, self.worker_id, self.cancel_local, asyncio.get_running_loop()
        )
        await self.liveness.keep_once(Liveness(self.queue))
        self.liveness.start()
        self._background = [
            asyncio.create_task(self._listen_for_cancels()),
            asyncio.create_task(self._beat()),
            asyncio.create_task(self._reap()),
            asyncio.create_task(self._follow_tools()),
        ]

    async def stop(self) -> None:
        await asyncio.to_thread(self.liveness.stop)
        for task in self._background:
            task.cancel()
        for task in self._background:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with contextlib.suppress(RedisError):
            await Liveness(self.queue).withdraw(self.worker_id)
            await catalog.withdraw_mcp_health(self.queue, self.worker_id)
        await self.streams.aclose()  # no Redis I/O: the connection goes back to the pool
        await self.toolbox.stop()

    @property
    def _overdue_s(self) -> float:
        """How long after its claim a turn still in the running set is overdue whatever its
        worker: past its timeout, with a minute to write its ending (shared/turns/reaping.py,
        `reap_lapsed`)."""
        return self.settings.turn_timeout_s + 60.0

    # -- running one turn ----------------------------------------------------------------

    async def run(self, turn_id: str) -> str:
        """The arq job: run the turn if it is still queued; return its final status (a plain
        string, as arq stores it: "lost" for a turn over for this worker)."""
        try:
            claim = await self.store.claim(turn_id, self.worker_id, self._overdue_s)
        except OutOfMemoryError:
            return await self.refuse_full(turn_id)
        if claim.record is None:
            # A re-delivered job (after a crash or shutdown) must never run a turn twice.
            logger.info(
                "turn %s not run: it is %s",
                turn_id,
                claim.outcome,
                extra={"turn_id": turn_id, "status": claim.outcome},
            )
            return str(claim.outcome)
        telemetry = TurnTelemetry.claimed(claim.record, self.settings, self.worker_id)
        if claim.cancel_requested:
            return await self._end(telemetry, claim.record, None, _STOPS[claim.stop])
        task = asyncio.create_task(self._execute(claim.record, telemetry))
        self._running[turn_id] = _Running(task, self.backend.failovers(turn_id))
        self.liveness.add(turn_id)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            # arq cancelled the job (shutdown or job timeout): let the turn end itself first.
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            raise
        finally:
            self._running.pop(turn_id, None)
            self.liveness.discard(turn_id)
            telemetry.close()

    async def refuse_full(self, turn_id: str) -> str:
        """End a turn no worker took yet because Redis, at its maxmemory, refused to start
        it (`STORE_FULL_QUEUED`: unless another worker has it); return its status."""
        record = await self.store.get(turn_id)
        if record is None:
            return str(Claimed.MISSING)
        rule = RULES[Cause.STORE_FULL_QUEUED]
        ended = await self.store.end(turn_id, record.owner, Cause.STORE_FULL_QUEUED)
        if ended is not Finished.ENDED:
            return str(record.status)
        logger.warning(
            "turn %s refused: Redis is full",
            turn_id,
            extra={"turn_id": turn_id, "status": rule.status, "error": rule.code},
        )
        return str(rule.status)

    def cancel_local(self, turn_id: str, cause: Cause = Cause.CANCELLED) -> None:
        """Abort the turn if it runs here, for `cause` (`CANCELLED`: asked to; `OVER`: over
        for this worker; `FAILED_OVER`); the in-flight LLM call is cancelled at once. The
        first cause given is the one the turn ends with."""
        running = self._running.get(turn_id)
        if running is not None and running.stop is None and not running.ending:
            running.stop = cause
            if cause is Cause.CANCELLED:
                # What the cancel asked for is read while the turn stops, not after.
                running.asked = asyncio.create_task(self._asked(turn_id))
            running.task.cancel()

    async def _asked(self, turn_id: str) -> Cause:
        """The cause a cancel of the turn asks for, by its cancel key (a cancel, if Redis
        cannot say)."""
        try:
            value = await self.redis.get(keys.cancel(turn_id))
        except REDIS_ERRORS:
            value = None
        return _STOPS[Stop.of(value)]

    async def _stop_cause(self, turn_id: str) -> Cause | None:
        """Why the turn was told to stop (None: it was not), once it has stopped."""
        running = self._running.get(turn_id)
        if running is None:
            return None
        if running.asked is not None:
            asked, running.asked = running.asked, None
            running.stop = await asked
        return running.stop

    async def _execute(self, record: TurnRecord, telemetry: TurnTelemetry) -> str:
        turn_id, owner = record.id, record.owner
        # This task runs the turn alone: every line logged in it carries the turn's fields.
        TURN_FIELDS.set(telemetry.fields)
        writer = self.streams.writer(turn_id)
        ctx: TurnContext | None = None
        try:
            # Inside the `try`: a request the API let through that still cannot be made
            # into a turn ends the turn `invalid_turn`, never as a lost worker.
            try:
                ctx = self._context(record, telemetry)
            except (ValueError, TypeError, KeyError) as exc:
                # The exception's text quotes the request: the `turn ended` line holds it
                # only with BERNARD_LOG_PROMPTS=1.
                message = f"the request could not be run as a turn: {exc}"[:_MESSAGE_CHARS]
                return await self._end(telemetry, record, writer, Cause.INVALID_REQUEST, message)
            records = RecordKeeper(
                self.redis,
                owner,
                retention_s=self.settings.conversation_retention_s,
                queue=self.queue,
            )
            sinks: list[Sink] = [_Stream(writer, record), telemetry]
            async with asyncio.timeout(self.settings.turn_timeout_s):
                if record.request.agent.follows is not None and record.conversation_id:
                    await self._wait_in_line(record, record.conversation_id)
                await self.run_to_sinks(ctx, sinks, records.as_recorder())
                await writer.flush()
        except (asyncio.CancelledError, Exception) as exc:
            running = self._running.get(turn_id)
            if running is not None:
                running.ending = True
            cause = _cause_of(exc, await self._stop_cause(turn_id))
            if cause is Cause.CRASHED:
                logger.exception("turn %s failed", turn_id)
            usage = ctx.usage if ctx is not None else None
            status = await self._end(
                telemetry, record, writer, cause, _message_of(exc), usage=usage
            )
            if RULES[cause].after is After.RAISE:
                raise
            return status
        assert ctx is not None
        running = self._running.get(turn_id)
        if running is not None:
            running.ending = True
            if self.backend.failovers(turn_id) != running.failovers:
                # Its writes landed, but maybe not all on the primary that holds them now.
                return await self._end(
                    telemetry, record, writer, Cause.FAILED_OVER, usage=ctx.usage
                )
        done = completed(ctx.finish_reason, ctx.usage)
        if ctx.paused:
            done.status = TurnStatus.AWAITING_CONFIRMATION
        result = ctx.result()
        await self._landed(
            turn_id, lambda: self.store.finish(record.id, record.owner, done, result=result)
        )
        telemetry.ended(done.status)
        return str(done.status)

    async def _end(
        self,
        telemetry: TurnTelemetry,
        record: TurnRecord,
        writer: StreamWriter | None,
        cause: Cause,
        message: str | None = None,
        *,
        usage: dict[str, int] | None = None,
    ) -> str:
        """End the turn for `cause`, as shared/lifecycle.py's `RULES` says, after what it
        yielded so far (`writer`), and log how; return what the job reports: the status it
        ended with, or "lost" for a turn over for this worker (then its ending is the one a
        reaper would write: nothing if it already ended, the orphaned stream dropped if its
        record is gone, the ending if nobody has written one yet)."""
        rule = RULES[cause]
        if writer is not None:
            if rule.after is After.ABANDON:
                writer.discard()
            # What the turn yielded before it ended lands first (a write already in flight
            # when it is abandoned); a Redis failure, or a turn ended elsewhere, must not
            # mask why it ended.
            await _flush_quietly(writer)
        await self._landed(
            record.id,
            lambda: self.store.end(record.id, record.owner, cause, message, usage=usage),
        )
        status = "lost" if rule.after is After.ABANDON else str(rule.status)
        telemetry.ended(status, rule.code, message)
        if rule.after is After.FORGET:
            await self.store.forget(record.owner, [record.id])
        return status

    async def _landed(self, turn_id: str, write: Callable[[], Awaitable[Finished]]) -> None:
        """Run `write`, the turn's ending, until Redis takes it: again after each
        `STORE_LOST`, for `ENDING_RETRY_S` at most (then it raises, and the turn, let go of,
        is a reaper's)."""
        deadline = time.monotonic() + ENDING_RETRY_S
        failures = 0
        while True:
            try:
                await write()
                return
            except STORE_LOST as exc:
                failures += 1
                if time.monotonic() >= deadline:
                    logger.error("the ending of turn %s could not be written (%s)", turn_id, exc)
                    raise
                logger.warning(
                    "the ending of turn %s could not be written yet (%s); retrying", turn_id, exc
                )
                await asyncio.sleep(backoff_s(failures))

    async def _wait_in_line(self, record: TurnRecord, conversation_id: str) -> None:
        """A turn that joined its conversation's line runs once it holds the conversation.
        Its job is made due as the line reaches it, so it holds it already, unless whoever
        ended the turn before it did not live to move the line on: then it moves it here,
        or waits for the turn it is behind (which must end: a reaper ends it at the
        latest). A turn out of the line goes on, and finds its conversation gone."""
        delay = _LINE_POLL_S
        while True:
            place = await self.store.take_turn(record.owner, conversation_id, record.id)
            if place is not InLine.WAITS:
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, _LINE_POLL_MAX_S)

    def _context(self, record: TurnRecord, telemetry: TurnTelemetry) -> TurnContext:
        ctx = TurnContext.for_request(
            record.id,
            record.request.agent,
            self.settings,
            self.router,
            self.responder,
            tools=self.toolbox.tools(),
            conversation_id=record.conversation_id,
            archivist=RecordKeeper(
                self.redis, record.owner, retention_s=self.settings.conversation_retention_s
            ).as_archivist(),
        )
        ctx.runtime = ToolRuntime(
            owner=record.owner,
            redis=self.redis,
            queue=self.queue,
            settings=self.settings,
            http=self.http,
            conversation_id=record.conversation_id,
            tool_settings=self.tool_settings,
        )
        ctx.stop_cause = lambda: self._stop_cause(record.id)
        telemetry.usage = ctx.usage
        return ctx

    # -- background loops ----------------------------------------------------------------

    async def _listen_for_cancels(self) -> None:
        while True:
            try:
                async with self.queue.pubsub() as pubsub:
                    await pubsub.subscribe(keys.CANCEL_CHANNEL)
                    async for message in pubsub.listen():
                        if message["type"] == "message":
                            self.cancel_local(message["data"].decode())
            except (RedisError, OSError) as exc:
                logger.warning("cancel listener lost Redis (%s); retrying", exc)
                await asyncio.sleep(0.5)

    async def _publish_tools(self) -> None:
        await catalog.publish_tools(
            self.queue, self.toolbox.tools(), self.settings, self.tool_settings
        )
        health = self.toolbox.mcp_health()
        if health is not None:
            await catalog.publish_mcp_health(self.queue, self.worker_id, health)
        self._tools_published = time.monotonic()

    async def _follow_tools(self) -> None:
        """Publish the tools again each time they change (an MCP server connected, went
        down, or changed its tools); a failed publish is tried again a second later."""
        while True:
            await self.toolbox.changed()
            while True:
                try:
                    await self._publish_tools()
                    break
                except (RedisError, OSError) as exc:
                    logger.warning("publishing the tools failed (%s); retrying", exc)
                    await asyncio.sleep(1.0)

    async def _beat(self) -> None:
        """Tell the liveness thread this loop is alive; end the turns running here whose
        primary failed over; publish the tools again when due."""
        while True:
            await asyncio.sleep(self.settings.lease_renew_s)
            self.liveness.beat()
            if time.monotonic() - self._tools_published >= catalog.REPUBLISH_S:
                try:
                    await self._publish_tools()
                except (RedisError, OSError) as exc:
                    logger.warning("publishing the tools failed (%s); retrying", exc)
            failed_over = [
                turn_id
                for turn_id, running in self._running.items()
                if not running.ending and self.backend.failovers(turn_id) != running.failovers
            ]
            if failed_over:
                logger.warning(
                    "Redis failed over to a new primary; ending the %d turns it held",
                    len(failed_over),
                )
                for turn_id in failed_over:
                    self.cancel_local(turn_id, Cause.FAILED_OVER)

    async def _reap(self) -> None:
        """End turns whose worker died or let go of them, every renewal period; apart from
        `_beat`, so that a data role slow to answer (failing over) never holds up the beat
        (the liveness thread would take this loop for stuck)."""
        while True:
            await asyncio.sleep(self.settings.lease_renew_s)
            try:
                await self.store.reap_lapsed(skip=self._running)
            except REDIS_ERRORS as exc:
                logger.warning("reaping failed (%s); retrying", exc)


class _Stream:
    """The turn's stream as a sink of its items: what of each its client may read."""

    def __init__(self, writer: StreamWriter, record: TurnRecord) -> None:
        self.writer = writer
        self.record = record

    async def take(self, item: Item) -> None:
        for event in stream_events(item):
            if _visible(event, self.record):
                await self.writer.write(event)

    async def fail(self, error: BaseException) -> None:
        """Nothing: how the turn ends is written once it has stopped (`_end`)."""


def _visible(event: Event, record: TurnRecord) -> bool:
    """Whether the event goes into the stream, which holds what its client can read:
    model-call traces (the whole prompt, each call) only when the client asked to trace the
    turn, stored rows only when its encoding shows them (shared/requests.py)."""
    if isinstance(event, Trace):
        return record.request.agent.trace
    if isinstance(event, MessageStored):
        return record.request.agent.rows
    return True


def _cause_of(exc: BaseException, stop: Cause | None) -> Cause:
    """What ended a turn whose task raised `exc`, having been told to stop for `stop`."""
    if isinstance(exc, asyncio.CancelledError):
        return stop or Cause.SHUT_DOWN  # arq cancelled the job, nobody here did
    if isinstance(exc, LlmError):
        if exc.code == ErrorCode.UPSTREAM_TIMEOUT:
            return Cause.UPSTREAM_TIMED_OUT
        return Cause.UPSTREAM_FAILED
    return next(cause for kind, cause in _RAISED if isinstance(exc, kind))


def _message_of(exc: BaseException) -> str | None:
    """What a client reads of `exc` instead of its ending's own words: an upstream
    failure's account (worker/llm.py), a full conversation's cap; None for the rest."""
    if isinstance(exc, LlmError):
        return exc.message
    if isinstance(exc, ConversationFullError):
        return str(exc)
    return None


async def _flush_quietly(writer: StreamWriter) -> None:
    """Push out what the turn yielded before it ended; a Redis failure, or a turn already
    ended elsewhere, must not mask why."""
    with contextlib.suppress(*REDIS_ERRORS, TurnOverError):
        await writer.flush()
