"""Recording one turn in the record keeper, as its events pass through the runner.

The runner is the only writer (seed 002): the recording is one of the turn's sinks
(worker/turn.py), and reads each call's start and end from the items the harnesses yield
(worker/calls.py: the whole tool output is in its call's end; the stream only carries a cut
version). The writes run in order in the background (`OrderedWrites`), so no model call
waits for a record, and all of them are in before the turn ends: a client that got the
turn's `done` finds every record. A model call's end goes out with the next write (the
next call's start, or the turn's messages once it ends), as records observed while a write
is in flight do, and so does the end of the last tool call still running. Harnesses never
write.

Each message is written exactly once: the request's new messages at the start (the
client resends the whole history; `append_new_messages` keeps only what is new), and this
turn's tool-call messages, tool results and final answer once the turn has completed. A turn
that ends on calls of the client's own tools has no answer: its calls wait for the results
the client's follow-up brings (worker/harness/router.py). A call's record holds what is not
stored elsewhere (model, timing, usage; a tool's whole output), never the prompt, whose
messages the conversation already holds.

A turn stopped by a cancel, or interrupted by a newer message, keeps what it answered so
far: its answer is stored as it stood, marked `stopped` (shared/records/messages.py), before
the turn's ending is written, so the turn that comes next in the conversation reads it.

A turn writes into its conversation only while it holds it (shared/conversation_state.py).
One whose conversation is gone when it begins (deleted, or no longer its own) does not run:
it ends `conversation_deleted` (`ConversationGoneError`). One whose conversation is deleted
while it runs is stopped by the deletion (api/conversations.py); anything it still records
is refused, and its recording stops.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Coroutine, Iterable
from dataclasses import asdict
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    ToolMessage,
    convert_to_openai_messages,
)
from redis.exceptions import RedisError

from shared.events import ToolCall
from shared.lifecycle import RULES
from shared.queue import BackgroundLimits
from shared.records.call_log import (
    CallEvent,
    llm_completed,
    llm_started,
    tool_completed,
    tool_started,
)
from shared.records.conversation import ConversationNotFoundError
from shared.records.history_diff import history_digest
from shared.records.messages import STOPPED, Message, stopped_row
from shared.records.undo import Restore, Undone
from shared.records.writes import Recorder
from worker.calls import Item, ModelCallEnded, ModelCallStarted, ToolCallEnded, is_stop
from worker.context import ConversationGoneError, TurnContext
from worker.harness.answers import answer_messages
from worker.harness.resume import edited_arguments

__all__ = ["EXPIRED_CALL", "TurnRecording", "openai_messages"]

logger = logging.getLogger("bernard.worker")

# The result a tool call gets when nobody decided on it before its proposal lapsed.
EXPIRED_CALL = "Not run: the user did not confirm this in time."


def _is_answer(row: Message) -> bool:
    """Whether a stored row is an answer of the assistant's (not a tool call's message, nor
    one its turn did not finish)."""
    return row.get("role") == "assistant" and not row.get("tool_calls") and not row.get(STOPPED)


def _answered_calls(messages: list[dict[str, Any]]) -> set[str]:
    """The ids of the tool calls a request's `tool` messages answer."""
    return {str(m["tool_call_id"]) for m in messages if m.get("role") == "tool"}


class TurnRecording:
    """Writes the records of one turn of `ctx.conversation_id` through `recorder`."""

    def __init__(self, recorder: Recorder, ctx: TurnContext) -> None:
        if ctx.conversation_id is None:
            raise ValueError("a recorded turn needs a conversation id")
        self.recorder = recorder
        self.ctx = ctx
        self.conversation_id = ctx.conversation_id
        # The model call in flight (calls are sequential): our call id and when it started.
        self._llm_call: tuple[str, float] | None = None
        # Tool calls started and not yet completed, by the model's tool call id.
        self._tool_calls: dict[str, tuple[str, float]] = {}
        # Call log entries not written yet (`_record`).
        self._calls: list[CallEvent] = []
        self._writes = OrderedWrites()
        # Set once a write found the conversation gone (deleted): nothing more is written.
        self.deleted = False
        # How many messages the conversation holds, as of this turn's own append: its
        # final append need not read it again (`Recorder.append_messages`).
        self._length: int | None = None
        # Whether no answer was stored before this turn: its answer ends the first exchange,
        # and the conversation is named after it (worker/titles.py).
        self._first_exchange = False

    async def begin(self) -> list[Message]:
        """Store the request's new messages and return the rows stored; the latest rows of
        the conversation (as many as a request may hold) go to the memory stage, which
        picks what the prompts hold (worker/harness/memory.py).

        Tool calls a paused turn left waiting, and nobody decided on in time, are answered
        first ("not run"), but those this turn carries the decisions on: a prompt may not
        hold a tool call without its result. Those the user approved with edited arguments
        get them in the stored message (`Recorder.amend_tool_calls`).

        Raises `ConversationGoneError` unless the turn holds its conversation.
        """
        resume = self.ctx.request.resume or {}
        decisions = resume.get("decisions", [])
        # Calls this turn answers itself: those decided, and those the router decides on.
        carried = [*decisions, *resume.get("pending", [])]
        # A message answering in words is stored after the decided calls' results (their
        # results must follow the paused turn's message): by the harnesses, with what came
        # along with it (worker/harness/answers.py `answer_messages`).
        requested = [] if "words" in resume else self.ctx.request.messages
        try:
            # Calls the user approved edited run as edited: the paused turn's stored message
            # says so before the history is read, so neither the prompt nor a client that
            # reads the history finds the proposed arguments beside the edited call's result.
            await self.recorder.amend_tool_calls(
                self.conversation_id,
                edited_arguments(decisions),
                turn_id=self.ctx.turn_id,
                window=self.ctx.settings.max_messages,
            )
            continuation = await self.recorder.append_new_messages(
                self.conversation_id,
                requested,
                window=self.ctx.settings.max_messages,
                turn_id=self.ctx.turn_id,
                answer_open_calls=EXPIRED_CALL,
                # A turn carrying the decisions answers those calls itself, and a client's
                # follow-up the calls of its own tools it ran (its `tool` messages).
                except_calls={one["tool_call"]["id"] for one in carried}
                | _answered_calls(requested),
                # Refused whole over the cap: the turn ends `conversation_too_large` before
                # any model call (worker/supervisor.py). What the turn stores later is
                # never refused (shared/budgets.py).
                limit=self.ctx.settings.max_conversation_bytes,
                # A conversation's message is posted alone (POST .../messages), never part
                # of a history resent: new even when it repeats the last one stored.
                resent=self.ctx.request.resends_history,
            )
        except ConversationNotFoundError as exc:
            self.deleted = True
            raise ConversationGoneError(self.conversation_id) from exc
        self.ctx.stored = continuation.history  # the memory stage picks the prompt's share
        self._length = continuation.length
        before = continuation.history[: len(continuation.history) - len(continuation.new)]
        self._first_exchange = not any(_is_answer(row) for row in before)
        return continuation.new

    async def take(self, item: Item) -> None:
        """The turn's sink (worker/turn.py): `observe`."""
        self.observe(item)

    def observe(self, item: Item) -> None:
        """Queue the record of the call `item` starts or ends (other items are ignored).

        Raises what an earlier record write raised.
        """
        ctx = self.ctx
        match item:
            case _ if self.deleted:
                return
            case ModelCallStarted():
                started = llm_started(ctx.turn_id, item.prompt.stage, item.prompt.model)
                self._llm_call = (started.call_id, time.perf_counter())
                self._record(started)
            case ModelCallEnded() if self._llm_call is not None:
                call_id, _ = self._llm_call
                self._llm_call = None
                result = item.result
                # Held for the next write: what follows a model call's end at once is the
                # next call's start or the turn's end, whose append of the turn's messages
                # takes it along (`finish`): one write fewer per turn.
                self._calls.append(
                    llm_completed(call_id, latency_ms=result.latency_ms, usage=result.usage)
                )
            case ToolCall():
                started = tool_started(
                    ctx.turn_id,
                    tool_call_id=item.id,
                    name=item.name,
                    arguments=item.arguments,
                    policy=item.policy,
                )
                self._tool_calls[item.id] = (started.call_id, time.perf_counter())
                self._record(started)
            case ToolCallEnded() if item.call.id in self._tool_calls:
                call_id, began = self._tool_calls.pop(item.call.id)
                outcome = item.outcome  # the whole output, not the stream's cut
                # What would put back what a call changed, or which call it put back
                # (shared/records/undo.py): the tool's artifact, kept with its record.
                artifact = outcome.message.artifact
                completed = tool_completed(
                    call_id,
                    latency_ms=(time.perf_counter() - began) * 1000,
                    content=outcome.content,
                    status=outcome.status,
                    undo=artifact.encoded() if isinstance(artifact, Restore) else None,
                    undid=artifact.call_id if isinstance(artifact, Undone) else None,
                )
                if self._tool_calls:
                    # Others still run, and may for long: it is written now.
                    self._record(completed)
                else:
                    # Held for the next write, as a model call's end is: what follows the
                    # last running call's end at once is the next model call's start or the
                    # turn's end.
                    self._calls.append(completed)

    def _record(self, call: CallEvent) -> None:
        """Queue `call` for the call log. Calls queued while a write is in flight go out
        together in the next one: a router call's end and the next call's start, say."""
        self._calls.append(call)
        self._writes.add(self._unless_deleted(self._write_calls()))

    async def _write_calls(self) -> None:
        calls, self._calls = self._calls, []
        if calls:  # else an earlier write of this burst took them
            await self.recorder.record_calls(self.conversation_id, calls, turn_id=self.ctx.turn_id)

    async def finish(self) -> list[Message]:
        """The turn completed or paused: wait for its call records, then store its
        tool-call messages, tool results and answer (a paused turn has none yet, but its
        proposals), with the call records not written yet (the last model call's end) in
        the same step; return the rows stored."""
        await self._writes.drain()
        if self.deleted:
            return []
        ctx = self.ctx
        messages: list[BaseMessage] = list(ctx.tool_messages)
        # A turn that paused, or ended on the client's tool calls, has no answer yet.
        if not ctx.paused and not ctx.handed_over:
            messages.append(AIMessage(content=ctx.answer()))
        calls, self._calls = self._calls, []
        rows = await self._unless_deleted(
            self.recorder.append_messages(
                self.conversation_id,
                openai_messages(messages),
                turn_id=ctx.turn_id,
                length=self._length,
                calls=calls,
            )
        )
        if ctx.paused and not self.deleted:
            proposals = [asdict(proposal) for proposal in ctx.pending]
            await self._unless_deleted(
                self.recorder.propose(self.conversation_id, proposals, turn_id=ctx.turn_id)
            )
            if ctx.request.resends_history and not self.deleted:
                # A client that resends its history may send no conversation id: its answer
                # finds this conversation by the history it resends, the question included.
                said = {"role": "assistant", "content": "".join(ctx.content)}
                await self.recorder.keep_asked(
                    history_digest([*ctx.request.messages, said]),
                    self.conversation_id,
                    turn_id=ctx.turn_id,
                    until=max(proposal.expires_at for proposal in ctx.pending),
                )
        if ctx.summary_until is not None and not self.deleted:
            # Off the turn's path: a job on the workers' queue, one pending at a time.
            await self.recorder.request_summary(
                self.conversation_id,
                ctx.summary_until,
                BackgroundLimits.of(ctx.settings),
                turn_id=ctx.turn_id,
            )
        answered = not ctx.paused and not ctx.handed_over
        if self._first_exchange and answered and rows and ctx.settings.conversation_titles:
            # Off the turn's path too (worker/titles.py); once per conversation, as only the
            # turn storing its first answer asks.
            try:
                await self.recorder.request_title(
                    self.conversation_id, BackgroundLimits.of(ctx.settings)
                )
            except RedisError as exc:  # an untitled conversation is no failed turn
                logger.warning("title of %s not queued: %s", self.conversation_id, exc)
        return list(rows or [])

    async def _unless_deleted(self, write: Coroutine[Any, Any, Any]) -> Any:
        """Run a record write and return what it returns; a conversation found deleted
        stops the recording (and the write returns None)."""
        if self.deleted:
            write.close()
            return None
        try:
            return await write
        except ConversationNotFoundError:
            self._forget()
            return None

    def _forget(self) -> None:
        if not self.deleted:
            logger.info(
                "conversation %s was deleted during turn %s: not recorded",
                self.conversation_id,
                self.ctx.turn_id,
            )
        self.deleted = True

    async def fail(self, error: BaseException) -> None:
        """The turn failed or was stopped: close the calls still open as failed, and store
        the tool calls it made with their results (`_what_ran`), so the conversation says
        which calls ran.

        Never raises a record error: the turn's own error is the one that must surface.
        """
        if is_stop(error):
            message = "the turn was stopped before the call ended"
        else:
            message = getattr(error, "message", None) or str(error) or type(error).__name__
        try:
            await self._writes.drain()
            if self.deleted:
                return
            ran = openai_messages(self._what_ran(message))
            answer = await self._stopped_answer(error)
            if answer is not None:
                ran.append(answer)
            calls, self._calls = self._calls, []  # any a failed write left behind
            if self._llm_call is not None:
                call_id, began = self._llm_call
                self._llm_call = None
                latency_ms = (time.perf_counter() - began) * 1000
                calls.append(llm_completed(call_id, latency_ms=latency_ms, error=message))
            for call_id, began in self._tool_calls.values():
                calls.append(
                    tool_completed(
                        call_id,
                        latency_ms=(time.perf_counter() - began) * 1000,
                        content=f"Error: {message}",
                        status="error",
                    )
                )
            self._tool_calls.clear()
            await self.recorder.record_calls(self.conversation_id, calls, turn_id=self.ctx.turn_id)
            if ran:
                await self.recorder.append_messages(
                    self.conversation_id, ran, turn_id=self.ctx.turn_id, length=self._length
                )
        except (RedisError, OSError, ConversationNotFoundError) as exc:
            # The turn's own error is what matters; a lost record must not replace it.
            logger.warning("could not record the failure of turn %s: %s", self.ctx.turn_id, exc)

    async def _stopped_answer(self, error: BaseException) -> Message | None:
        """What the turn answered before it was stopped, as the conversation keeps it: for
        a stop whose rule keeps it (a cancel, an interrupt: shared/lifecycle.py `RULES`),
        marked `stopped` with the ending's code, so a client that reads the history back
        shows it as stopped and the next turn reads where it was cut (even when it had
        said nothing yet); else None."""
        if not is_stop(error) or self.ctx.stop_cause is None:
            return None
        cause = await self.ctx.stop_cause()
        if cause is None or not RULES[cause].partial:
            return None
        return stopped_row("".join(self.ctx.content), RULES[cause].code)

    def _what_ran(self, why: str) -> list[BaseMessage]:
        """This turn's tool-call messages and tool results so far (as `finish` stores them,
        without an answer), each call answered: one that never ended with the error its
        call record gets, one that never started with "not run" (a declined one as the
        resume harness says it). The calls a resumed turn carries out answer the paused
        turn's message, stored already. Left out, the next turn answered a decided call as
        never confirmed though it ran, and the model never read what the calls did."""
        ctx = self.ctx
        stopped = set(self._tool_calls)  # started, never ended
        resume = ctx.request.resume or {}
        group: list[dict[str, Any]] = [
            {**decision["tool_call"], "declined": decision["decision"] != "approve"}
            for decision in resume.get("decisions", [])
        ]
        group += [{**one["tool_call"], "declined": False} for one in resume.get("pending", [])]
        answered: set[str] = set()
        out: list[BaseMessage] = []

        def close_group() -> None:
            for call in group:
                if call["id"] in answered:
                    continue
                if call["id"] in stopped:
                    content = f"Error: {why}"
                elif call.get("declined"):
                    content = f"The user declined: {call['name']} was not run."
                else:
                    content = f"Not run: the turn ended before this call ran ({why})."
                out.append(ToolMessage(content=content, tool_call_id=call["id"], name=call["name"]))

        for message in ctx.tool_messages:
            if isinstance(message, AIMessage):
                close_group()
                group, answered = [dict(call) for call in message.tool_calls], set()
            elif isinstance(message, ToolMessage):
                answered.add(message.tool_call_id)
            else:  # the user's words follow the results of the calls they answered
                close_group()
                group = []
            out.append(message)
        close_group()
        if "words" in resume and not any(isinstance(m, HumanMessage) for m in out):
            # The turn ended before the words were read: they are stored after the calls.
            out += answer_messages(ctx.request)
        return out


def openai_messages(messages: Iterable[BaseMessage]) -> list[Message]:
    """LangChain's messages in OpenAI's chat shape, as shared/records/ takes them: the API
    reads the records too, and never loads LangChain."""
    return [convert_to_openai_messages(message) for message in messages]


class OrderedWrites:
    """Record writes run one after another in a task of their own, so the turn never waits
    for them (each was a round trip on the way to the next model call); `drain` waits for
    them all and raises what one raised, as does the next `add` after a failed write."""

    def __init__(self) -> None:
        self._queue: deque[Coroutine[Any, Any, Any]] = deque()
        self._task: asyncio.Task[None] | None = None

    def add(self, write: Coroutine[Any, Any, Any]) -> None:
        if self._task is not None and self._task.done():
            task, self._task = self._task, None
            if task.exception() is not None:
                write.close()
                self._close_queued()
                task.result()
        self._queue.append(write)
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    async def drain(self) -> None:
        if self._task is not None:
            task, self._task = self._task, None
            try:
                await task
            finally:
                self._close_queued()

    async def _run(self) -> None:
        while self._queue:
            await self._queue.popleft()

    def _close_queued(self) -> None:
        # Writes queued behind a failed one never run; close them so none is left unawaited.
        while self._queue:
            self._queue.popleft().close()
