"""The turn runner: chains the harnesses into one stream of events.

router → memory → response for a chat turn; the response harness alone for a legacy
completion. Each harness is an async generator; the runner yields their events in order,
the moment each is produced.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from shared.events import Event
from worker.context import TurnContext
from worker.harness.memory import memory_harness
from worker.harness.response import response_harness


async def turn_events(ctx: TurnContext) -> AsyncIterator[Event]:
    """Every event of the turn, in order."""
    stages = [memory_harness, response_harness]
    for stage in stages:
        async for event in stage(ctx):
            yield event
