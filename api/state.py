"""What the API process holds for its whole life, created in the app's lifespan."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from arq.connections import ArqRedis
from fastapi import Depends, Request
from redis.asyncio import Redis

from api.attachments import Streams
from api.hub import Hub
from api.replays import ReplayGate
from api.status import StatusCache
from api.store_guard import StoreGuard
from shared.rate_limit import RateLimiter
from shared.records.keeper import RecordKeeper
from shared.schema_checks import SchemaChecks
from shared.settings import Settings
from shared.turns import TurnStore


@dataclass
class AppState:
    """The settings, the Redis clients (`redis` the data role, `queue` the queue role:
    shared/keys.py; one client when one Redis holds both), the turn store, the stream hub,
    the open streams of this process, the users' rate limiter, the memory guard and its
    latest status."""

    settings: Settings
    redis: Redis
    store: TurnStore
    hub: Hub
    streams: Streams
    queue: ArqRedis
    limiter: RateLimiter
    guard: StoreGuard
    # `GET /v1/status`, built at most once per few seconds (api/status.py).
    status: StatusCache = field(default_factory=StatusCache)
    # Clients' function schemas, and edited arguments against a tool's, checked off the loop.
    schema_checks: SchemaChecks = field(default_factory=SchemaChecks)
    # Who may replay a stream from its start now (api/replays.py).
    replays: ReplayGate = field(default_factory=ReplayGate)

    def keeper(self, owner: str) -> RecordKeeper:
        """The owner's conversations and their records, kept as long as the deployment keeps
        them (`BERNARD_CONVERSATION_RETENTION_S`)."""
        return RecordKeeper(self.redis, owner, retention_s=self.settings.conversation_retention_s)


async def get_state(request: Request) -> AppState:
    """The process's state, as a dependency (`async`: see `api.auth.current_user`)."""
    state: AppState = request.app.state.bernard
    return state


# A route's parameter that is the process's state.
State = Annotated[AppState, Depends(get_state)]
