"""A Redis at its `maxmemory` (`noeviction`: every write that grows it is refused), with a
real worker process and the API over real HTTP, past the memory guard (off here, as it is
between two of its samples): a new turn is refused with 503 `store_full`, a running turn
and a queued one end with a `store_full` terminal frame, and the worker stays alive and
serves turns again once memory is freed. Measured times are printed (`-s`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
import redis.asyncio as redis_asyncio
from redis.exceptions import OutOfMemoryError

from tests.support.chat import body
from tests.support.processes import ProcessGroup, has_redis_binary, private_redis
from tests.support.sse import collect, error_code, frames, text_of
from tests.support.stack import make_settings, run_stack
from tests.support.upstream import Reply, ScriptedUpstream
from tests.test_faults import read_to_content, read_to_done, turn_of, wait_turn

CHAT = "/v1/chat/completions"
# A full Redis is answered at once: well under a client's usual timeout.
REFUSED_WITHIN_S = 2.0
# Short leases: a worker whose liveness a full Redis refused would look dead within 2 s.
SHORT_LEASE = {"lease_ttl_s": 2.0, "lease_renew_s": 0.5}
# How long Redis stays full at least: past the worker's health check (every 10 s,
# worker/main.py), a write of arq's own poll.
FULL_FOR_S = 11.0

pytestmark = pytest.mark.skipif(
    not has_redis_binary(), reason="no redis-server binary to run a private Redis with"
)


async def fill(redis: redis_asyncio.Redis, prefix: str) -> None:
    """Write keys under `prefix` until Redis refuses one for its `maxmemory`, then lower
    that below what it uses, so that what Bernard frees meanwhile leaves it full."""
    value = b"x" * 32_768
    for n in range(100_000):
        try:
            await redis.set(f"{prefix}:{n}", value)
        except OutOfMemoryError:
            used = int((await redis.info("memory"))["used_memory"])
            await redis.config_set("maxmemory", used - 1_000_000)
            return
    raise AssertionError("Redis never refused a write: is maxmemory set?")


async def test_a_full_redis_refuses_and_ends_turns_and_the_worker_lives_on(
    upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    async with private_redis(tmp_path / "redis", "--maxmemory-policy", "noeviction") as server:
        # One slot, so a second turn waits queued; the guard off, as between its samples.
        settings = make_settings(
            upstream,
            redis_url=server.url,
            worker_concurrency=1,
            redis_memory_guard=0,
            **SHORT_LEASE,
        )
        filler = redis_asyncio.Redis.from_url(server.url)
        prefix = f"test:filler:{uuid.uuid4().hex[:8]}"
        async with ProcessGroup(tmp_path / "logs") as procs:
            worker = await procs.worker(settings)
            async with run_stack(settings, worker=False) as stack:
                gate = upstream.script(Reply.text(["first", " second"], block_after_first=True))
                async with (
                    stack.client.stream("POST", CHAT, json=body("running", stream=True)) as a,
                    stack.client.stream("POST", CHAT, json=body("queued", stream=True)) as b,
                ):
                    running, queued = frames(a), frames(b)
                    await read_to_content(running)
                    await gate.wait_blocked()
                    queued_id = b.headers["x-bernard-turn-id"]
                    assert (await turn_of(stack.client, queued_id))["status"] == "queued"

                    used = int((await filler.info("memory"))["used_memory"])
                    await filler.config_set("maxmemory", used + 4_000_000)
                    await fill(filler, prefix)
                    full_since = time.monotonic()

                    # A new turn: refused at once, in Bernard's envelope.
                    started = time.monotonic()
                    refused = await stack.chat("while full")
                    refused_s = time.monotonic() - started
                    assert refused.status_code == 503, refused.text
                    error = refused.json()["error"]
                    assert (error["code"], error["type"]) == ("store_full", "server_error")
                    assert "maxmemory" in error["message"]
                    assert refused.headers["retry-after"] == "10"
                    assert refused_s < REFUSED_WITHIN_S

                    # Quiet past its worker's lease: the worker still counts as alive.
                    await asyncio.sleep(SHORT_LEASE["lease_ttl_s"] + 1.0)
                    # The running turn's next write is refused: it ends with a clear frame.
                    released = time.monotonic()
                    gate.release()
                    rest = [frame for _, frame in await read_to_done(running, timeout_s=10)]
                    running_s = time.monotonic() - released
                    assert error_code(rest) == "store_full"
                    # The queued one is refused as its worker takes it.
                    waited = [frame for _, frame in await read_to_done(queued, timeout_s=10)]
                    queued_s = time.monotonic() - released
                    assert error_code(waited) == "store_full"
                    assert text_of(waited) == ""
                print(
                    f"\nRedis full: a new turn 503 store_full in {refused_s * 1000:.0f} ms; "
                    f"the running turn's terminal frame {running_s * 1000:.0f} ms after its "
                    f"next token, the queued one's {queued_s * 1000:.0f} ms"
                )
                # Reading goes on (each request is still counted against its user's rate).
                turn = await wait_turn(stack.client, queued_id, {"failed"})
                assert turn["error"]["code"] == "store_full"
                # Its job went with it: no poll takes it again.
                assert await filler.zscore(settings.queue_name, queued_id) is None
                assert await filler.exists(f"arq:job:{queued_id}") == 0

                await asyncio.sleep(max(0.0, full_since + FULL_FOR_S - time.monotonic()))
                worker.check_alive()

                # Room again: the same worker serves the next turn.
                async for key in filler.scan_iter(match=f"{prefix}:*", count=1000):
                    await filler.delete(key)
                after = await collect(stack.client, "POST", CHAT, json=body("next", stream=True))
                assert error_code(after) is None
                assert text_of(after) == "Hello from the scripted upstream."
                worker.check_alive()
        await filler.aclose()
