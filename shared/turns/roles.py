"""What every part of `TurnStore` works with: the two Redis roles a turn's keys live on and
how long what it writes lasts.

The record and its stream live on the data role; arq's job, the running set and the
owner's count of active turns on the queue role (shared/keys.py says why, and how each
move splits into a data half and a queue half that a crash between them cannot strand).
"""

from __future__ import annotations

from redis.asyncio import Redis

from shared.backends import backend_of
from shared.liveness import Liveness


class TurnRoles:
    """The data role (`redis`) and the queue role (`queue`: the same client when one Redis
    holds both, and then halves that need not wait on each other go in one pipeline)."""

    def __init__(
        self,
        redis: Redis,
        *,
        retention_s: int,
        stream_maxlen: int,
        queue: Redis | None = None,
        queue_name: str | None = None,
    ) -> None:
        self.redis = redis
        self.queue = queue if queue is not None else redis
        # Where the jobs of turns waiting in a conversation's line are made due once it
        # moves (`advance`); None: nowhere (they start when their deferral ends).
        self.queue_name = queue_name
        self.retention_s = retention_s
        self.stream_maxlen = stream_maxlen
        self._one_client = self.queue is self.redis
        self.backend = backend_of(redis)
        self.liveness = Liveness(self.queue)
