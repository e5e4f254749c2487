"""Start-up checks on the Redis server both processes share."""

from __future__ import annotations

import logging

from redis.asyncio import Redis
from redis.exceptions import RedisClusterException, RedisError


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
