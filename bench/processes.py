"""The processes a benchmark run needs: Redis, the upstream, API, worker and baseline servers.

Everything is a real child process started the way production starts it: the API is
`uvicorn api.main:app`, the worker `python -m worker`, configured only through
the environment (`REDIS_URL`, `OPENAI_BASE_URL`, `OPENAI_API_KEY`, `BERNARD_*`). Each child
logs to its own file in the run's work directory. Redis is a `redis-server` of our own on
a free port (so `INFO commandstats` counts only Bernard's traffic) unless `--redis-url`
names one.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from redis.asyncio import Redis

from bench.client import Endpoint, request
from launcher.children import stop_process
from launcher.redis_server import find_redis_binary, free_port, start_redis
from shared import keys
from shared.connection import connect, connect_data

ROOT = Path(__file__).resolve().parent.parent
QUEUE_NAME = "bernard:bench:queue"
# What every child process of a run gets besides REDIS_URL, OPENAI_* and BERNARD_QUEUE_NAME
# (`Cluster.create`'s `env`; bench/cli.py and bench/topology.py both start from it).
BENCH_ENV = {
    # One worker must hold the 1,000-stream runs (the default is 500).
    "BERNARD_WORKER_CONCURRENCY": "2000",
    # A disconnect cancels at once, so the cancel measurement sees the pipeline's own latency.
    "BERNARD_DISCONNECT_GRACE_S": "0",
    # Turns outlive the run by an hour at most, even on a shared Redis.
    "BERNARD_TURN_RETENTION_S": "3600",
    # The load generator is one user with up to 1,000 turns and streams at once.
    "BERNARD_MAX_ACTIVE_TURNS_PER_USER": "100000",
    "BERNARD_MAX_STREAMS_PER_USER": "100000",
    # ... and may fill a worker: one user's share of its slots (half by default) would hold
    # the memory section's probes behind its 1,000 idle turns.
    "BERNARD_WORKER_USER_SHARE": "1",
    # ... and asks faster, and stores more, than any household (shared/rate_limit.py,
    # shared/budgets.py): the bench measures the pipeline, not the budgets.
    "BERNARD_RATE_LIMIT_PER_MINUTE": "0",
    "BERNARD_MAX_USER_BYTES": str(2**40),
    "BERNARD_MAX_CONVERSATIONS_PER_USER": "100000000",
    # Each of its chat completions starts a conversation, and a title call each would reach
    # the bench's upstream beside the turns it measures (worker/titles.py).
    "BERNARD_CONVERSATION_TITLES": "false",
}
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time process `pid` used so far, from /proc."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


@dataclass(eq=False)
class Service:
    """One child process; `port` is where it listens, when it is a server."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    port: int = 0

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def endpoint(self) -> Endpoint:
        return ("127.0.0.1", self.port)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss_bytes(self) -> int:
        """Resident set size now, from /proc."""
        fields = Path(f"/proc/{self.pid}/statm").read_text().split()
        return int(fields[1]) * _PAGE

    def cpu_seconds(self) -> float:
        """User + system CPU time used so far, from /proc."""
        return cpu_seconds(self.pid)

    def stop(self, timeout_s: float = 10.0) -> None:
        stop_process(self.proc, signal.SIGTERM, timeout_s)

    def kill(self) -> None:
        if self.alive:
            self.proc.kill()
            self.proc.wait()

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class StartupError(RuntimeError):
    """A child process did not come up."""


@dataclass(eq=False)
class Cluster:
    """The run's processes and the knobs they all share."""

    workdir: Path
    redis_url: str
    settings_env: dict[str, str]
    redis_proc: Service | None = None
    upstream: Service | None = None
    apis: list[Service] = field(default_factory=list)
    workers: list[Service] = field(default_factory=list)
    baseline: Service | None = None
    # LangGraph as a library in one process (bench/langgraph_app.py): bench/peers.py's peer.
    langgraph: Service | None = None
    # What the API and worker processes run: the Procfile's, or `--api-app`/`--worker-settings`.
    api_target: str = "api.main:app"
    worker_target: str = "worker.main.WorkerSettings"
    # The arq queue its API and workers share (another set of processes on the same Redis
    # takes another, so neither runs the other's jobs).
    queue_name: str = QUEUE_NAME
    _counter: int = 0

    # -- Redis -------------------------------------------------------------------------

    @classmethod
    def create(cls, workdir: Path, redis_url: str | None, env: Mapping[str, str]) -> Cluster:
        """Start our own Redis unless `redis_url` is given; returns the cluster around it."""
        redis_proc = None
        if redis_url is None:
            binary = find_redis_binary()
            port = free_port()
            proc = start_redis(binary, port, workdir)
            redis_proc = Service("redis", proc, workdir / f"redis-{port}.log", port)
            redis_url = f"redis://127.0.0.1:{port}/0"
        cluster = cls(workdir=workdir, redis_url=redis_url, settings_env=dict(env))
        cluster.redis_proc = redis_proc
        return cluster

    def redis(self) -> Redis:
        """A new client for the run's Redis, the data role's (the caller closes it)."""
        return connect_data(self.redis_url)

    @property
    def queue_url(self) -> str:
        """Where the queue role is: `BERNARD_QUEUE_REDIS_URL` when the run sets one."""
        return self.settings_env.get("BERNARD_QUEUE_REDIS_URL", self.redis_url)

    def queue(self) -> Redis:
        """A new client for the queue role (the caller closes it)."""
        return connect(self.queue_url)

    @property
    def dedicated_redis(self) -> bool:
        return self.redis_proc is not None

    # -- children ----------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("BERNARD_", "OPENAI_")) and k != "REDIS_URL"
        }
        env.update(self.settings_env)
        env["REDIS_URL"] = self.redis_url
        env["BERNARD_QUEUE_NAME"] = self.queue_name
        env["PYTHONUNBUFFERED"] = "1"
        if self.upstream is not None:
            env["OPENAI_BASE_URL"] = f"http://127.0.0.1:{self.upstream.port}/v1"
            env["OPENAI_API_KEY"] = "bench-key"
        return env

    def _spawn(self, name: str, argv: list[str], *, stdin: int | None = None) -> Service:
        self._counter += 1
        log = self.workdir / f"{self._counter:02d}-{name}.log"
        with log.open("wb") as sink:
            proc = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=self._env(),
                stdin=stdin if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE if name == "upstream" else sink,
                stderr=sink,
                start_new_session=True,
            )
        return Service(name, proc, log)

    async def start_upstream(self) -> Service:
        """The scripted upstream (bench.upstream) in its own process."""
        service = self._spawn(
            "upstream", [sys.executable, "-m", "bench.upstream"], stdin=subprocess.PIPE
        )
        self.upstream = service
        assert service.proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(service.proc.stdout.readline), 30)
        if not line:
            raise StartupError(f"the upstream did not start:\n{service.log_tail()}")
        service.port = int(orjson.loads(line)["port"])
        return service

    async def _start_server(self, name: str, app: str) -> Service:
        port = free_port()
        argv = [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1"]
        argv += ["--port", str(port), "--log-level", "warning", "--no-access-log"]
        service = self._spawn(name, argv)
        service.port = port
        try:
            await _wait_http(service, "/healthz")
        except BaseException:
            service.kill()
            raise
        return service

    async def start_api(self) -> Service:
        """One more `uvicorn api.main:app` process."""
        service = await self._start_server(f"api{len(self.apis) + 1}", self.api_target)
        self.apis.append(service)
        return service

    async def start_baseline(self) -> Service:
        """The in-process baseline server (bench.baseline)."""
        self.baseline = await self._start_server("baseline", "bench.baseline:app")
        return self.baseline

    async def start_langgraph(self) -> Service:
        """The LangGraph peer (bench.langgraph_app), on the run's upstream."""
        self.langgraph = await self._start_server("langgraph", "bench.langgraph_app:app")
        return self.langgraph

    async def start_worker(self) -> Service:
        """One more `python -m worker` process; returns once it reported in."""
        argv = [sys.executable, "-m", "worker", self.worker_target]
        service = self._spawn(f"worker{len(self.workers) + 1}", argv)
        self.workers.append(service)
        await self.wait_worker_registered(service)
        return service

    async def wait_worker_registered(self, service: Service, timeout_s: float = 60) -> None:
        """Wait until the worker's supervisor has renewed its entry in `bernard:workers`."""
        pattern = re.compile(rf":{service.pid}:")
        redis = self.queue()
        try:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if not service.alive:
                    raise StartupError(f"{service.name} exited:\n{service.log_tail()}")
                members = await redis.zrange(keys.WORKERS, 0, -1)
                if any(pattern.search(m.decode()) for m in members):
                    return
                await asyncio.sleep(0.1)
        finally:
            await redis.aclose()
        raise StartupError(f"{service.name} never reported in:\n{service.log_tail()}")

    async def scale(self, apis: int, workers: int) -> None:
        """Run exactly `apis` API and `workers` worker processes (newest stop first)."""
        while len(self.apis) > apis:
            self.apis.pop().stop()
        while len(self.workers) > workers:
            self.workers.pop().stop(timeout_s=15)
        while len(self.apis) < apis:
            await self.start_api()
        while len(self.workers) < workers:
            await self.start_worker()

    async def restart_workers(self) -> int:
        """SIGKILL every worker and start as many fresh ones (drops whatever they ran).

        arq keeps a killed worker's jobs in its queue until their in-progress keys expire
        (job_timeout + 10 s, 940 s here), and every pickup meanwhile spends four round trips
        on each of them. Jobs whose turn has ended are removed the way arq's own
        `finish_job` would; returns how many.
        """
        count = len(self.workers)
        for service in self.workers:
            service.kill()
        self.workers.clear()
        redis, queue = self.redis(), self.queue()
        removed = 0
        try:
            for raw in await queue.zrange(QUEUE_NAME, 0, -1):
                job_id = raw.decode()
                status = await redis.hget(keys.turn(job_id), "status")  # type: ignore[misc]
                if status in (b"completed", b"failed", b"cancelled"):
                    async with queue.pipeline(transaction=True) as pipe:
                        pipe.zrem(QUEUE_NAME, job_id)
                        pipe.delete(
                            f"arq:in-progress:{job_id}", f"arq:job:{job_id}", f"arq:retry:{job_id}"
                        )
                        await pipe.execute()
                    removed += 1
        finally:
            await redis.aclose()
            await queue.aclose()
        for _ in range(count):
            await self.start_worker()
        return removed

    async def beside(self, env: Mapping[str, str], queue: str, counter: int) -> Cluster:
        """An API and a worker of their own on this run's Redis and upstream, with `env`
        added to the settings, on the queue `<QUEUE_NAME>:<queue>` (neither runs the
        other's jobs); their log files numbered from `counter`. `stop_own` stops them."""
        other = Cluster(
            workdir=self.workdir,
            redis_url=self.redis_url,
            settings_env={**self.settings_env, **env},
            upstream=self.upstream,
            api_target=self.api_target,
            worker_target=self.worker_target,
            queue_name=f"{QUEUE_NAME}:{queue}",
            _counter=counter,
        )
        await other.start_api()
        await other.start_worker()
        return other

    def stop_own(self) -> None:
        """Stop the APIs and workers, not the upstream or Redis (`beside` shares them)."""
        for service in self.apis:
            service.stop(timeout_s=5)
        for service in self.workers:
            service.stop(timeout_s=15)
        self.apis.clear()
        self.workers.clear()

    def forget_worker(self, service: Service) -> None:
        """Drop a worker that was killed on purpose."""
        if service in self.workers:
            self.workers.remove(service)

    def check_alive(self) -> None:
        """Raise if any child died on its own."""
        for service in [*self.apis, *self.workers, self.upstream, self.baseline, self.langgraph]:
            if service is not None and not service.alive:
                raise StartupError(f"{service.name} exited:\n{service.log_tail()}")

    def stop_all(self) -> None:
        """Stop every child: servers first, then the workers, the upstream, Redis last."""
        for service in [*self.apis, self.baseline, self.langgraph]:
            if service is not None:
                service.stop(timeout_s=5)
        for service in self.workers:
            service.stop(timeout_s=15)
        if self.upstream is not None:
            if self.upstream.proc.stdin is not None:
                self.upstream.proc.stdin.close()
            self.upstream.stop(timeout_s=10)
            if self.upstream.proc.stdout is not None:
                self.upstream.proc.stdout.close()
        if self.redis_proc is not None:
            self.redis_proc.stop(timeout_s=10)
        self.apis.clear()
        self.workers.clear()


async def _wait_http(service: Service, path: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not service.alive:
            raise StartupError(f"{service.name} exited:\n{service.log_tail()}")
        try:
            call = await request(service.endpoint, "GET", path)
            if call.status == 200:
                return
        except OSError:
            pass
        await asyncio.sleep(0.1)
    raise StartupError(f"{service.name} did not answer {path}:\n{service.log_tail()}")
