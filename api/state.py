"""What the API process holds for its whole life, created in the app's lifespan."""

from __future__ import annotations

from dataclasses import dataclass

from arq.connections import ArqRedis
from fastapi import Request

from api.attachments import Streams
from api.hub import StreamHub
from shared.settings import Settings
from shared.turns import TurnStore


@dataclass
class AppState:
    """The settings, the Redis client, the turn store, the stream hub and the open streams
    of this process."""

    settings: Settings
    redis: ArqRedis
    store: TurnStore
    hub: StreamHub
    streams: Streams


async def get_state(request: Request) -> AppState:
    """The process's state, as a dependency (`async`: see `api.auth.current_user`)."""
    state: AppState = request.app.state.bernard
    return state
