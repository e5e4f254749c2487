"""A synthetic worker for measuring the API's relay alone: `python -m bench.writer`.

It appends text deltas to existing turns' streams at a fixed offered rate, one stream
entry per token exactly as the worker's `StreamWriter` encodes them (`shared.events.encode`,
which stamps `at`), then ends every turn with the same `TurnStore.finish` the worker uses.
Each append carries its stream's wake-up, as the worker's do (shared/backends.py); on a
Cluster it writes to each primary on a plain client of its own.
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
from redis.asyncio import Redis, RedisCluster

from shared import keys
from shared.backends import Backend, ClusterBackend, ClusterNodeBackend, backend_of
from shared.connection import connect, connect_data
from shared.events import Delta, Done, TurnStatus, encode
from shared.streams import STREAM_FIELD
from shared.turns import TurnStore
from tests.support.upstream import echo_tokens


def synthetic_tokens(turn_id: str, count: int) -> list[str]:
    """The tokens the writer appends to `turn_id`'s stream, in order."""
    return echo_tokens(f"relay {turn_id}", count)


async def by_primary(backend: Backend, turn_ids: list[str]) -> list[tuple[Backend, list[str]]]:
    """The turns grouped by the primary holding their streams, each with a backend reaching
    that primary alone: on a Cluster, no client work per command to find the node. The
    caller closes the clients of backends other than `backend`."""
    if not isinstance(backend, ClusterBackend):
        return [(backend, turn_ids)]
    cluster = backend.client
    assert isinstance(cluster, RedisCluster)
    await cluster.initialize()  # nothing moves slots while the writer writes
    by_node: dict[tuple[str, int], list[str]] = {}
    for turn_id in turn_ids:
        node = cluster.get_node_from_key(keys.events(turn_id))
        assert node is not None
        by_node.setdefault((node.host, int(node.port)), []).append(turn_id)
    return [
        (ClusterNodeBackend(Redis(host=host, port=port)), ids)
        for (host, port), ids in by_node.items()
    ]


async def write(spec: dict[str, Any]) -> dict[str, Any]:
    """Append the deltas round by round (one token to every turn per round), then finish."""
    redis = connect_data(spec["redis_url"])
    # A turn's end is released on the queue role, which is never a Cluster (arq's queue).
    queue = connect(spec["queue_url"])
    turn_ids: list[str] = spec["turn_ids"]
    tokens = {turn_id: synthetic_tokens(turn_id, spec["tokens"]) for turn_id in turn_ids}
    rate: float = spec["rate"]
    maxlen: int = spec["maxlen"]
    interval = len(turn_ids) / rate if rate > 0 else 0.0
    store = TurnStore(redis, queue=queue, retention_s=spec["retention_s"], stream_maxlen=maxlen)
    backend = backend_of(redis)
    shards = await by_primary(backend, turn_ids)
    entries = 0
    started = time.time()
    due = time.monotonic()

    async def append(shard: Backend, ids: list[str], index: int) -> None:
        async with shard.client.pipeline(transaction=False) as pipe:
            for turn_id in ids:
                payload = encode(Delta(text=tokens[turn_id][index]))
                shard.append(pipe, turn_id, STREAM_FIELD, [payload], maxlen=maxlen)
            await pipe.execute()

    try:
        for index in range(spec["tokens"]):
            await asyncio.gather(*(append(shard, ids, index) for shard, ids in shards))
            entries += len(turn_ids)
            if interval:
                due += interval
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
        ended = time.time()
        for turn_id in turn_ids:
            owner = await redis.hget(keys.turn(turn_id), "owner")  # type: ignore[misc]
            done = Done(status=TurnStatus.COMPLETED, finish_reason="stop")
            await store.finish(turn_id, (owner or b"").decode(), done)
    finally:
        for shard, _ in shards:
            if shard is not backend:
                await shard.client.aclose()
        await redis.aclose()
        await queue.aclose()
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
