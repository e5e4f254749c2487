"""`python -m bench --cluster`: Bernard on one Redis and on a Redis Cluster, same box.

Two deployments, one after the other, each with one API process, one worker process and
the scripted upstream process (bench/processes.py), configured only through the
environment as production is:

- **single**: one `redis-server` holds both roles (shared/keys.py).
- **cluster**: the data role on a Redis Cluster of 3 primaries with a replica each, the
  queue role on a `redis-server` of its own (arq needs one primary).

On each, two measurements from docs/benchmarks.md:

1. **Exactness**: N turns started at once, M tokens each from the upstream as fast as it
   sends them, every client stream checked token by token (section 4 there).
2. **Relay capacity**: S clients attached to turns that a synthetic worker
   (`python -m bench.writer`) appends to at rising offered rates, the API process the only
   thing relaying (section 3 there).

For each, every Redis server's CPU time (from /proc) and the commands it executed
(`INFO commandstats`), per token: the figures docs/scaling.md sizes deployments from.
Each server is started for the run, keeps nothing on disk and is stopped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import math
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import redis.asyncio as redis_asyncio
from rich.console import Console

from bench.measurements import capacity_step, capacity_tokens, kept_up
from bench.processes import BENCH_ENV, ROOT, Cluster, cpu_seconds
from bench.report import Section, Table, Verdict, ms, num, write
from bench.runner import Ui, check_all, drive, echo_directives, relay_latencies
from bench.stats import Summary
from shared.connection import connect_data
from tests.support.processes import RedisServer
from tests.support.topologies import RedisClusterTopology


@dataclass(frozen=True, slots=True)
class Sizes:
    name: str
    exact_streams: int
    exact_tokens: int
    capacity_streams: int
    capacity_rates: tuple[int, ...]
    capacity_step_s: float
    # Answers streamed at 50 tokens/s each (20 ms apart), as docs/scaling.md sizes for.
    paced_streams: int
    paced_tokens: int

    @classmethod
    def full(cls) -> Sizes:
        return cls("full", 1000, 200, 100, (4000, 8000, 16000, 0), 3.0, 100, 500)

    @classmethod
    def quick(cls) -> Sizes:
        return cls("quick", 100, 50, 50, (2000, 0), 1.5, 20, 100)


PACE_MS = 20.0


@dataclass(frozen=True, slots=True)
class Node:
    """One `redis-server` of a deployment: what it does there, its process and port."""

    role: str
    pid: int
    port: int


@dataclass
class Deployment:
    name: str
    data_url: str
    queue_url: str
    nodes: list[Node] = field(default_factory=list)


@contextlib.asynccontextmanager
async def single(workdir: Path) -> AsyncIterator[Deployment]:
    server = RedisServer(workdir / "single")
    try:
        await server.start()
        assert server.proc is not None
        node = Node("both roles", server.proc.pid, server.port)
        yield Deployment("single Redis", server.url, server.url, [node])
    finally:
        server.kill()


@contextlib.asynccontextmanager
async def cluster(workdir: Path) -> AsyncIterator[Deployment]:
    topology = RedisClusterTopology(workdir / "cluster")
    queue = RedisServer(workdir / "queue")
    try:
        await topology.start()
        await queue.start()
        primaries = {node.port for node in await topology.primaries()}
        nodes = []
        for k, server in enumerate(topology.nodes):
            assert server.proc is not None
            role = "data primary" if server.port in primaries else "data replica"
            nodes.append(Node(f"{role} {k + 1}", server.proc.pid, server.port))
        assert queue.proc is not None
        nodes.append(Node("queue", queue.proc.pid, queue.port))
        yield Deployment("Redis Cluster, 3 primaries", topology.url, queue.url, nodes)
    finally:
        topology.stop()
        queue.kill()


class NodeMeter:
    """Each server's CPU seconds, commands executed and memory grown between `start` and
    `stop` (what the turns of the stretch left behind: they are retained an hour)."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes = list(nodes)
        self.cpu: dict[str, float] = {}
        self.commands: dict[str, int] = {}
        self.memory: dict[str, int] = {}
        self._before: dict[str, tuple[float, int, int]] = {}

    async def _read(self) -> dict[str, tuple[float, int, int]]:
        out = {}
        for node in self.nodes:
            async with redis_asyncio.Redis(host="127.0.0.1", port=node.port) as client:
                stats = await client.info("commandstats")
                memory = int((await client.info("memory"))["used_memory"])
            calls = sum(int(v["calls"]) for k, v in stats.items() if k not in ("cmdstat_info",))
            out[node.role] = (cpu_seconds(node.pid), calls, memory)
        return out

    async def start(self) -> NodeMeter:
        self._before = await self._read()
        return self

    async def stop(self) -> NodeMeter:
        after = await self._read()
        for role, (cpu, calls, memory) in after.items():
            self.cpu[role] = cpu - self._before[role][0]
            self.commands[role] = calls - self._before[role][1]
            self.memory[role] = memory - self._before[role][2]
        return self

    def memory_of(self, prefix: str) -> int:
        """Bytes the servers whose role starts with `prefix` grew by."""
        return sum(grown for role, grown in self.memory.items() if role.startswith(prefix))


@dataclass
class Result:
    """One measurement on one deployment."""

    deployment: str
    what: str
    tokens: int
    seconds: float
    exact: int
    streams: int
    redis: NodeMeter
    process_cpu: dict[str, float]
    extra: dict[str, float] = field(default_factory=dict)


def _process_cpu(procs: Cluster) -> dict[str, float]:
    return {s.name: s.cpu_seconds() for s in [*procs.apis, *procs.workers] if s.alive}


async def end_to_end(
    procs: Cluster, deployment: Deployment, ui: Ui, n: int, tokens: int, pace_ms: float = 0.0
) -> Result:
    """`n` turns at once of `tokens` tokens, `pace_ms` apart (0: unpaced), every stream
    checked token by token; with a pace, the relay latency of each content frame too."""
    what = "exactness" if not pace_ms else f"{1000 / pace_ms:g} tokens/s each"
    directives = echo_directives("cx", n, tokens, pace_ms)
    task = ui.task(f"{deployment.name}: {n} × {tokens} tokens, {what}", n)
    meter = await NodeMeter(deployment.nodes).start()
    cpu_before = _process_cpu(procs)
    started = time.monotonic()
    turns = await drive(
        [procs.apis[0].endpoint],
        directives,
        system="pipeline",
        concurrency=n,
        # Paced answers start spread over one token's time, as real ones do not all at once.
        stagger_s=pace_ms / 1000,
        on_done=lambda _t: ui.advance(task),
    )
    elapsed = time.monotonic() - started
    await meter.stop()
    cpu = {k: v - cpu_before.get(k, 0.0) for k, v in _process_cpu(procs).items()}
    ui.done(task)
    exact, problems = check_all(turns)
    for problem in problems[:5]:
        ui.log(f"[red]{deployment.name}: {problem}")
    extra: dict[str, float] = {}
    if pace_ms:
        redis = connect_data(deployment.data_url)
        try:
            latency = Summary.of((await relay_latencies(redis, turns)).total)
        finally:
            await redis.aclose()
        extra = {"p50": latency.median, "p99": latency.p99}
    return Result(deployment.name, what, n * tokens, elapsed, exact, n, meter, cpu, extra)


class _StepMeter:
    """The servers' meter and the API's and worker's CPU seconds, around a capacity step."""

    def __init__(self, procs: Cluster, deployment: Deployment) -> None:
        self.procs = procs
        self.servers = NodeMeter(deployment.nodes)
        self.cpu: dict[str, float] = {}

    async def start(self) -> _StepMeter:
        await self.servers.start()
        self.cpu = _process_cpu(self.procs)
        return self

    async def stop(self) -> _StepMeter:
        await self.servers.stop()
        before = self.cpu
        self.cpu = {k: v - before.get(k, 0.0) for k, v in _process_cpu(self.procs).items()}
        return self


async def capacity(procs: Cluster, deployment: Deployment, sizes: Sizes, ui: Ui) -> list[Result]:
    """The API's relay capacity: clients of synthetic turns at rising offered rates
    (bench/measurements.py capacity_step)."""
    results: list[Result] = []
    redis = connect_data(deployment.data_url)
    api = procs.apis[0]
    fastest = 0.0
    try:
        task = ui.task(f"{deployment.name}: relay capacity", len(sizes.capacity_rates))
        for rate in sizes.capacity_rates:
            streams = sizes.capacity_streams
            tokens = capacity_tokens(rate, fastest, sizes.capacity_step_s, streams)
            meter = _StepMeter(procs, deployment)
            step = await capacity_step(
                redis,
                api.endpoint,
                deployment.data_url,
                queue_url=deployment.queue_url,
                streams=streams,
                rate=rate,
                tokens=tokens,
                meter=meter,
            )
            if not math.isnan(step.delivered):
                fastest = max(fastest, step.delivered)
            results.append(
                Result(
                    deployment.name,
                    f"relay at {num(rate) if rate else 'max'}/s",
                    streams * tokens,
                    step.seconds,
                    step.exact,
                    streams,
                    meter.servers,
                    meter.cpu,
                    {
                        "offered": float(rate),
                        "written": step.written,
                        "delivered": step.delivered,
                        "frames": float(step.frames),
                        "p50": step.latency.median,
                        "p99": step.latency.p99,
                    },
                )
            )
            ui.advance(task)
        ui.done(task)
    finally:
        await redis.aclose()
    return results


# -- the report ----------------------------------------------------------------------------


def _per(value: float | None, count: float, scale: float = 1e6) -> str:
    return num(value / count * scale, 1) if count and value is not None else "—"


def _by_role(meter: NodeMeter, prefix: str) -> float | None:
    """CPU seconds of the servers whose role starts with `prefix`; None when there are none."""
    found = [cpu for role, cpu in meter.cpu.items() if role.startswith(prefix)]
    return sum(found) if found else None


def _role_cells(meter: NodeMeter, count: float) -> list[str]:
    """Redis CPU µs per unit: data primaries, data replicas, queue (one server: all first)."""
    if "both roles" in meter.cpu:
        return [_per(meter.cpu["both roles"], count), "—", "(same server)"]
    cells = []
    for prefix in ("data primary", "data replica", "queue"):
        cpu = _by_role(meter, prefix)
        cells.append(_per(cpu, count) if cpu is not None else "—")
    return cells


def _data_memory(meter: NodeMeter) -> int:
    """What the data role grew by: the primaries' (a replica holds the same again)."""
    return meter.memory_of("both roles") + meter.memory_of("data primary")


ROLE_HEADERS = [
    "Redis CPU µs: data primaries",
    "data replicas",
    "queue",
]


def report(results: Sequence[Result], sizes: Sizes, deployments: Sequence[Deployment]) -> Section:
    section = Section(
        "cluster",
        "Redis Cluster against one Redis",
        intro=f"""
Both deployments on this one box, one after the other, each with 1 API process, 1 worker
process and the scripted upstream process. **single**: one `redis-server` for both roles.
**cluster**: the data role on a Redis Cluster of 3 primaries and 3 replicas, the queue role
on a `redis-server` of its own. "Redis CPU" is each server's user + system CPU from /proc
(replicas apply every write again), summed per role; "commands" what `INFO commandstats`
counted, all servers. End to end: {sizes.exact_streams} turns at once of
{sizes.exact_tokens} tokens unpaced (the exactness check), then {sizes.paced_streams} turns
of {sizes.paced_tokens} tokens at {1000 / PACE_MS:g} tokens/s each (every stream checked
too; relay latency = worker's stamp → client receipt per content frame). Relay capacity:
{sizes.capacity_streams} clients of turns a synthetic worker appends to at each offered
rate for about {sizes.capacity_step_s:g} s ("max": as fast as it can).
""",
    )
    ends = Table(
        [
            "deployment",
            "run",
            "exact",
            "tokens/s",
            "relay p50 / p99 ms",
            "API CPU µs/token",
            "worker CPU µs/token",
            *ROLE_HEADERS,
            "Redis commands/token",
            "data memory/turn retained",
        ],
        title="End to end, per token",
    )
    relay = Table(
        [
            "deployment",
            "offered/s",
            "written/s",
            "delivered frames/s",
            "p50 ms",
            "p99 ms",
            "API CPU µs/frame",
            *ROLE_HEADERS,
            "exact",
            "kept up",
        ],
        title=f"Relay capacity of 1 API process, {sizes.capacity_streams} streams, per frame",
    )
    servers = Table(
        ["deployment", "run", "server", "CPU µs/token", "commands/token", "CPU busy %"],
        title="Each Redis server (relay rows: per frame delivered)",
    )
    for result in results:
        meter = result.redis
        commands = sum(meter.commands.values())
        api_cpu = sum(v for k, v in result.process_cpu.items() if k.startswith("api"))
        worker_cpu = sum(v for k, v in result.process_cpu.items() if k.startswith("worker"))
        count: float = result.tokens
        if not result.what.startswith("relay"):
            section.verdicts.append(
                Verdict(
                    f"{result.deployment}: {result.streams} turns ({result.what}) all exact",
                    f"{result.exact}/{result.streams}",
                    result.exact == result.streams,
                )
            )
            latency = (
                f"{ms(result.extra['p50'])} / {ms(result.extra['p99'])}" if result.extra else "—"
            )
            ends.add(
                result.deployment,
                result.what,
                f"{result.exact}/{result.streams}",
                num(result.tokens / result.seconds),
                latency,
                _per(api_cpu, count),
                _per(worker_cpu, count),
                *_role_cells(meter, count),
                _per(commands, count, 1),
                f"{_data_memory(meter) / result.streams / 1024:,.1f} KiB",
            )
        else:
            count = result.extra["frames"]
            rate = result.extra["written"]
            step_kept_up = kept_up(
                offered=result.extra["offered"],
                written=rate,
                delivered=result.extra["delivered"],
                p99_ms=result.extra["p99"],
                exact=result.exact,
                streams=result.streams,
            )
            relay.add(
                result.deployment,
                num(result.extra["offered"]) if result.extra["offered"] else "max",
                num(rate),
                num(result.extra["delivered"]),
                ms(result.extra["p50"]),
                ms(result.extra["p99"]),
                _per(api_cpu, count),
                *_role_cells(meter, count),
                f"{result.exact}/{result.streams}",
                "yes" if step_kept_up else "no",
            )
        for role in meter.cpu:
            servers.add(
                result.deployment,
                result.what,
                role,
                _per(meter.cpu[role], count),
                _per(meter.commands[role], count, 1),
                num(100 * meter.cpu[role] / result.seconds, 0) if result.seconds else "—",
            )
    section.tables += [ends, relay, servers]
    for deployment in deployments:
        section.notes.append(
            f"{deployment.name}: "
            + ", ".join(f"{node.role} (port {node.port})" for node in deployment.nodes)
        )
    return section


async def run(args: argparse.Namespace) -> int:
    """`python -m bench --cluster`: both deployments, both measurements, one report."""
    sizes = Sizes.quick() if args.quick else Sizes.full()
    workdir = Path(tempfile.mkdtemp(prefix="bernard-bench-cluster-"))
    console = Console(stderr=True)
    ui = Ui(console)
    started = dt.datetime.now(dt.UTC)
    t0 = time.monotonic()
    results: list[Result] = []
    deployments: list[Deployment] = []
    failures: list[str] = []
    with ui.progress:
        ui.log(f"work directory (logs): {workdir}")
        for deploy in (single, cluster):
            async with deploy(workdir) as deployment:
                deployments.append(deployment)
                slug = deployment.name.split(",")[0].lower().replace(" ", "-")
                env = {**BENCH_ENV, "BERNARD_QUEUE_REDIS_URL": deployment.queue_url}
                (workdir / slug).mkdir(exist_ok=True)
                procs = Cluster.create(workdir / slug, deployment.data_url, env)
                try:
                    await procs.start_upstream()
                    await procs.start_api()
                    await procs.start_worker()
                    warm = echo_directives("cw", 3, 20)
                    await drive([procs.apis[0].endpoint], warm, system="pipeline", concurrency=1)
                    n, tokens = sizes.exact_streams, sizes.exact_tokens
                    results.append(await end_to_end(procs, deployment, ui, n, tokens))
                    n, tokens = sizes.paced_streams, sizes.paced_tokens
                    results.append(await end_to_end(procs, deployment, ui, n, tokens, PACE_MS))
                    results += await capacity(procs, deployment, sizes, ui)
                finally:
                    procs.stop_all()
    for result in results:
        if result.exact != result.streams:
            failures.append(
                f"{result.deployment}, {result.what}: {result.exact}/{result.streams} exact"
            )
    section = report(results, sizes, deployments)
    section.seconds = time.monotonic() - t0
    header = f"""
Generated by `python -m bench --cluster{" --quick" if sizes.name == "quick" else ""}` on
{started:%Y-%m-%d %H:%M} UTC, {sizes.name} sizes; the run took
{section.seconds / 60:.1f} min (bench/topology.py says what runs).
"""
    output = args.output or (
        ROOT / "docs" / "scaling.md" if sizes.name == "full" else workdir / "scaling.md"
    )
    write(output, header, [section])
    console.print(f"report written to {output}")
    for failure in failures:
        console.print(f"[red]{failure}")
    return 1 if failures else 0
