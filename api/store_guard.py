"""The deployment-wide Redis memory guard.

Redis runs `noeviction` (deploy/k8s/redis.md): once it is full every write fails, a running
turn's too, for every user. So above `BERNARD_REDIS_MEMORY_GUARD` (a fraction) of a
server's limit the API stops taking in what stores: a new turn, a new conversation
(503 `store_full`, with `Retry-After`), and `/readyz` answers 503 saying why. Turns already
running finish in the room left above the guard; reading, cancelling and deleting go on.

Each API process samples `INFO memory` in the background, once a second (never per
request), from every server that holds Bernard's data: the data role (each primary of a
Cluster) and the queue role when it is apart. A server's limit is its `maxmemory`; one
without (`maxmemory` 0) grows until its machine runs out, so its limit is then the
machine's memory (`total_system_memory`: the host's, which in a container may be more than
the container may use: set `maxmemory` there). A sample that fails (Redis unreachable)
keeps the last verdict; requests meet Redis's own errors meanwhile (503
`redis_unavailable`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from api.errors import STORE_FULL_RETRY_AFTER_S, ApiError
from shared.backends import backend_of
from shared.connection import REDIS_ERRORS
from shared.errors import ErrorCode

logger = logging.getLogger("bernard.api")

SAMPLE_S = 1.0


@dataclass(frozen=True, slots=True)
class Fill:
    """How full one Redis server is: `used` bytes of `limit`, which is its `maxmemory` or,
    without one, its machine's memory (`of_machine`)."""

    server: str
    used: int
    limit: int
    of_machine: bool = False

    @property
    def fraction(self) -> float:
        return self.used / self.limit if self.limit > 0 else 0.0

    def describe(self) -> str:
        limit = "its machine's memory (no maxmemory)" if self.of_machine else "its maxmemory"
        return (
            f"Redis {self.server} uses {self.used} bytes, {self.fraction:.0%} of {limit} "
            f"({self.limit} bytes)"
        )


def fill_of(server: str, info: Mapping[str, Any]) -> Fill:
    """The `Fill` an `INFO memory` reply says."""
    used = int(info.get("used_memory", 0))
    maxmemory = int(info.get("maxmemory", 0))
    if maxmemory > 0:
        return Fill(server, used, maxmemory)
    return Fill(server, used, int(info.get("total_system_memory", 0)), of_machine=True)


class StoreGuard:
    """Samples how full the `servers` are; `check` refuses what would store once one is over
    `fraction` of its limit (0: never)."""

    def __init__(self, servers: Sequence[Redis], fraction: float) -> None:
        self.servers = list(servers)
        self.fraction = fraction
        # The fullest server over the guard at the last sample; None: room everywhere.
        self.full: Fill | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.fraction > 0 and self._task is None:
            self._task = asyncio.create_task(self._sample_forever())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    @property
    def reason(self) -> str | None:
        """Why nothing new is stored, or None."""
        if self.full is None:
            return None
        return (
            f"{self.full.describe()}, over BERNARD_REDIS_MEMORY_GUARD ({self.fraction:g}): "
            "nothing new is stored until it has room"
        )

    def check(self) -> None:
        """Raise 503 `store_full` while a server is over the guard."""
        reason = self.reason
        if reason is not None:
            raise ApiError(
                503,
                reason,
                code=ErrorCode.STORE_FULL,
                headers={"retry-after": str(STORE_FULL_RETRY_AFTER_S)},
            )

    async def sample(self) -> None:
        """Read every server's fill once and set the verdict."""
        fills = [fill for server in self.servers for fill in await _fills(server)]
        over = [fill for fill in fills if fill.fraction >= self.fraction]
        full = max(over, key=lambda fill: fill.fraction) if over else None
        if (full is None) != (self.full is None):
            if full is not None:
                logger.warning("store full: refusing new turns: %s", full.describe())
            else:
                logger.warning("store has room again: taking new turns")
        self.full = full

    async def _sample_forever(self) -> None:
        while True:
            try:
                await self.sample()
            except REDIS_ERRORS as exc:
                logger.debug("memory guard could not read Redis: %s", exc)
            await asyncio.sleep(SAMPLE_S)


async def _fills(redis: Redis) -> list[Fill]:
    """The fill of each server behind `redis`: each primary of a Cluster, else the one."""
    backend = backend_of(redis)
    replies = await backend.servers_info("memory")
    return [fill_of(node or backend.describe(), info) for node, info in replies.items()]
