"""Start-up checks on the Redis server both processes share."""

from __future__ import annotations

import logging

from redis.asyncio import Redis
from redis.exceptions import RedisError


async def warn_if_evicting(redis: Redis, logger: logging.Logger) -> None:
    """Warn loudly when Redis may evict any key: an `allkeys-*` policy drops live streams."""
    try:
        policy = (await redis.config_get("maxmemory-policy")).get("maxmemory-policy", "")
    except RedisError:  # CONFIG may be disabled (managed Redis); nothing to check then
        return
    if str(policy).startswith("allkeys"):
        logger.warning(
            "Redis maxmemory-policy is %s: under memory pressure it evicts live turn streams "
            "and records. Use noeviction or a volatile-* policy.",
            policy,
        )
