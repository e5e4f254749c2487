"""How fast one user may ask: a token bucket per user, shared by every API process.

The bucket (`keys.rate(owner)`, a hash on the queue role beside the user's other counters)
holds up to `BERNARD_RATE_LIMIT_BURST` tokens and refills at
`BERNARD_RATE_LIMIT_PER_MINUTE`. Every authenticated request under `/v1` takes one token
(api/auth.py); a request that starts a turn takes `BERNARD_RATE_LIMIT_TURN_COST` instead,
inside the script that admits the turn (shared/turns/admission.py `TurnStore.admit`), so the limit
costs a turn no round trip. An open stream is never charged again (frames, keepalives):
only opening it is a request. A request the bucket cannot pay is refused (429
`rate_limit_exceeded`) with how long until it could be (`Retry-After`), and takes nothing.

Taking and refilling are one script, so the limit holds across processes. The clock is the
callers' (as for the other per-user counters): the bucket's time only moves forward, so a
process whose clock lags refills nothing, and one ahead refills at most its lead's worth.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from redis.asyncio import Redis

from shared import keys
from shared.settings import Settings

__all__ = ["TAKE_TOKENS_FUNCTION", "Rate", "RateLimitedError", "RateLimiter"]

# Lua: `take(key, now, per_s, burst, cost)` takes `cost` tokens from the bucket at `key`,
# refilled at `per_s` a second up to `burst` since it was last touched; returns 0 taken,
# else the milliseconds until it could be (the bucket unchanged). A bucket it never saw
# is full. It expires once it would be full again. Its first write is the PEXPIRE, which
# Redis runs at its maxmemory and which so lets the rest of the script through (Redis checks
# a script's first write alone): a full Redis still counts requests, so reading and
# deleting go on (the bucket is a few bytes a user).
TAKE_TOKENS_FUNCTION = """
local function take(key, now, per_s, burst, cost)
  local held = redis.call('HMGET', key, 'tokens', 'at')
  local tokens, at = tonumber(held[1]) or burst, tonumber(held[2]) or now
  if now > at then
    tokens = math.min(burst, tokens + (now - at) * per_s)
    at = now
  end
  if tokens < cost then return math.ceil((cost - tokens) / per_s * 1000) end
  local ttl = math.ceil(burst / per_s * 1000) + 1000
  local existed = redis.call('PEXPIRE', key, ttl)
  redis.call('HSET', key, 'tokens', tokens - cost, 'at', at)
  if existed == 0 then redis.call('PEXPIRE', key, ttl) end
  return 0
end
"""

# KEYS: bucket. ARGV: now, refill per s, burst, cost. See `take` above.
_TAKE = (
    TAKE_TOKENS_FUNCTION
    + "return take(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), "
    "tonumber(ARGV[4]))"
)


@dataclass(frozen=True, slots=True)
class Rate:
    """A bucket of `burst` tokens refilled at `per_s` a second; a turn costs `turn_cost`."""

    per_s: float
    burst: int
    turn_cost: int

    @classmethod
    def of(cls, settings: Settings) -> Rate | None:
        """The settings' rate; None when the limit is off (0 a minute)."""
        if settings.rate_limit_per_minute <= 0:
            return None
        return cls(
            per_s=settings.rate_limit_per_minute / 60,
            burst=settings.rate_limit_burst,
            turn_cost=settings.rate_limit_turn_cost,
        )

    def args(self, cost: int, now: float) -> list[str | float | int]:
        """The script arguments that take `cost` tokens at `now`."""
        return [repr(now), repr(self.per_s), self.burst, cost]


class RateLimitedError(Exception):
    """The owner's bucket cannot pay the request yet: `retry_after_s` until it can."""

    def __init__(self, wait_ms: int) -> None:
        super().__init__(f"rate limited for {wait_ms} ms")
        self.retry_after_s = max(1, math.ceil(wait_ms / 1000))


class RateLimiter:
    """Takes tokens from users' buckets on `queue` (the queue role)."""

    def __init__(self, queue: Redis, rate: Rate | None) -> None:
        self.rate = rate
        self._take = queue.register_script(_TAKE)

    async def take(self, owner: str, cost: int = 1, *, now: float | None = None) -> None:
        """Take `cost` tokens from the owner's bucket, or raise `RateLimitedError`; nothing
        when the limit is off. `now` (epoch seconds) is for tests that move time."""
        if self.rate is None:
            return
        at = time.time() if now is None else now
        wait_ms = int(await self._take(keys=[keys.rate(owner)], args=self.rate.args(cost, at)))
        if wait_ms > 0:
            raise RateLimitedError(wait_ms)
