"""Redis beyond one server, on loopback, for the tests that run Bernard on it (issue 14).

- `RedisClusterTopology`: a Redis Cluster of three primaries with a replica each
  (`redis-server --cluster-enabled yes`, joined with `redis-cli --cluster create
  --cluster-replicas 1`), for the data role (`redis+cluster://`).
- `SentinelTopology`: a primary, its replica and three Sentinels watching them
  (`redis-server <conf> --sentinel`), for either role (`redis+sentinel://`).

Every server is a private child on a free port (a Cluster node also needs its bus port,
+10000, free), keeps nothing on disk, and is stopped when the fixture ends: each test owns
its servers, so it may kill a primary or move a slot without touching anybody else's.
The fixtures `redis_cluster` and `redis_sentinel` start one per test; the tests that use
them carry the `topology` marker (docs/testing.md: `./run test-topologies`).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as redis_asyncio
from redis.crc import key_slot
from redis.exceptions import RedisError

from launcher.redis_server import RedisUnavailable, find_redis_binary, free_port, port_is_free
from tests.support.processes import RedisServer, wait_for

SERVICE = "bernard"
# Above the box's worst stall under load, so no test sees a failover it did not cause; the
# failover test asks for a shorter one.
CLUSTER_NODE_TIMEOUT_MS = 5000
SENTINEL_DOWN_AFTER_MS = 5000


def topologies_missing() -> str | None:
    """Why topologies cannot run here (None when they can): they need `redis-cli` to join a
    Cluster and Redis 7 (sharded pub/sub, which the Cluster's stream hub waits on)."""
    if shutil.which("redis-cli") is None:
        return "no redis-cli to build a Cluster with (apt install redis-tools)"
    try:
        binary = find_redis_binary()
    except RedisUnavailable:
        return "no redis-server"
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    found = re.search(r"v=(\d+)\.", version)
    if found is None or int(found[1]) < 7:
        return f"Redis 7 or later needed (found {version.strip()!r})"
    return None


def client_of(server: RedisServer) -> redis_asyncio.Redis:
    """A plain client of one server (a Cluster node's follows no redirection)."""
    return redis_asyncio.Redis(host="127.0.0.1", port=server.port, socket_timeout=10)


def _cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free as well."""
    for _ in range(200):
        port = free_port()
        if port + 10000 <= 65535 and port_is_free(port + 10000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


class ClusterNode(RedisServer):
    """One node of the test Cluster."""

    def __init__(self, workdir: Path, node_timeout_ms: int = CLUSTER_NODE_TIMEOUT_MS) -> None:
        super().__init__(workdir)
        self.port = _cluster_port()
        self.extra_args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            str((workdir / f"nodes-{self.port}.conf").resolve()),
            "--cluster-node-timeout",
            str(node_timeout_ms),
        ]

    def client(self) -> redis_asyncio.Redis:
        """A plain client of this node alone (no redirections followed)."""
        return client_of(self)

    async def node_id(self) -> str:
        async with self.client() as client:
            return str((await client.execute_command("CLUSTER", "MYID")).decode())


class RedisClusterTopology:
    """Three primaries, three replicas; `url` is what `REDIS_URL` gets."""

    def __init__(
        self, workdir: Path, nodes: int = 6, node_timeout_ms: int = CLUSTER_NODE_TIMEOUT_MS
    ) -> None:
        self.workdir = workdir
        self.nodes = [ClusterNode(workdir, node_timeout_ms) for _ in range(nodes)]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    async def start(self, timeout_s: float = 60.0) -> None:
        await asyncio.gather(*(node.start() for node in self.nodes))
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        argv = ["redis-cli", "--cluster", "create", *addresses, "--cluster-replicas", "1"]
        created = await asyncio.to_thread(
            subprocess.run,
            [*argv, "--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if created.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed:\n{created.stdout}")
        await wait_for(self._settled, timeout_s, interval_s=0.1)

    async def _settled(self) -> bool:
        """Every node says the cluster is ok and knows all six; every replica is in sync."""
        for node in self.nodes:
            async with node.client() as client:
                try:
                    info = (await client.execute_command("CLUSTER", "INFO")).decode()
                    known = (await client.execute_command("CLUSTER", "NODES")).decode()
                    role = await client.info("replication")
                except (RedisError, OSError):
                    return False
            if "cluster_state:ok" not in info or len(known.strip().splitlines()) < len(self.nodes):
                return False
            if role["role"] == "slave" and role.get("master_link_status") != "up":
                return False
        return True

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()

    async def primary_of(self, key: str) -> ClusterNode:
        """The node serving `key`'s slot now."""
        slot = key_slot(key.encode())
        for node in self.nodes:
            async with node.client() as client:
                with contextlib.suppress(RedisError, OSError):
                    ranges = await client.execute_command("CLUSTER", "SLOTS")
                    for start, end, owner, *_ in ranges:
                        if start <= slot <= end:
                            port = int(owner[1])
                            return next(n for n in self.nodes if n.port == port)
        raise RuntimeError(f"no node serves slot {slot}")

    async def wait_promoted(self, key: str, dead: ClusterNode, timeout_s: float = 30.0) -> None:
        """Return once a node other than `dead` serves `key`'s slot (its replica, promoted)
        and says the cluster is ok."""

        async def promoted() -> bool:
            node = await self.primary_of(key)
            if node is dead:
                return False
            async with node.client() as client:
                with contextlib.suppress(RedisError, OSError):
                    info = (await client.execute_command("CLUSTER", "INFO")).decode()
                    return "cluster_state:ok" in info
            return False

        await wait_for(promoted, timeout_s, interval_s=0.1)

    async def primaries(self) -> list[ClusterNode]:
        """The nodes that are primaries now."""
        found = []
        for node in self.nodes:
            with contextlib.suppress(RedisError, OSError):
                async with node.client() as client:
                    if (await client.info("replication"))["role"] == "master":
                        found.append(node)
        return found

    async def migrate_slot(self, key: str, to: ClusterNode, batch: int = 10) -> int:
        """Move the slot of `key`, keys and all, to `to`, the way `redis-cli --cluster
        reshard` does (SETSLOT IMPORTING/MIGRATING, MIGRATE in batches, SETSLOT NODE on
        every primary); returns how many keys moved. Clients see ASK and MOVED meanwhile."""
        source = await self.primary_of(key)
        moved = await self.move_keys(key, to, batch)
        await self.hand_over(key, source, to)
        return moved

    async def move_keys(self, key: str, to: ClusterNode, batch: int = 10) -> int:
        """The first half of `migrate_slot`: the slot of `key` migrating from its primary to
        `to`, and its keys moved there; the old primary still owns it (and answers ASK for
        the keys it no longer holds) until `hand_over`. Returns how many keys moved."""
        slot = key_slot(key.encode())
        source = await self.primary_of(key)
        if source is to:
            raise ValueError("the slot is already on that node")
        source_id, target_id = await source.node_id(), await to.node_id()
        moved = 0
        async with source.client() as src, to.client() as dst:
            await dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
            await src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
            while True:
                keys = await src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch)
                if not keys:
                    break
                await src.execute_command(
                    "MIGRATE", "127.0.0.1", to.port, "", 0, 5000, "KEYS", *keys
                )
                moved += len(keys)
        return moved

    async def hand_over(self, key: str, source: ClusterNode, to: ClusterNode) -> None:
        """The second half of `migrate_slot`: the slot of `key` owned by `to`. The target
        first, then the source, then the rest, as `redis-cli --cluster reshard` does: were
        the source told first, it would answer MOVED to the target while the target, still
        importing, answered MOVED back."""
        slot = key_slot(key.encode())
        target_id = await to.node_id()
        others = [n for n in await self.primaries() if n is not source and n is not to]
        for node in [to, source, *others]:
            async with node.client() as client:
                await client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)


class SentinelServer(RedisServer):
    """One Sentinel, watching the service `SERVICE` on the primary at `primary_port`."""

    def __init__(self, workdir: Path, primary_port: int, down_after_ms: int) -> None:
        super().__init__(workdir)
        self.primary_port = primary_port
        self.down_after_ms = down_after_ms

    @property
    def log(self) -> Path:
        return self.workdir / f"sentinel-{self.port}.log"

    def argv(self) -> list[str]:
        # A Sentinel rewrites its configuration file as it learns the topology.
        conf = (self.workdir / f"sentinel-{self.port}.conf").resolve()
        conf.write_text(
            "\n".join(
                [
                    f"port {self.port}",
                    "bind 127.0.0.1",
                    f"dir {self.workdir.resolve()}",
                    f"logfile {self.log.resolve()}",
                    "sentinel resolve-hostnames no",
                    f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary_port} 2",
                    f"sentinel down-after-milliseconds {SERVICE} {self.down_after_ms}",
                    f"sentinel failover-timeout {SERVICE} 10000",
                    f"sentinel parallel-syncs {SERVICE} 1",
                    "",
                ]
            )
        )
        return [find_redis_binary(), str(conf), "--sentinel"]


class SentinelTopology:
    """A primary, a replica, three Sentinels; `url` is what either role's URL gets."""

    def __init__(self, workdir: Path, down_after_ms: int = SENTINEL_DOWN_AFTER_MS) -> None:
        self.workdir = workdir
        self.primary = RedisServer(workdir)
        self.replica = RedisServer(workdir, "--replicaof", "127.0.0.1", "0")
        self.replica.extra_args[-1] = str(self.primary.port)
        self.sentinels = [
            SentinelServer(workdir, self.primary.port, down_after_ms) for _ in range(3)
        ]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{sentinel.port}" for sentinel in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}"

    @property
    def servers(self) -> list[RedisServer]:
        return [self.primary, self.replica, *self.sentinels]

    async def start(self, timeout_s: float = 60.0) -> None:
        await self.primary.start()
        await self.replica.start()
        await asyncio.gather(*(sentinel.start() for sentinel in self.sentinels))
        await wait_for(self._settled, timeout_s, interval_s=0.1)

    async def _settled(self) -> bool:
        """The replica is in sync, and every Sentinel knows it and the two other Sentinels
        (without them no quorum can authorize a failover)."""
        async with client_of(self.replica) as client:
            with contextlib.suppress(RedisError, OSError):
                if (await client.info("replication")).get("master_link_status") != "up":
                    return False
        for sentinel in self.sentinels:
            async with client_of(sentinel) as client:
                try:
                    state = (await client.sentinel_masters())[SERVICE]
                except (RedisError, OSError, KeyError):
                    return False
            if state["num-slaves"] < 1 or state["num-other-sentinels"] < 2:
                return False
        return True

    async def master_port(self) -> int:
        """The port of the primary the Sentinels name now."""
        for sentinel in self.sentinels:
            async with client_of(sentinel) as client:
                with contextlib.suppress(RedisError, OSError):
                    address = await client.sentinel_get_master_addr_by_name(SERVICE)
                    return int(address[1])
        raise RuntimeError("no Sentinel answers")

    async def wait_failover(self, timeout_s: float = 30.0) -> None:
        """Return once the Sentinels name the replica as the primary, and it says so."""

        async def promoted() -> bool:
            if await self.master_port() != self.replica.port:
                return False
            async with client_of(self.replica) as client:
                with contextlib.suppress(RedisError, OSError):
                    return bool((await client.info("replication"))["role"] == "master")
            return False

        await wait_for(promoted, timeout_s, interval_s=0.1)

    def stop(self) -> None:
        for server in self.servers:
            server.kill()


@contextlib.asynccontextmanager
async def started_cluster(
    workdir: Path, node_timeout_ms: int = CLUSTER_NODE_TIMEOUT_MS
) -> AsyncIterator[RedisClusterTopology]:
    """A started three-primary, three-replica Cluster, always stopped on exit."""
    topology = RedisClusterTopology(workdir, node_timeout_ms=node_timeout_ms)
    try:
        await topology.start()
        yield topology
    finally:
        topology.stop()


@contextlib.asynccontextmanager
async def started_sentinel(
    workdir: Path, down_after_ms: int = SENTINEL_DOWN_AFTER_MS
) -> AsyncIterator[SentinelTopology]:
    """A started primary, replica and three Sentinels, always stopped on exit."""
    topology = SentinelTopology(workdir, down_after_ms)
    try:
        await topology.start()
        yield topology
    finally:
        topology.stop()


@pytest.fixture
async def redis_cluster(tmp_path: Path) -> AsyncIterator[RedisClusterTopology]:
    """A started three-primary, three-replica Cluster, stopped after the test."""
    async with started_cluster(tmp_path / "cluster") as topology:
        yield topology


@pytest.fixture
async def redis_sentinel(tmp_path: Path) -> AsyncIterator[SentinelTopology]:
    """A started primary, replica and three Sentinels, stopped after the test."""
    async with started_sentinel(tmp_path / "sentinel") as topology:
        yield topology
