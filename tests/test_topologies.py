"""Bernard beyond one Redis, on real topologies on loopback (tests/support/topologies.py).

Two deployments run the key cases of the pipeline and lifecycle suites (a stream, resume,
cancel, a background turn, the user's event stream, a worker's death):

- `cluster`: the data role on a Redis Cluster (3 primaries, 3 replicas), the queue role
  on a plain Redis of its own, as arq needs one primary;
- `sentinel`: both roles on the primary that three Sentinels name.

Then a conversation's moves, each a script in its own slot, and what only those topologies
can do to a turn: a primary SIGKILLed mid-turn and
replaced by its replica (Sentinel), the slot of a streaming turn moved to another node
(Cluster), and the exactness check at 100 streams on the Cluster.

These start real servers for every test: they carry the `topology` marker, which the
default run leaves out; `./run test-topologies` runs them (docs/testing.md).
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.asyncio.cluster import ClusterNode as RedisClusterNode

from api.store_guard import StoreGuard
from launcher.redis_server import free_port
from shared import keys
from shared.backends import backend_of
from shared.connection import connect_data
from shared.events import TimerFired
from shared.settings import Settings
from shared.timers import publish
from tests.support.chat import body
from tests.support.processes import ProcessGroup, private_redis, wait_for
from tests.support.sse import Frame, collect, error_code, frames, named_events, text_of, wire
from tests.support.stack import Stack, make_settings, run_stack
from tests.support.topologies import (
    ClusterNode,
    RedisClusterTopology,
    SentinelTopology,
    started_cluster,
    started_sentinel,
    topologies_missing,
)
from tests.support.upstream import (
    Reply,
    ScriptedUpstream,
    echo_responder,
    echo_tokens,
    requests_for,
)
from tests.support.users import ALICE, keys_for_two
from tests.test_conversation_races import (
    Switches,
    approve_while_a_message_arrives,
    route,
)
from tests.test_exactness import STREAMS
from tests.test_exactness import check as check_exact
from tests.test_timers import events_of

pytestmark = [
    pytest.mark.topology,
    pytest.mark.skipif(topologies_missing() is not None, reason=str(topologies_missing())),
]

CHAT = "/v1/chat/completions"
SHORT_LEASE = {"lease_ttl_s": 2.0, "lease_renew_s": 0.5}


@dataclass
class Deployment:
    """Where each role lives, and the topology behind them."""

    name: str
    data_url: str
    queue_url: str
    topology: RedisClusterTopology | SentinelTopology

    def settings(self, upstream: ScriptedUpstream, **overrides: Any) -> Settings:
        return make_settings(
            upstream, redis_url=self.data_url, queue_redis_url=self.queue_url, **overrides
        )


@pytest.fixture(params=["cluster", "sentinel"])
async def deployment(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Deployment]:
    if request.param == "cluster":
        async with (
            started_cluster(tmp_path / "cluster") as cluster,
            private_redis(tmp_path / "queue") as queue,
        ):
            yield Deployment("cluster", cluster.url, queue.url, cluster)
    else:
        async with started_sentinel(tmp_path / "sentinel") as sentinel:
            yield Deployment("sentinel", sentinel.url, sentinel.url, sentinel)


async def status(stack: Stack, turn_id: str, wanted: set[str], timeout_s: float = 20) -> dict:
    async def reached() -> bool:
        return (await stack.client.get(f"/v1/turns/{turn_id}")).json()["status"] in wanted

    await wait_for(reached, timeout_s)
    return dict((await stack.client.get(f"/v1/turns/{turn_id}")).json())


# -- the key cases, on both deployments --------------------------------------------------


async def test_a_streamed_turn_arrives_whole_in_order_and_replays_the_same(
    deployment: Deployment, upstream: ScriptedUpstream
) -> None:
    upstream.responder = echo_responder(60, chunk_delay=0.002)
    async with run_stack(deployment.settings(upstream)) as stack:
        prompt = f"a stream on {deployment.name}"
        async with stack.client.stream("POST", CHAT, json=body(prompt, stream=True)) as sse:
            turn_id = sse.headers["x-bernard-turn-id"]
            live = [frame async for frame in frames(sse)]
        check_exact(live, echo_tokens(prompt, 60))
        assert wire(await stack.replay(turn_id)) == wire(live)
        assert (await status(stack, turn_id, {"completed"}))["status"] == "completed"


async def test_resuming_after_every_frame_gives_exactly_the_rest(
    deployment: Deployment, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.text([f"t{i} " for i in range(8)], usage=(3, 8)))
    async with run_stack(deployment.settings(upstream)) as stack:
        response = await stack.client.post(CHAT, json=body("resume me", stream=True))
        turn_id = response.headers["x-bernard-turn-id"]
        full = await stack.replay(turn_id)
        assert full[-1].done and text_of(full) == "".join(f"t{i} " for i in range(8))
        for k, frame in enumerate(full[:-1]):
            rest = await stack.replay(turn_id, after=frame.id)
            assert wire(full[: k + 1] + rest) == wire(full), f"resume after frame {k}"


async def test_cancelling_a_background_turn_stops_it_and_closes_the_upstream(
    deployment: Deployment, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.slow(interval=0.01))
    async with run_stack(deployment.settings(upstream)) as stack:
        turn = (await stack.client.post(CHAT, json=body("cancel me", background=True))).json()
        await upstream.wait_requests(1)
        cancelled = await stack.client.post(f"/v1/turns/{turn['id']}/cancel")
        assert cancelled.json()["status"] == "cancelled"
        assert (await upstream.wait_disconnect(timeout_s=10)).ended
        events = await stack.replay(turn["id"])
        assert events[-2].json["error"]["code"] == "turn_cancelled" and events[-1].done


async def test_a_background_turn_runs_with_nobody_attached(
    deployment: Deployment, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.text(["in", " the", " background"], chunk_delay=0.01))
    async with run_stack(deployment.settings(upstream)) as stack:
        response = await stack.client.post(CHAT, json=body("later", background=True, stream=True))
        assert response.status_code == 202
        done = await status(stack, response.json()["id"], {"completed"})
        assert done["result"]["choices"][0]["message"]["content"] == "in the background"
        events = await stack.replay(done["id"])
        assert text_of(events) == "in the background" and events[-1].done


async def test_the_users_event_stream_delivers_what_is_published_to_it(
    deployment: Deployment, upstream: ScriptedUpstream
) -> None:
    user = f"user-{uuid.uuid4().hex[:8]}"
    settings = deployment.settings(upstream, api_keys=f"key-u:{user}")
    headers = {"Authorization": "Bearer key-u"}
    async with run_stack(settings, worker=False) as stack:
        waiting = asyncio.create_task(events_of(stack.base_url, headers, 1, 20))
        await asyncio.sleep(0.5)  # connected: it gets the next event on
        fired = TimerFired(timer_id="t", label="tea", conversation_id=None, due_at=0)
        await publish(stack.redis, user, fired, retention_s=60)
        assert [(event, data["label"]) for _, event, data in await waiting] == [
            ("timer_fired", "tea")
        ]


async def test_a_sigkilled_worker_ends_its_turn_worker_lost_and_it_never_runs_again(
    deployment: Deployment, upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    settings = deployment.settings(upstream, **SHORT_LEASE)
    prompt = f"a worker dies on {deployment.name}"
    gate = upstream.script(Reply.text(["first", " second"], block_after_first=True))
    async with ProcessGroup(tmp_path / "logs") as procs:
        doomed = await procs.worker(settings, name="doomed-worker")
        async with run_stack(settings, worker=False) as stack:
            async with stack.client.stream("POST", CHAT, json=body(prompt, stream=True)) as sse:
                turn_id = sse.headers["x-bernard-turn-id"]
                stream = frames(sse)
                seen = [await anext(stream)]
                await gate.wait_blocked()
                doomed.send(signal.SIGKILL)
                async with asyncio.timeout(20):
                    seen += [frame async for frame in stream]
            assert seen[-1].done and error_code(seen) == "worker_lost"
            fresh = await procs.worker(settings, name="fresh-worker")
            after = await collect(stack.client, "POST", CHAT, json=body("next", stream=True))
            assert after[-1].done and error_code(after) is None
            assert f"run_turn('{turn_id}')" not in fresh.output()
            assert requests_for(upstream, prompt) == 1, "the turn ran again"


# -- a Sentinel failover -------------------------------------------------------------------


@pytest.fixture
async def quick_sentinel(tmp_path: Path) -> AsyncIterator[SentinelTopology]:
    """Sentinels that call a silent primary down after 1.5 s."""
    async with started_sentinel(tmp_path / "sentinel", down_after_ms=1500) as topology:
        yield topology


async def test_a_primary_killed_mid_turn_fails_over_and_the_client_is_told_never_left_hanging(
    quick_sentinel: SentinelTopology, upstream: ScriptedUpstream
) -> None:
    url = quick_sentinel.url
    # Leases that outlast the failover: what ends the turn is its worker seeing the new
    # primary, not a reaper taking a worker that could not renew for a while for dead.
    settings = make_settings(upstream, redis_url=url, queue_redis_url=url, lease_ttl_s=20.0)
    prompt = "a turn whose Redis dies"
    upstream.script(Reply.slow(interval=0.02, token=" word"))
    async with run_stack(settings) as stack:
        async with stack.client.stream("POST", CHAT, json=body(prompt, stream=True)) as sse:
            turn_id = sse.headers["x-bernard-turn-id"]
            stream = frames(sse)
            live: list[Frame] = []
            async with asyncio.timeout(20):
                while text_of(live).count("word") < 20:
                    live.append(await anext(stream))
            await asyncio.sleep(0.5)  # let the replica catch up with the turn's claim
            quick_sentinel.primary.kill()  # SIGKILL
            killed_at = time.monotonic()
            await quick_sentinel.wait_failover(timeout_s=30)
            promoted_after = time.monotonic() - killed_at
            async with asyncio.timeout(60):  # never a hang
                live += [frame async for frame in stream]
        told_after = time.monotonic() - killed_at
        print(
            f"\nprimary SIGKILL -> replica promoted {promoted_after:.1f} s, "
            f"[DONE] {told_after:.1f} s"
        )

        assert live[-1].done
        # The worker saw its primary change and stopped the turn, saying why.
        code = error_code(live)
        assert code == "store_failover", code
        assert requests_for(upstream, prompt) == 1, "the turn ran again"
        turn = await status(stack, turn_id, {"failed"})
        assert turn["error"]["code"] == code
        # A client resuming now gets what the new primary holds, ending the same way.
        replayed = await stack.replay(turn_id)
        assert replayed[-1].done and error_code(replayed) == code

        # New turns work on the promoted replica.
        upstream.script(Reply.text(["after", " failover"]))
        after = await collect(stack.client, "POST", CHAT, json=body("next", stream=True))
        assert after[-1].done and error_code(after) is None
        assert text_of(after) == "after failover"


async def test_a_failover_is_counted_by_the_client_that_follows_it(
    quick_sentinel: SentinelTopology,
) -> None:
    client = connect_data(quick_sentinel.url)
    try:
        await client.set("bernard:test:failover", "1")
        assert backend_of(client).failovers() == 0
        quick_sentinel.primary.kill()
        await quick_sentinel.wait_failover(timeout_s=30)
        await client.get("bernard:test:failover")  # reconnects to the promoted replica
        assert backend_of(client).failovers() == 1
    finally:
        await client.aclose()


# -- a Cluster failover ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "node_timeout_ms",
    [
        # Failed over within the client's own retries, or nearly: a write may land on the
        # promoted replica as if nothing had happened (its view of the slots says otherwise),
        # or fail on a connection the kill closed.
        pytest.param(1500, id="quick"),
        # The turn's writes, and the first tries of its ending, give up before the replica
        # takes over: its worker writes the ending once it can.
        pytest.param(8000, id="slow"),
    ],
)
async def test_the_primary_holding_a_turn_killed_mid_turn_on_a_cluster_ends_it_store_failover(
    node_timeout_ms: int,
    upstream: ScriptedUpstream,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The Cluster node serving a streaming turn's slot is SIGKILLed and its replica takes
    the slot over: the turn's worker, alive all along, ends it `store_failover` itself and
    its client reads so within seconds of the promotion."""
    prompt = "a turn whose shard dies"
    upstream.script(Reply.slow(interval=0.02, token=" word"))
    async with (
        started_cluster(tmp_path / "cluster", node_timeout_ms=node_timeout_ms) as cluster,
        private_redis(tmp_path / "queue") as queue,
    ):
        settings = make_settings(upstream, redis_url=cluster.url, queue_redis_url=queue.url)
        async with run_stack(settings) as stack:
            async with stack.client.stream("POST", CHAT, json=body(prompt, stream=True)) as sse:
                turn_id = sse.headers["x-bernard-turn-id"]
                stream = frames(sse)
                live: list[Frame] = []
                async with asyncio.timeout(20):
                    while text_of(live).count("word") < 20:
                        live.append(await anext(stream))
                await asyncio.sleep(0.5)  # let the replica catch up with the turn's claim
                home = await cluster.primary_of(keys.events(turn_id))
                home.kill()  # SIGKILL
                killed_at = time.monotonic()
                await cluster.wait_promoted(keys.events(turn_id), home, timeout_s=30)
                promoted_after = time.monotonic() - killed_at
                async with asyncio.timeout(60):  # never a hang
                    live += [frame async for frame in stream]
            told_after = time.monotonic() - killed_at
            print(
                f"\nshard primary SIGKILL -> replica promoted {promoted_after:.1f} s, "
                f"[DONE] {told_after:.1f} s"
            )

            assert live[-1].done
            code = error_code(live)
            assert code == "store_failover", code
            assert told_after - promoted_after < 5.0, "told within seconds of the promotion"
            # The worker's own ending: its job never failed, so no reaper had to.
            failed = [r.getMessage() for r in caplog.records if "run_turn failed" in r.getMessage()]
            assert failed == []
            assert requests_for(upstream, prompt) == 1, "the turn ran again"
            turn = await status(stack, turn_id, {"failed"})
            assert turn["error"]["code"] == code
            replayed = await stack.replay(turn_id)
            assert replayed[-1].done and error_code(replayed) == code

            # New turns work on the promoted replica.
            upstream.script(Reply.text(["after", " failover"]))
            after = await collect(stack.client, "POST", CHAT, json=body("next", stream=True))
            assert after[-1].done and error_code(after) is None
            assert text_of(after) == "after failover"


async def test_a_cluster_client_counts_a_shards_failover_for_that_shards_slots_alone(
    tmp_path: Path,
) -> None:
    """A promoted replica is a failover of its slots (shared/backends.py `failovers`); a
    slot that migrated to another primary is none, and nor are the other shards' slots."""
    async with started_cluster(tmp_path / "cluster", node_timeout_ms=1500) as cluster:
        client = connect_data(cluster.url)
        backend = backend_of(client)
        try:
            dead = await cluster.primary_of(keys.events("a"))
            moving, other = await _streams_off(cluster, dead, count=2)
            for stream_id in ("a", moving, other):
                await client.set(keys.events(stream_id), "1")
            to = next(n for n in await cluster.primaries() if n is not dead)
            if to is await cluster.primary_of(keys.events(moving)):
                to = next(n for n in await cluster.primaries() if n not in (dead, to))
            await cluster.migrate_slot(keys.events(moving), to)
            dead.kill()
            await cluster.wait_promoted(keys.events("a"), dead, timeout_s=30)
            async with asyncio.timeout(30):  # its next commands find the new primary
                for stream_id in ("a", moving, other):
                    assert await client.get(keys.events(stream_id)) == b"1"
            assert backend.failovers("a") == 1
            assert (backend.failovers(moving), backend.failovers(other)) == (0, 0)
            assert backend.failovers() == 1
        finally:
            await client.aclose()


async def _streams_off(
    cluster: RedisClusterTopology, node: ClusterNode, *, count: int
) -> list[str]:
    """`count` stream ids whose keys another primary than `node` holds."""
    found: list[str] = []
    for n in range(1000):
        if await cluster.primary_of(keys.events(f"s{n}")) is not node:
            found.append(f"s{n}")
            if len(found) == count:
                return found
    raise RuntimeError("no stream off that node")


async def test_a_cluster_client_that_lost_every_startup_node_reads_the_cluster_again(
    redis_cluster: RedisClusterTopology,
) -> None:
    """redis-py drops a node from those it reads the cluster from at each connection error,
    a live node's too; once none is left every command failed for good. The nodes the URL
    names are read again."""
    client = connect_data(redis_cluster.url)
    try:
        await client.set("bernard:test:seeds", "1")
        client.nodes_manager.startup_nodes.clear()  # type: ignore[attr-defined]
        await client.aclose()  # its next command reads the cluster again
        assert await client.get("bernard:test:seeds") == b"1"
    finally:
        await client.aclose()


async def test_a_cluster_client_reads_the_cluster_again_while_commands_drop_startup_nodes(
    redis_cluster: RedisClusterTopology,
) -> None:
    """While a client reads the cluster from its startup nodes (the first one dead: its
    connect is retried), another command drops one of them, as a connection error does:
    the read goes on (redis-py's loop over them raised "dictionary changed size during
    iteration", which once killed an API's stream hub)."""
    client = connect_data(redis_cluster.url)
    try:
        await client.set("bernard:test:startup", "1")
        startup = client.nodes_manager.startup_nodes  # type: ignore[attr-defined]
        known = list(startup.items())
        startup.clear()
        port = free_port()  # nothing listens there
        kwargs = client.nodes_manager.connection_kwargs  # type: ignore[attr-defined]
        startup[f"127.0.0.1:{port}"] = RedisClusterNode("127.0.0.1", port, **kwargs)
        startup.update(known)
        await client.aclose()  # its next command reads the cluster again

        async def drop_one() -> None:
            await asyncio.sleep(0.01)  # while the dead node's connect is retried
            startup.pop(known[-1][0])

        got, _ = await asyncio.gather(client.get("bernard:test:startup"), drop_one())
        assert got == b"1"
    finally:
        await client.aclose()


# -- a Cluster: slots move, and a hundred streams ------------------------------------------


async def test_a_turns_slot_moving_to_another_node_mid_stream_leaves_the_stream_exact(
    redis_cluster: RedisClusterTopology,
    upstream: ScriptedUpstream,
    tmp_path: Path,
) -> None:
    tokens = 150
    upstream.responder = echo_responder(tokens, chunk_delay=0.01)
    prompt = "a stream whose slot moves"
    async with private_redis(tmp_path / "queue") as queue:
        settings = make_settings(upstream, redis_url=redis_cluster.url, queue_redis_url=queue.url)
        async with run_stack(settings) as stack:
            async with stack.client.stream("POST", CHAT, json=body(prompt, stream=True)) as sse:
                turn_id = sse.headers["x-bernard-turn-id"]
                stream = frames(sse)
                live = [await anext(stream), await anext(stream)]
                key = keys.events(turn_id)
                home = await redis_cluster.primary_of(key)
                away = next(n for n in await redis_cluster.primaries() if n is not home)
                moved = await redis_cluster.migrate_slot(key, away)
                live.append(await anext(stream))
                moved_back = await redis_cluster.migrate_slot(key, home)
                async with asyncio.timeout(60):
                    live += [frame async for frame in stream]
            assert moved >= 2 and moved_back >= 2, "the turn's keys moved with the slot"
            check_exact(live, echo_tokens(prompt, tokens))
            assert wire(await stack.replay(turn_id)) == wire(live)
            assert (await status(stack, turn_id, {"completed"}))["status"] == "completed"


async def test_a_turn_that_ends_while_its_slot_is_mid_migration_completes_exact(
    redis_cluster: RedisClusterTopology,
    upstream: ScriptedUpstream,
    tmp_path: Path,
) -> None:
    """The turn's keys moved to another node and its slot not handed over yet when the
    turn ends: its ending (a script of four keys, two never there) is answered TRYAGAIN
    until the hand-over, and waits for it (compat/redis_cluster.py)."""
    tokens = 40
    upstream.responder = echo_responder(tokens, chunk_delay=0.01)
    prompt = "a turn that ends mid-migration"
    async with private_redis(tmp_path / "queue") as queue:
        settings = make_settings(upstream, redis_url=redis_cluster.url, queue_redis_url=queue.url)
        async with run_stack(settings) as stack:
            async with stack.client.stream("POST", CHAT, json=body(prompt, stream=True)) as sse:
                turn_id = sse.headers["x-bernard-turn-id"]
                stream = frames(sse)
                live = [await anext(stream), await anext(stream)]
                key = keys.events(turn_id)
                home = await redis_cluster.primary_of(key)
                away = next(n for n in await redis_cluster.primaries() if n is not home)
                assert await redis_cluster.move_keys(key, away) >= 2
                await asyncio.sleep(1.5)  # the answer (0.4 s) ends meanwhile
                await redis_cluster.hand_over(key, home, away)
                async with asyncio.timeout(30):
                    live += [frame async for frame in stream]
            check_exact(live, echo_tokens(prompt, tokens))
            assert (await status(stack, turn_id, {"completed", "failed"}))["status"] == "completed"


async def test_100_concurrent_streams_are_exact_token_by_token_on_a_cluster(
    redis_cluster: RedisClusterTopology,
    upstream: ScriptedUpstream,
    tmp_path: Path,
) -> None:
    upstream.responder = echo_responder(200)
    async with private_redis(tmp_path / "queue") as queue:
        settings = make_settings(
            upstream,
            redis_url=redis_cluster.url,
            queue_redis_url=queue.url,
            max_active_turns_per_user=STREAMS,
            max_streams_per_user=STREAMS,
            rate_limit_per_minute=0,  # a hundred turns at once is what the rate stops
        )
        limits = httpx.Limits(max_connections=STREAMS + 10, max_keepalive_connections=0)
        async with ProcessGroup(tmp_path / "logs") as procs:
            await procs.worker(settings)
            api = await procs.api(settings)
            client = httpx.AsyncClient(
                base_url=api.base_url or "", timeout=httpx.Timeout(90.0), limits=limits
            )
            async with client:
                results = await asyncio.gather(*(one_stream(client, i) for i in range(STREAMS)))
    for i, got in enumerate(results):
        check_exact(got, echo_tokens(f"stream {i} on a cluster", 200))


async def one_stream(client: httpx.AsyncClient, i: int) -> list[Frame]:
    return await collect(client, "POST", CHAT, json=body(f"stream {i} on a cluster", stream=True))


async def test_a_conversations_moves_are_atomic_and_a_deletion_forgets_its_turns(
    deployment: Deployment, upstream: ScriptedUpstream
) -> None:
    """The conversation's scripts (shared/conversation_state.py) each in its own slot:
    approving while a message arrives leaves every end state true to the history, and a
    deletion ends the running turn and makes its turns 404 at once."""
    upstream.router_responder = route
    switches = Switches()
    settings = deployment.settings(upstream, api_keys=keys_for_two())
    async with run_stack(settings, tools=[switches.tool()]) as stack:
        await asyncio.gather(
            *(approve_while_a_message_arrives(stack, switches, f"race-{n}") for n in range(5))
        )
        gate = upstream.script(Reply.text(["still", " going"], block_after_first=True))
        await stack.client.post("/v1/conversations", json={"id": "den"}, headers=ALICE)
        async with stack.client.stream(
            "POST",
            "/v1/conversations/den/messages",
            json={"content": "hello"},
            headers={**ALICE, "Accept": "text/event-stream"},
        ) as running:
            turn_id = running.headers["x-bernard-turn-id"]
            await gate.wait_blocked()
            assert (await stack.client.delete("/v1/conversations/den", headers=ALICE)).is_success
            gone = await stack.client.get(f"/v1/turns/{turn_id}", headers=ALICE)
            assert gone.status_code == 404
            events = await named_events(running)
        gate.release()
    assert events[-1][1]["error"]["code"] == "conversation_deleted"


async def test_the_memory_guard_reads_every_primary_of_a_cluster(
    redis_cluster: RedisClusterTopology,
) -> None:
    """One primary over the guard is enough to refuse what would store (api/store_guard.py)."""
    primaries = await redis_cluster.primaries()
    cluster = connect_data(redis_cluster.url)
    guard = StoreGuard([cluster], fraction=0.5)
    try:
        await guard.sample()
        assert guard.full is None
        async with primaries[1].client() as node:
            used = int((await node.info("memory"))["used_memory"])
            await node.config_set("maxmemory", used * 3 // 2)  # 67 % full
        await guard.sample()
    finally:
        await cluster.aclose()
    assert guard.full is not None and guard.full.server.endswith(f":{primaries[1].port}")
    assert "of its maxmemory" in (guard.reason or "")
