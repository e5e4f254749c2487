"""A synthetic worker for measuring the API's relay alone: `python -m bench.writer`.

It appends text deltas to existing turns' streams at a fixed offered rate, one stream
entry per token exactly as the worker's `StreamWriter` encodes them (`shared.events.encode`,
which stamps `at`), then ends every turn with the same `TurnStore.finish` the worker uses.
With no LLM client in the loop, the API process is the only thing relaying, so the rate it
sustains is its own.

Reads one JSON object on stdin: `redis_url`, `turn_ids`, `tokens` (per turn), `rate`
(entries per second over all turns; 0 = as fast as Redis takes them), `maxlen`,
`retention_s`. Writes one JSON object on stdout: `started`, `ended` (wall clock),
`entries`.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import orjson
from redis.asyncio import Redis

from shared import keys
from shared.events import Delta, Done, encode
from shared.turns import STREAM_FIELD, TurnStore
from tests.upstream import echo_tokens


def synthetic_tokens(turn_id: str, count: int) -> list[str]:
    """The tokens the writer appends to `turn_id`'s stream, in order."""
    return echo_tokens(f"relay {turn_id}", count)


async def write(spec: dict[str, Any]) -> dict[str, Any]:
    """Append the deltas round by round (one token to every turn per round), then finish."""
    redis = Redis.from_url(spec["redis_url"])
    turn_ids: list[str] = spec["turn_ids"]
    tokens = {turn_id: synthetic_tokens(turn_id, spec["tokens"]) for turn_id in turn_ids}
    rate: float = spec["rate"]
    maxlen: int = spec["maxlen"]
    interval = len(turn_ids) / rate if rate > 0 else 0.0
    store = TurnStore(redis, retention_s=spec["retention_s"], stream_maxlen=maxlen)
    entries = 0
    started = time.time()
    due = time.monotonic()
    try:
        for index in range(spec["tokens"]):
            async with redis.pipeline(transaction=False) as pipe:
                for turn_id in turn_ids:
                    payload = encode(Delta(text=tokens[turn_id][index]))
                    pipe.xadd(
                        keys.events(turn_id),
                        {STREAM_FIELD: payload},
                        maxlen=maxlen,
                        approximate=True,
                    )
                await pipe.execute()
            entries += len(turn_ids)
            if interval:
                due += interval
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
        ended = time.time()
        for turn_id in turn_ids:
            owner = await redis.hget(keys.turn(turn_id), "owner")
            done = Done(status="completed", finish_reason="stop")
            await store.finish(turn_id, (owner or b"").decode(), done)
    finally:
        await redis.aclose()
    return {"started": started, "ended": ended, "entries": entries}


def main() -> None:
    """Entry point of `python -m bench.writer`."""
    spec = orjson.loads(sys.stdin.buffer.read())
    try:
        import uvloop

        result = uvloop.run(write(spec))
    except ImportError:  # pragma: no cover - uvloop ships with uvicorn[standard]
        result = asyncio.run(write(spec))
    sys.stdout.write(orjson.dumps(result).decode() + "\n")


if __name__ == "__main__":
    main()
