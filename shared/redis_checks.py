"""Checks on the Redis servers Bernard uses: the start-up warning both processes give, the
facts `bernard doctor` and `GET /v1/status` judge, and what went wrong reaching one, as
`bernard doctor` and `./run` say it (`redis_error_text`)."""

from __future__ import annotations

import logging
import re
from typing import Any

from pydantic import BaseModel
from redis.asyncio import Redis
from redis.exceptions import RedisClusterException, RedisError

from shared.backends import backend_of
from shared.redaction import url_secrets


def redis_error_text(exc: BaseException, url: str) -> str:
    """What went wrong reaching `url`, for people to read: without its passwords, and with
    the clients redis-py names in a Sentinel error (`<redis.asyncio.client.Redis(...)>`)
    written as the `host:port` they tried."""
    text = _CLIENT_REPR.sub(r"\1:\2", str(exc) or type(exc).__name__)
    for secret in url_secrets(url):
        text = text.replace(secret, "***")
    return text


# redis-py's repr of a client, as in "No master found for 'service' : <repr> - <error>, ..."
_CLIENT_REPR = re.compile(
    r"<redis\.[\w.]+\.Redis\(<[^<>]*<[^<>]*\(host=([^,]+),port=(\d+)[^<>]*>\)>\)>"
)


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
