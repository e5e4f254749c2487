"""The memory harness: a stage between router and response, empty for now.

It exists so the turn has its final shape; a later change fills it (summaries, recall)
without touching the runner.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from shared.events import Event
from worker.context import TurnContext


async def memory_harness(ctx: TurnContext) -> AsyncIterator[Event]:
    """Yield nothing: no memory stage yet."""
    return
    yield  # an async generator with no items
