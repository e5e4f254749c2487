"""The turn runner: chains the harnesses into one sequence of items, and hands every item to
every sink of the turn.

memory → router → response for an agent turn (memory → resume → router → response for one
that carries the user's decisions on a paused turn's tool calls, memory → undo → response
for one that undoes the conversation's last change to the house); the response harness
alone for a turn that runs the model alone (`RunMode.MODEL`: a legacy completion). The
runner reads only the agent request (shared/requests.py), never how the turn is delivered.
Each harness is an async generator; the runner chains them into a `Sequencer` and passes
their items on in order, the moment each is produced.

Harnesses only yield: the stream's events, and each model or tool call's start and end
described once (worker/calls.py). What happens to them is the sinks': the turn's stream
(worker/supervisor.py: what of each item its client may read), its call records and stored
messages (`TurnRecording`, worker/recording.py), its log lines and spans (`TurnTelemetry`,
worker/telemetry.py). Each sink takes every item, and when the turn fails or is stopped
each closes what it has open.

The runner alone records (seed 002). When the turn belongs to a conversation and a
`Recorder` is given, it stores the request's new messages first and runs the turn on the
stored history, records each model and tool call as its items pass, and stores this turn's
messages once the turn has completed (or paused for the user's decision); each row stored
is also an event (`message`) for the other sinks. Harnesses only ever see the read-only
`Archivist`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import aclosing
from typing import Protocol

from shared.events import MessageStored
from shared.records.messages import row_of
from shared.records.writes import Recorder
from shared.requests import RunMode
from worker.calls import Item
from worker.context import TurnContext
from worker.harness.memory import memory_harness
from worker.harness.response import response_harness
from worker.harness.resume import resume_harness
from worker.harness.router import router_harness
from worker.harness.undo import undo_harness
from worker.recording import TurnRecording
from worker.sequencer import Sequencer

__all__ = ["Harness", "Sink", "harnesses", "run_to_sinks", "turn_items"]

Harness = Callable[[TurnContext], AsyncIterator[Item]]


class Sink(Protocol):
    """Where a turn's items go, each of them in order."""

    async def take(self, item: Item) -> None:
        """Do this sink's part for `item`; what it raises ends the turn."""

    async def fail(self, error: BaseException) -> None:
        """The turn failed or was stopped with `error`: close what is open. Never raises."""


def harnesses(ctx: TurnContext) -> list[Harness]:
    """The harnesses this turn runs, in order."""
    if ctx.request.mode is RunMode.MODEL:
        return [response_harness]
    if ctx.request.resume:
        return [memory_harness, resume_harness, router_harness, response_harness]
    if ctx.request.undo:
        return [memory_harness, undo_harness, response_harness]
    return [memory_harness, router_harness, response_harness]


async def turn_items(ctx: TurnContext) -> AsyncGenerator[Item, None]:
    """Every item the turn's harnesses yield, in order."""
    sequencer: Sequencer[Item] = Sequencer()
    # Harness generators start only when the sequencer reaches them, so chaining them all
    # now still runs each stage after the previous one has finished.
    for harness in harnesses(ctx):
        sequencer.chain(harness(ctx))
    sequencer.chain(None)
    async with aclosing(sequencer):
        async for item in sequencer:
            yield item


async def run_to_sinks(
    ctx: TurnContext, sinks: Sequence[Sink], recorder: Recorder | None = None
) -> None:
    """Run the turn, handing every item to every sink of `sinks`; with `recorder`, the turn
    is recorded as it runs (the recording is one more sink)."""
    every: list[Sink] = list(sinks)
    recording: TurnRecording | None = None
    if recorder is not None and ctx.conversation_id is not None:
        recording = TurnRecording(recorder, ctx)
        every.append(recording)

    async def take(item: Item) -> None:
        for sink in every:
            await sink.take(item)

    if recording is not None:
        for row in await recording.begin():
            await take(MessageStored(row=row_of(row)))
    try:
        async with aclosing(turn_items(ctx)) as items:
            async for item in items:
                await take(item)
    except BaseException as exc:
        # Failures, and stops too: a cancelled task still gets its open calls closed.
        for sink in every:
            await sink.fail(exc)
        raise
    if recording is not None:
        for row in await recording.finish():
            await take(MessageStored(row=row_of(row)))
