"""Faults, with real processes: workers and API processes dying, Redis restarting.

Every test runs its own private `redis-server` (tests/support/processes.py), so it can restart
Redis or SIGKILL a process without disturbing any other test, and its own queue. Worker
and API subprocesses get their settings through the environment, as in production; the
scripted upstream runs in the test's event loop and the subprocesses reach it over
loopback. Measured times are printed (run with `-s` to see them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared import keys
from tests.support.chat import body
from tests.support.processes import (
    ProcessGroup,
    RedisServer,
    has_redis_binary,
    private_redis,
    wait_for,
)
from tests.support.sse import Frame, collect, error_code, frames, is_keepalive, text_of, wire
from tests.support.stack import make_settings, run_stack, run_worker
from tests.support.upstream import Reply, ScriptedUpstream, requests_for

CHAT = "/v1/chat/completions"
# Issue 4's liveness target: a terminal frame within 10 s of a worker's death.
WORKER_LOST_TARGET_S = 10.0
# Short leases for the tests that do not measure the defaults (TTL 5 s, renewal 1 s).
SHORT_LEASE = {"lease_ttl_s": 2.0, "lease_renew_s": 0.5}
# How long Redis stays down when a test restarts it: longer than the API's quick retries.
REDIS_DOWN_S = 1.0

pytestmark = pytest.mark.skipif(
    not has_redis_binary(), reason="no redis-server binary to run a private Redis with"
)


@pytest.fixture
async def redis_server(tmp_path: Path) -> AsyncIterator[RedisServer]:
    """A private Redis for one test, always stopped afterwards."""
    async with private_redis(tmp_path / "redis") as server:
        yield server


def finished_normally(collected: list[Frame]) -> bool:
    """Whether the stream carries a finish_reason chunk (a completed turn)."""
    return any(
        not frame.done and any(c.get("finish_reason") for c in frame.json.get("choices") or [])
        for frame in collected
    )


async def read_to_content(stream: AsyncIterator[Frame], timeout_s: float = 10.0) -> list[Frame]:
    """Frames up to and including the first one with text."""
    seen: list[Frame] = []
    async with asyncio.timeout(timeout_s):
        while not (seen and seen[-1].content):
            seen.append(await anext(stream))
    return seen


async def read_to_done(stream: AsyncIterator[Frame], timeout_s: float) -> list[tuple[float, Frame]]:
    """(arrival time, frame) up to `[DONE]`; fails the test after `timeout_s` (a hang)."""
    got: list[tuple[float, Frame]] = []
    async with asyncio.timeout(timeout_s):
        async for frame in stream:
            got.append((time.monotonic(), frame))
            if frame.done:
                break
    assert got and got[-1][1].done, "the stream ended without [DONE]"
    return got


async def turn_of(client: httpx.AsyncClient, turn_id: str) -> dict[str, Any]:
    response = await client.get(f"/v1/turns/{turn_id}")
    assert response.status_code == 200, response.text
    return dict(response.json())


async def wait_turn(
    client: httpx.AsyncClient, turn_id: str, wanted: set[str], timeout_s: float = 10.0
) -> dict[str, Any]:
    async def reached() -> bool:
        return (await turn_of(client, turn_id))["status"] in wanted

    await wait_for(reached, timeout_s)
    return await turn_of(client, turn_id)


# -- a worker dies ---------------------------------------------------------------------------


@pytest.mark.parametrize("lease", [SHORT_LEASE, {}], ids=["short-lease", "default-lease"])
async def test_sigkilled_worker_fails_the_turn_within_the_target_and_never_reruns_it(
    upstream: ScriptedUpstream,
    redis_server: RedisServer,
    tmp_path: Path,
    lease: dict[str, float],
) -> None:
    settings = make_settings(upstream, redis_url=redis_server.url, **lease)
    prompt = "a turn whose worker is killed"
    gate = upstream.script(Reply.text(["first", " second"], block_after_first=True))
    async with ProcessGroup(tmp_path / "logs") as procs:
        doomed = await procs.worker(settings, name="doomed-worker")
        async with run_stack(settings, worker=False) as stack:
            async with stack.client.stream("POST", CHAT, json=body(prompt, stream=True)) as sse:
                turn_id = sse.headers["x-bernard-turn-id"]
                stream = frames(sse)
                await read_to_content(stream)
                await gate.wait_blocked()
                doomed.send(signal.SIGKILL)
                killed_at = time.monotonic()
                # A replacement starts at once, as a process supervisor would start one.
                fresh = procs.spawn_worker(settings, name="fresh-worker")
                rest = await read_to_done(stream, timeout_s=WORKER_LOST_TARGET_S + 10)

            got = [frame for _, frame in rest]
            error_after = next(t for t, f in rest if not f.done and "error" in f.json) - killed_at
            done_after = rest[-1][0] - killed_at
            print(
                f"\nworker SIGKILL (lease ttl {settings.lease_ttl_s} s, renew "
                f"{settings.lease_renew_s} s) -> error frame {error_after:.2f} s, "
                f"[DONE] {done_after:.2f} s"
            )
            assert error_code(got) == "worker_lost"
            assert done_after < WORKER_LOST_TARGET_S
            turn = await turn_of(stack.client, turn_id)
            assert turn["status"] == "failed" and turn["error"]["code"] == "worker_lost"
            ran = requests_for(upstream, prompt)
            assert ran == 1

            # A started job leaves arq's queue at once, so nothing is left to hand out
            # again, even once its in-progress key lapses (job_timeout + 10 s after the
            # kill; dropped here so the fresh worker would see the job now if it could).
            assert await stack.redis.zscore(settings.queue_name, turn_id) is None
            await stack.redis.delete(f"arq:in-progress:{turn_id}")
            await procs.worker_ready(fresh, settings)
            await asyncio.sleep(1.0)
            assert f"run_turn('{turn_id}')" not in fresh.output()
            assert requests_for(upstream, prompt) == ran, "the failed turn ran again"
            assert (await turn_of(stack.client, turn_id))["status"] == "failed"

            after = await collect(stack.client, "POST", CHAT, json=body("next", stream=True))
            assert after[-1].done and error_code(after) is None
            assert text_of(after) == "Hello from the scripted upstream."


async def test_sigterm_lets_the_running_turn_finish_and_leaves_queued_turns_queued(
    upstream: ScriptedUpstream, redis_server: RedisServer, tmp_path: Path
) -> None:
    """arq's `job_completion_wait`: the turn completes, once; new turns wait for a worker."""
    settings = make_settings(upstream, redis_url=redis_server.url, **SHORT_LEASE)
    prompt = "a turn running at SIGTERM"
    gate = upstream.script(Reply.text(["first", " second"], block_after_first=True))
    async with ProcessGroup(tmp_path / "logs") as procs:
        draining = await procs.worker(settings, name="draining-worker")
        async with run_stack(settings, worker=False) as stack:
            async with stack.client.stream("POST", CHAT, json=body(prompt, stream=True)) as sse:
                turn_id = sse.headers["x-bernard-turn-id"]
                stream = frames(sse)
                await read_to_content(stream)
                await gate.wait_blocked()
                draining.send(signal.SIGTERM)
                # arq logs this once its SIGTERM handler has stopped the worker taking jobs.
                await wait_for(lambda: "allow_pick_jobs to `False`" in draining.output(), 10)
                waiting = await stack.chat("created during the drain", background=True)
                assert waiting.status_code == 202
                waiting_id = waiting.json()["id"]
                await asyncio.sleep(0.5)
                assert draining.alive, "the worker must wait for its running turn"
                gate.release()
                released_at = time.monotonic()
                rest = await read_to_done(stream, timeout_s=10)

            got = [frame for _, frame in rest]
            assert error_code(got) is None and text_of(got) == " second"
            code = await draining.wait_exit(timeout_s=10)
            print(
                f"\nworker SIGTERM mid-turn: turn completed {rest[-1][0] - released_at:.2f} s "
                f"after the upstream resumed; worker exited {code}"
            )
            assert (await turn_of(stack.client, turn_id))["status"] == "completed"
            assert await stack.redis.zscore(settings.queue_name, turn_id) is None
            assert (await turn_of(stack.client, waiting_id))["status"] == "queued"

            async with run_worker(settings):
                await wait_turn(stack.client, waiting_id, {"completed"})
            assert requests_for(upstream, prompt) == 1


async def test_sigterm_past_the_grace_fails_the_turn_and_never_reruns_it(
    upstream: ScriptedUpstream, redis_server: RedisServer, tmp_path: Path
) -> None:
    """A turn outliving arq's shutdown grace ends `worker_shutdown`; the redelivery is dropped."""
    settings = make_settings(upstream, redis_url=redis_server.url, **SHORT_LEASE)
    prompt = "a turn outliving the shutdown grace"
    upstream.script(Reply.text(["first", " second"], block_after_first=True))
    async with ProcessGroup(tmp_path / "logs") as procs:
        draining = await procs.worker(
            settings,
            name="quick-shutdown-worker",
            settings_path="tests.support.processes.QuickShutdownWorkerSettings",
        )
        async with run_stack(settings, worker=False) as stack:
            async with stack.client.stream("POST", CHAT, json=body(prompt, stream=True)) as sse:
                turn_id = sse.headers["x-bernard-turn-id"]
                stream = frames(sse)
                await read_to_content(stream)
                draining.send(signal.SIGTERM)
                signalled_at = time.monotonic()
                rest = await read_to_done(stream, timeout_s=10)

            assert error_code([frame for _, frame in rest]) == "worker_shutdown"
            print(f"\nworker SIGTERM, grace 1 s: [DONE] {rest[-1][0] - signalled_at:.2f} s")
            exchange = await upstream.wait_disconnect(timeout_s=5)
            assert exchange.completed_at is None, "the upstream call must be aborted"
            await draining.wait_exit(timeout_s=10)
            turn = await turn_of(stack.client, turn_id)
            assert turn["status"] == "failed" and turn["error"]["code"] == "worker_shutdown"
            # arq logs "will be run again", but the job left the queue when it started:
            # there is nothing to run again.
            assert await stack.redis.zscore(settings.queue_name, turn_id) is None

            async with run_worker(settings):
                await asyncio.sleep(1.0)
            assert requests_for(upstream, prompt) == 1, "the failed turn ran again"
            assert (await turn_of(stack.client, turn_id))["status"] == "failed"


# -- an API process dies ---------------------------------------------------------------------


async def test_a_stream_resumes_exactly_on_another_api_process_after_the_first_dies(
    upstream: ScriptedUpstream, redis_server: RedisServer, tmp_path: Path
) -> None:
    settings = make_settings(upstream, redis_url=redis_server.url)
    tokens = [f" w{i}" for i in range(30)]
    gate = upstream.script(Reply.text(tokens, block_after=5, chunk_delay=0.02))
    request = body("resume me elsewhere", stream=True, on_disconnect="continue")
    async with ProcessGroup(tmp_path / "logs") as procs, run_worker(settings):
        api_a, api_b = await asyncio.gather(
            procs.api(settings, name="api-a"), procs.api(settings, name="api-b")
        )
        async with httpx.AsyncClient(timeout=30.0) as client:
            seen: list[Frame] = []
            async with client.stream("POST", f"{api_a.base_url}{CHAT}", json=request) as sse:
                turn_id = sse.headers["x-bernard-turn-id"]
                stream = frames(sse)
                await gate.wait_blocked()
                async with asyncio.timeout(10):
                    while text_of(seen) != "".join(tokens[:5]):
                        seen.append(await anext(stream))
                api_a.send(signal.SIGKILL)
                # Whatever A had sent before it died still reaches the client; then it breaks.
                with contextlib.suppress(httpx.HTTPError):
                    async with asyncio.timeout(5):
                        async for frame in stream:
                            seen.append(frame)
            await api_a.wait_exit(timeout_s=5)

            # Part of the rest is written while no client is attached anywhere.
            gate.release()
            exchange = upstream.exchanges[-1]
            await wait_for(lambda: exchange.chunks_sent >= 15, 10, interval_s=0.01)
            last_id = [f for f in seen if not is_keepalive(f)][-1].id
            events = f"{api_b.base_url}/v1/turns/{turn_id}/events"
            resumed = await collect(client, "GET", events, headers={"Last-Event-ID": last_id})
            replay = await collect(client, "GET", events)

    ids = [frame_id for frame_id, _ in wire(seen + resumed)]
    assert len(ids) == len(set(ids)), "a frame was delivered twice"
    assert wire(seen + resumed) == wire(replay)
    assert replay[-1].done and text_of(replay) == "".join(tokens)
    print(f"\nAPI A killed after {len(wire(seen))} frames; B resumed with {len(wire(resumed))}")


# -- Redis restarts --------------------------------------------------------------------------


async def test_api_and_worker_reconnect_after_redis_restarts_while_idle(
    upstream: ScriptedUpstream, redis_server: RedisServer
) -> None:
    settings = make_settings(upstream, redis_url=redis_server.url)
    async with run_stack(settings) as stack:
        before = await collect(stack.client, "POST", CHAT, json=body("before", stream=True))
        assert before[-1].done and error_code(before) is None

        downtime = await redis_server.restart(down_s=REDIS_DOWN_S)
        restarted_at = time.monotonic()
        attempts = 0
        async with asyncio.timeout(20):
            while True:
                attempts += 1
                request = body("after the restart", stream=True)
                async with stack.client.stream("POST", CHAT, json=request) as sse:
                    if sse.status_code == 200:
                        after = [frame async for frame in frames(sse)]
                        break
                    await sse.aread()
                    assert sse.status_code == 503, sse.text
                await asyncio.sleep(0.1)
        took = time.monotonic() - restarted_at
        assert after[-1].done and error_code(after) is None
        assert text_of(after) == "Hello from the scripted upstream."

        async def ready() -> bool:
            return (await stack.client.get("/readyz")).status_code == 200

        await wait_for(ready, 10)
        print(
            f"\nRedis restart while idle: down {downtime:.2f} s; next turn completed "
            f"{took:.2f} s after Redis was back ({attempts} attempt(s)); /readyz 200 after "
            f"{time.monotonic() - restarted_at:.2f} s"
        )


async def test_turns_caught_by_a_redis_restart_end_and_never_hang(
    upstream: ScriptedUpstream, redis_server: RedisServer
) -> None:
    """The restart loses the turns (no persistence): every client still gets an ending."""
    settings = make_settings(upstream, redis_url=redis_server.url, keepalive_s=1.0)
    streamed_gate = upstream.script(Reply.text(["first", " second"], block_after_first=True))
    waited_gate = upstream.script(Reply.text(["one", " two"], block_after_first=True))
    async with run_stack(settings) as stack:
        async with stack.client.stream("POST", CHAT, json=body("streamed", stream=True)) as sse:
            stream = frames(sse)
            seen = await read_to_content(stream)
            await streamed_gate.wait_blocked()
            waited = asyncio.create_task(stack.client.post(CHAT, json=body("waited")))
            try:
                await waited_gate.wait_blocked()
                await redis_server.restart(down_s=REDIS_DOWN_S)
                streamed_gate.release()
                waited_gate.release()
                released_at = time.monotonic()
                rest = await read_to_done(stream, timeout_s=30)
                async with asyncio.timeout(30):
                    answer = await waited
                answered_after = time.monotonic() - released_at
            finally:
                waited.cancel()

        got = [*seen, *(frame for _, frame in rest)]
        code = error_code(got)
        print(
            f"\nRedis restart mid-turn (keepalive {settings.keepalive_s} s): stream "
            f"{'error ' + code if code else 'completed'}, [DONE] "
            f"{rest[-1][0] - released_at:.2f} s after the upstream resumed; non-stream "
            f"request answered {answer.status_code} after {answered_after:.2f} s"
        )
        assert code is not None or finished_normally(got)
        assert answer.status_code == 200 or answer.json()["error"]["code"] == "turn_lost"

        async def no_stream_lives_forever() -> bool:
            streams = await stack.redis.keys(keys.events("*"))
            return all([await stack.redis.ttl(key) > 0 for key in streams])

        # What the workers wrote after the restart must not outlive the lost turns forever.
        await wait_for(no_stream_lives_forever, 5)

        after = await collect(stack.client, "POST", CHAT, json=body("after", stream=True))
        assert after[-1].done and error_code(after) is None


async def test_an_allkeys_eviction_policy_is_warned_about_by_api_and_worker(
    upstream: ScriptedUpstream, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def warned() -> set[str]:
        """The loggers that warned about the eviction policy."""
        return {
            r.name
            for r in caplog.records
            if r.levelno == logging.WARNING and "allkeys-lru" in r.getMessage()
        }

    bernard = logging.getLogger("bernard")
    # Bernard's logger may not propagate to the root logger caplog listens on: attach it.
    bernard.addHandler(caplog.handler)
    try:
        lru = private_redis(tmp_path / "lru", "--maxmemory-policy", "allkeys-lru")
        async with lru as server, run_stack(make_settings(upstream, redis_url=server.url)):
            await wait_for(lambda: {"bernard.api", "bernard.worker"} <= warned(), 10)
    finally:
        bernard.removeHandler(caplog.handler)


async def test_a_worker_started_before_its_redis_says_so_and_starts_once_it_answers(
    upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    server = RedisServer(tmp_path / "redis")  # its port is chosen; nothing listens yet
    settings = make_settings(upstream, redis_url=server.url)
    try:
        async with ProcessGroup(tmp_path / "logs") as procs:
            worker = procs.spawn_worker(settings)
            # The worker's imports come first: as long as `worker_ready` allows on a loaded box.
            await wait_for(lambda: "does not answer" in worker.output(), timeout_s=30)
            assert f"redis://127.0.0.1:{server.port}/0" in worker.output()
            await asyncio.sleep(1.5)
            worker.check_alive()  # still waiting, not dead
            await server.start()
            await procs.worker_ready(worker, settings, timeout_s=15)
            api = await procs.api(settings)
            async with httpx.AsyncClient(base_url=api.base_url, timeout=30) as client:
                answer = await client.post(CHAT, json=body("hello"))
            assert answer.status_code == 200, answer.text
            assert "answers; starting" in worker.output()
    finally:
        server.kill()
