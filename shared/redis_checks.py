"""Checks on the Redis servers Bernard uses: the start-up warning both processes give, and
the facts `bernard doctor` and `GET /v1/status` judge."""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel
from redis.asyncio import Redis
from redis.exceptions import RedisClusterException, RedisError

from shared.backends import backend_of


async def warn_if_evicting(redis: Redis, logger: logging.Logger) -> None:
    """Warn loudly when Redis may evict any key: an `allkeys-*` policy drops live streams."""
    try:
        policy = (await redis.config_get("maxmemory-policy")).get("maxmemory-policy", "")
    # CONFIG may be disabled (managed Redis), or Redis down (a Cluster says so with its own
    # exception): nothing to check then.
    except (RedisError, RedisClusterException):
        return
    if str(policy).startswith("allkeys"):
        logger.warning(
            "Redis maxmemory-policy is %s: under memory pressure it evicts live turn streams "
            "and records. Use noeviction or a volatile-* policy.",
            policy,
        )


class ServerFacts(BaseModel):
    """What the health checks read from one Redis server (`bernard doctor`, `GET
    /v1/status`): INFO's version, replication role, maxmemory and AOF, and the eviction
    policy (None when CONFIG is disabled, as on managed Redis). `node` names it among a
    Cluster's primaries ("" for a lone server)."""

    node: str
    version: str
    role: str
    maxmemory: int
    maxmemory_policy: str | None
    aof_enabled: bool


def _facts(node: str, info: dict[str, Any], policy: str | None) -> ServerFacts:
    return ServerFacts(
        node=node,
        version=str(info.get("redis_version", "?")),
        role=str(info.get("role", "?")),
        maxmemory=int(info.get("maxmemory") or 0),
        maxmemory_policy=policy,
        aof_enabled=bool(int(info.get("aof_enabled") or 0)),
    )


async def server_facts(client: Redis) -> list[ServerFacts]:
    """The facts of the server behind `client`, or of each primary of a Cluster (a replica
    is read once it is promoted: the client knows the primaries alone). Redis errors
    propagate."""
    backend = backend_of(client)
    infos = await backend.servers_info()
    try:
        configs = await backend.servers_config("maxmemory-policy")
    except RedisError:
        configs = {}
    return [
        _facts(
            node,
            info,
            str(configs[node].get("maxmemory-policy", "")) if node in configs else None,
        )
        for node, info in sorted(infos.items())
    ]
