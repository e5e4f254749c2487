"""The turn runner: chains the harnesses into one stream of events, and records the turn.

memory → router → response for a chat turn (memory → resume → router → response for one
that carries the user's decisions on a paused turn's tool calls); the response harness
alone for a legacy completion. Each harness is an async generator; the runner chains them
into a `Sequencer` and yields their events in order, the moment each is produced.

The runner alone records (seed 002). When the turn belongs to a conversation and a
`Recorder` is given, it stores the request's new messages first and runs the turn on the
stored history, records each model and tool call as its events pass, and stores this turn's
messages once the turn has completed (or paused for the user's decision); each row stored
is also an event (`message`). Harnesses only ever see the read-only `Archivist`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

from shared.events import Event, MessageStored
from shared.records import Recorder, row_of
from worker.context import TurnContext
from worker.harness.memory import memory_harness
from worker.harness.response import response_harness
from worker.harness.resume import resume_harness
from worker.harness.router import router_harness
from worker.recording import TurnRecording
from worker.sequencer import Sequencer

__all__ = ["Harness", "harnesses", "turn_events"]

Harness = Callable[[TurnContext], AsyncIterator[Event]]


def harnesses(ctx: TurnContext) -> list[Harness]:
    """The harnesses this turn runs, in order."""
    if ctx.request.kind == "completion":
        return [response_harness]
    if ctx.request.resume:
        return [memory_harness, resume_harness, router_harness, response_harness]
    return [memory_harness, router_harness, response_harness]


async def turn_events(ctx: TurnContext, recorder: Recorder | None = None) -> AsyncIterator[Event]:
    """Every event of the turn, in order; with `recorder`, the turn is recorded as it runs."""
    recording: TurnRecording | None = None
    if recorder is not None and ctx.conversation_id is not None:
        recording = TurnRecording(recorder, ctx)
        for row in await recording.begin():
            yield MessageStored(row=row_of(row))

    sequencer: Sequencer[Event] = Sequencer()
    # Harness generators start only when the sequencer reaches them, so chaining them all
    # now still runs each stage after the previous one has finished.
    for harness in harnesses(ctx):
        sequencer.chain(harness(ctx))
    sequencer.chain(None)

    try:
        async with aclosing(sequencer):
            async for event in sequencer:
                if recording is not None:
                    recording.observe(event)
                yield event
    except BaseException as exc:
        # Failures, and stops too: a cancelled task or a closed generator (the client left)
        # still gets its open calls closed; awaiting here is allowed, yielding is not.
        if recording is not None:
            await recording.fail(exc)
        raise
    if recording is not None:
        for row in await recording.finish():
            yield MessageStored(row=row_of(row))
