"""Runs turns on this worker process and guarantees each one ends.

For every turn it claims, the supervisor writes the turn's events to its stream, keeps a
lease on it (renewed from a thread of its own, `worker.leases`), and aborts it the moment
a cancel arrives (published on a channel, with the cancel key checked at every lease
renewal as a fallback). Once a second it also looks for turns whose worker stopped
renewing (a SIGKILL, a lost machine) and ends them `failed` with `worker_lost`, so an
attached client always gets a terminal frame. It publishes the tools the worker offers
(`GET /v1/tools`) as it starts, every `REPUBLISH_S` after, and whenever they change (an
MCP server's: worker/tools/toolbox.py).

Cancellation, once: a stop request cancels the task running the turn. The cancelled task
catches `CancelledError`, writes `done` with status `cancelled` and returns normally, so arq
never sees a `CancelledError` escape (arq would then run the job again). When arq itself
cancels the job (a worker shutting down), the turn ends `failed` with `worker_shutdown`.

Every way a turn ends is one of shared/endings.py's; nothing that goes wrong inside a turn,
the request it was given included, escapes as anything but a terminal `done`.

When the data role fails over (its Sentinels name another primary: shared/connection.py,
`failovers`), the writes the old primary had not replicated are gone, so the streams of
the turns running here may lack some of what their clients already received. Those turns
end `failed` with `store_failover` rather than carry on as if nothing had happened
(docs/scaling.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing
from typing import Any

import httpx
from langchain_core.tools import BaseTool
from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared import keys
from shared.connection import REDIS_ERRORS, failovers
from shared.endings import ENDINGS, completed, ended
from shared.errors import ErrorCode
from shared.events import Done, Event, LlmCallComplete, LlmPrompt, Memory, MessageStored
from shared.logs import TURN_FIELDS
from shared.records import ConversationFullError, Recorder, RecordKeeper
from shared.settings import Settings
from shared.streams import StreamBatcher, StreamWriter, TurnOverError
from shared.turns import TurnRecord, TurnStore
from worker.context import TurnContext
from worker.leases import LeaseKeeper
from worker.llm import Llm, LlmError
from worker.recording import ConversationGoneError
from worker.telemetry import TurnTelemetry
from worker.tools import catalog
from worker.tools.runtime import ToolRuntime
from worker.tools.toolbox import Toolbox

logger = logging.getLogger("bernard.worker")
# An error message a client reads is cut to this: it may quote what the client sent.
_MESSAGE_CHARS = 500

# The turn runner: the context, and the recorder it alone may write the turn's records with.
TurnEvents = Callable[[TurnContext, Recorder | None], AsyncIterator[Event]]


class TurnSupervisor:
    """Claims, runs, renews and stops the turns of one worker process."""

    def __init__(
        self,
        redis: Redis,
        settings: Settings,
        *,
        router: Llm,
        responder: Llm,
        turn_events: TurnEvents,
        worker_id: str,
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
        self.turn_events = turn_events
        self.worker_id = worker_id
        # The tools it offers (worker/tools/toolbox.py): `tools` replaces the built-in ones.
        self.toolbox = Toolbox(settings, tools)
        # The HTTP client the tools share (worker/tools/runtime.py); the worker owns it.
        self.http = http
        self.streams = StreamBatcher(redis, maxlen=settings.stream_maxlen)
        self.store = TurnStore(
            redis,
            retention_s=settings.turn_retention_s,
            stream_maxlen=settings.stream_maxlen,
            queue=self.queue,
        )
        self._failovers = failovers(redis)
        self._running: dict[str, asyncio.Task[str]] = {}
        # Why a local turn was told to stop: "cancelled" (asked to) or "lost" (record gone).
        self._stop_reason: dict[str, str] = {}
        self._background: list[asyncio.Task[None]] = []
        self._tools_published = 0.0  # `time.monotonic()` of the last publish

    async def start(self) -> None:
        self.toolbox.start()  # MCP servers connect in the background
        await self._publish_tools()
        self.leases = LeaseKeeper(
            self.settings, self.worker_id, self.cancel_local, asyncio.get_running_loop()
        )
        self.leases.start()
        self._background = [
            asyncio.create_task(self._listen_for_cancels()),
            asyncio.create_task(self._beat_and_reap()),
            asyncio.create_task(self._follow_tools()),
        ]

    async def stop(self) -> None:
        await asyncio.to_thread(self.leases.stop)
        for task in self._background:
            task.cancel()
        for task in self._background:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with contextlib.suppress(RedisError):
            await self.queue.zrem(keys.WORKERS, self.worker_id)
            await catalog.withdraw_mcp_health(self.queue, self.worker_id)
        await self.toolbox.stop()

    # -- running one turn ----------------------------------------------------------------

    async def run(self, turn_id: str) -> str:
        """The arq job: run the turn if it is still queued; return its final status."""
        claim = await self.store.claim(turn_id, self.worker_id, self.settings.lease_ttl_s)
        if claim.record is None:
            # A re-delivered job (after a crash or shutdown) must never run a turn twice.
            logger.info(
                "turn %s not run: it is %s",
                turn_id,
                claim.outcome,
                extra={"turn_id": turn_id, "status": claim.outcome},
            )
            return claim.outcome
        telemetry = TurnTelemetry.claimed(claim.record, self.settings, self.worker_id)
        if claim.cancel_requested:
            await self._end(telemetry, claim.record, ErrorCode.TURN_CANCELLED)
            return "cancelled"
        task = asyncio.create_task(self._execute(claim.record, telemetry))
        self._running[turn_id] = task
        self.leases.add(turn_id)
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
            self.leases.discard(turn_id)
            self._stop_reason.pop(turn_id, None)
            telemetry.close()

    def cancel_local(self, turn_id: str, reason: str = "cancelled") -> None:
        """Abort the turn if it runs here; the in-flight LLM call is cancelled at once.
        `reason`: "cancelled" (asked to), "lost" (over for this worker), "failover"."""
        task = self._running.get(turn_id)
        if task is not None and turn_id not in self._stop_reason:
            self._stop_reason[turn_id] = reason
            task.cancel()

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
                await self._end(telemetry, record, ErrorCode.INVALID_TURN, message)
                return "failed"
            records = RecordKeeper(
                self.redis,
                owner,
                retention_s=self.settings.conversation_retention_s,
                queue=self.queue,
            )
            async with asyncio.timeout(self.settings.turn_timeout_s):
                turn = self.turn_events(ctx, records.as_recorder())
                async with aclosing(turn) as events:  # type: ignore[type-var]
                    async for event in events:
                        if _visible(event, record):
                            await writer.write(event)
                await writer.flush()
        except TurnOverError:
            # Its stream refused a write: another process ended the turn (a reaper took
            # this worker for dead) or its record is gone.
            await self._abandon(writer, owner, telemetry)
            return "lost"
        except asyncio.CancelledError:
            reason = self._stop_reason.get(turn_id)
            if reason == "lost":
                await self._abandon(writer, owner, telemetry)
                return "lost"
            await _flush_quietly(writer)
            if reason == "cancelled":
                done = ended(ErrorCode.TURN_CANCELLED)
                done.usage = ctx.usage if ctx is not None else None
                await self._finish(telemetry, record, done)
                return "cancelled"
            if reason == "failover":
                await self._end(telemetry, record, ErrorCode.STORE_FAILOVER)
                return "failed"
            await self._end(telemetry, record, ErrorCode.WORKER_SHUTDOWN)
            raise
        except TimeoutError:
            await _flush_quietly(writer)
            await self._end(telemetry, record, ErrorCode.TURN_TIMEOUT)
            return "failed"
        except ConversationGoneError:
            # Deleted between the turn's creation and its start: it does not run, and is
            # forgotten as the deletion forgot the conversation's other turns.
            await _flush_quietly(writer)
            await self._end(telemetry, record, ErrorCode.CONVERSATION_DELETED)
            await self.store.forget(owner, [turn_id])
            return "cancelled"
        except LlmError as exc:
            await _flush_quietly(writer)
            await self._end(telemetry, record, exc.code, exc.message)
            return "failed"
        except ConversationFullError as exc:
            # The request's messages were refused whole (shared/budgets.py): nothing stored.
            await _flush_quietly(writer)
            await self._end(telemetry, record, ErrorCode.CONVERSATION_TOO_LARGE, str(exc))
            return "failed"
        except Exception:
            logger.exception("turn %s failed", turn_id)
            await _flush_quietly(writer)
            await self._end(telemetry, record, ErrorCode.INTERNAL_ERROR)
            return "failed"
        assert ctx is not None
        done = completed(ctx.finish_reason, ctx.usage)
        if ctx.paused:
            done.status = "awaiting_confirmation"
        await self._finish(telemetry, record, done, result=ctx.result())
        return done.status

    async def _end(
        self,
        telemetry: TurnTelemetry,
        record: TurnRecord,
        code: ErrorCode,
        message: str | None = None,
    ) -> None:
        """End the turn short of completing (`TurnStore.end`), and log how."""
        await self.store.end(record.id, record.owner, code, message)
        telemetry.ended(ENDINGS[code].status, code, message)

    async def _finish(
        self,
        telemetry: TurnTelemetry,
        record: TurnRecord,
        done: Done,
        result: dict[str, Any] | None = None,
    ) -> None:
        """End the turn with `done` (`TurnStore.finish`), and log how."""
        await self.store.finish(record.id, record.owner, done, result=result)
        error = done.error or {}
        telemetry.ended(done.status, error.get("code"), error.get("message"))

    async def _abandon(self, writer: StreamWriter, owner: str, telemetry: TurnTelemetry) -> None:
        """Stop a turn that is over for this worker: another process ended it, its record
        is gone, or its lease lapsed (so it is taken for dead). Ending it `worker_lost` does
        what a reaper would: nothing if it already ended, drop the orphaned stream if its
        record is gone (nothing queued may recreate it), end it if nobody has yet."""
        writer.discard()
        await _flush_quietly(writer)  # a write already in flight lands first
        await self.store.end(writer.key, owner, ErrorCode.WORKER_LOST)
        telemetry.ended("lost", ErrorCode.WORKER_LOST)

    def _context(self, record: TurnRecord, telemetry: TurnTelemetry) -> TurnContext:
        ctx = TurnContext.for_request(
            record.id,
            record.request,
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
        )
        ctx.telemetry = telemetry
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
        await catalog.publish_tools(self.queue, self.toolbox.tools(), self.settings)
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

    async def _beat_and_reap(self) -> None:
        """Tell the lease thread this loop is alive; end the turns running here if the data
        role failed over; end turns whose worker died; publish the tools again when due."""
        while True:
            await asyncio.sleep(self.settings.lease_renew_s)
            self.leases.beat()
            if time.monotonic() - self._tools_published >= catalog.REPUBLISH_S:
                try:
                    await self._publish_tools()
                except (RedisError, OSError) as exc:
                    logger.warning("publishing the tools failed (%s); retrying", exc)
            seen = failovers(self.redis)
            if seen != self._failovers:
                self._failovers = seen
                logger.warning(
                    "Redis failed over to a new primary; ending the %d turns running here",
                    len(self._running),
                )
                for turn_id in list(self._running):
                    self.cancel_local(turn_id, "failover")
            try:
                for turn_id in await self.store.reap_lapsed(skip=self._running):
                    logger.warning(
                        "turn %s failed: its worker was lost",
                        turn_id,
                        extra={
                            "turn_id": turn_id,
                            "status": "failed",
                            "error": ErrorCode.WORKER_LOST,
                        },
                    )
            except REDIS_ERRORS as exc:
                logger.warning("reaping failed (%s); retrying", exc)


def _visible(event: Event, record: TurnRecord) -> bool:
    """Whether the event goes into the stream, which holds what its client can read:
    model-call traces (the whole prompt, each call) only when the client asked to trace the
    turn, stored rows only for a conversation client."""
    if isinstance(event, LlmPrompt | LlmCallComplete | Memory):
        return record.request.trace
    if isinstance(event, MessageStored):
        return record.request.kind == "conversation"
    return True


async def _flush_quietly(writer: StreamWriter) -> None:
    """Push out what the turn yielded before it ended; a Redis failure, or a turn already
    ended elsewhere, must not mask why."""
    with contextlib.suppress(*REDIS_ERRORS, TurnOverError):
        await writer.flush()
