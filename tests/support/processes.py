"""Real processes for fault tests: a private redis-server, API and worker subprocesses.

Everything here is started by the test that uses it and stopped by it, in a `finally` or
an `async with`: `RedisServer` (a throwaway `redis-server` on a free loopback port, which
a test can restart or shut down without touching anybody else's Redis) and
`ProcessGroup` (`uvicorn api.main:app` and `python -m worker` children,
configured through the same environment variables production uses). Every wait is
bounded and polls without blocking the event loop, because the scripted upstream the
children talk to runs in the test's own loop. A last-resort `atexit` hook kills any child
still running when the interpreter exits.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import inspect
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

import httpx
import redis.asyncio as redis_asyncio
from redis.exceptions import RedisError

from launcher.redis_server import RedisUnavailable, find_redis_binary, free_port, redis_argv
from shared import keys
from shared.connection import connect
from shared.settings import Settings
from worker.main import WorkerSettings

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

# Children still running, killed at interpreter exit should a test's cleanup never run.
_LIVE: set[subprocess.Popen[bytes]] = set()


@atexit.register
def _kill_leftovers() -> None:
    for proc in list(_LIVE):
        if proc.poll() is None:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL `proc` (by its pid, if still running) and reap it."""
    if proc.poll() is None:
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)
    _LIVE.discard(proc)


async def wait_for(
    condition: Callable[[], object], timeout_s: float, interval_s: float = 0.05
) -> None:
    """Poll `condition` (plain or async) until it is truthy; TimeoutError after `timeout_s`."""
    async with asyncio.timeout(timeout_s):
        while True:
            result = condition()
            if inspect.isawaitable(result):
                result = await result
            if result:
                return
            await asyncio.sleep(interval_s)


async def _wait_exit(proc: subprocess.Popen[bytes], timeout_s: float) -> int:
    """The exit code of `proc`, polled without blocking the loop; TimeoutError after `timeout_s`."""
    await wait_for(lambda: proc.poll() is not None, timeout_s, interval_s=0.02)
    _LIVE.discard(proc)
    return proc.returncode


# QuickShutdownWorkerSettings: Bernard's worker with arq's SIGTERM grace cut to 1 s, so a
# test can see a turn outlive the grace
# (`python -m worker tests.support.processes.QuickShutdownWorkerSettings`). arq reads only a
# settings class's own `__dict__`, so the options are copied, not inherited.
QuickShutdownWorkerSettings = type(
    "QuickShutdownWorkerSettings",
    (),
    {
        **{k: v for k, v in vars(WorkerSettings).items() if not k.startswith("__")},
        "job_completion_wait": 1,
    },
)


def has_redis_binary() -> bool:
    """Whether a `redis-server` binary is here to run private servers with."""
    try:
        find_redis_binary()
    except RedisUnavailable:
        return False
    return True


class RedisServer:
    """A private `redis-server` on 127.0.0.1 that keeps nothing on disk.

    `extra_args` go on its command line (e.g. `--maxmemory-policy allkeys-lru`). The port
    stays the same across `restart()`, so clients reconnect to the same URL.
    """

    def __init__(self, workdir: Path, *extra_args: str) -> None:
        self.workdir = workdir
        self.extra_args = list(extra_args)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log(self) -> Path:
        return self.workdir / f"redis-{self.port}.log"

    async def start(self, timeout_s: float = 10.0) -> None:
        """Start the server and return once it answers PING."""
        proc = self.proc = self._spawn()

        async def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {proc.returncode}; see {self.log}")
            return await self.answers()

        try:
            await wait_for(up, timeout_s, interval_s=0.02)
        except BaseException:
            self.kill()
            raise

    def argv(self) -> list[str]:
        """The server's command line (a Sentinel's differs: tests/support/topologies.py)."""
        return [*redis_argv(find_redis_binary(), self.port, self.workdir), *self.extra_args]

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.workdir.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(
            self.argv(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True
        )
        _LIVE.add(proc)
        return proc

    async def answers(self) -> bool:
        """True when the server answers PING right now."""
        client = redis_asyncio.Redis.from_url(
            self.url, socket_connect_timeout=0.2, socket_timeout=0.5
        )
        try:
            return bool(await client.ping())
        except (RedisError, OSError):
            return False
        finally:
            await client.aclose()

    async def shutdown(self, timeout_s: float = 10.0) -> None:
        """`SHUTDOWN NOSAVE`: every key is gone, as after a crash without persistence."""
        if self.proc is None or self.proc.poll() is not None:
            return
        client = redis_asyncio.Redis.from_url(self.url, socket_timeout=2)
        try:
            await client.shutdown(nosave=True)
        except (RedisError, OSError):
            pass  # the server may close the connection before it answers
        finally:
            await client.aclose()
        try:
            await _wait_exit(self.proc, timeout_s)
        except TimeoutError:
            self.kill()

    async def restart(self, down_s: float = 0.0) -> float:
        """Shut down without saving, stay down `down_s`, start again on the same port.

        Returns how long Redis did not answer.
        """
        started = time.monotonic()
        await self.shutdown()
        await asyncio.sleep(down_s)
        await self.start()
        return time.monotonic() - started

    def kill(self) -> None:
        """Stop the server at once (safe to call in any state)."""
        if self.proc is not None:
            _kill(self.proc)


@contextlib.asynccontextmanager
async def private_redis(workdir: Path, *extra_args: str) -> AsyncIterator[RedisServer]:
    """A started `RedisServer`, always stopped on exit."""
    server = RedisServer(workdir, *extra_args)
    try:
        await server.start()
        yield server
    finally:
        server.kill()


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment a Bernard process needs to run with `settings`.

    The test's own environment is kept (PATH, HOME...) except Bernard's, OpenAI's and
    Redis's variables, which come from `settings` only, so nothing leaks in.
    """
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("BERNARD_", "OPENAI_")) and k != "REDIS_URL"
    }
    for name, field in Settings.model_fields.items():
        value = getattr(settings, name)
        if value is not None:
            text = json.dumps(value) if isinstance(value, list | dict) else str(value)
            env[(field.alias or name).upper()] = text
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Process:
    """One Bernard child process; its stdout and stderr go to `log_path`."""

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        # An API process's URL, once it answers.
        self.base_url: str | None = None
        self.log_path = log_dir / f"{name}.log"
        log_dir.mkdir(parents=True, exist_ok=True)
        self._log: IO[bytes] = self.log_path.open("wb")
        self.popen = subprocess.Popen(
            list(argv),
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        _LIVE.add(self.popen)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def send(self, signum: signal.Signals) -> None:
        """Send `signum` to this process (by its pid)."""
        if self.alive:
            self.popen.send_signal(signum)

    def kill(self) -> None:
        _kill(self.popen)
        self._log.close()

    async def wait_exit(self, timeout_s: float) -> int:
        """Its exit code; raises TimeoutError if it is still running after `timeout_s`."""
        return await _wait_exit(self.popen, timeout_s)

    def output(self) -> str:
        """Everything the process printed so far (it writes to the file directly)."""
        return self.log_path.read_text(errors="replace")

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.output().splitlines()[-lines:])

    def check_alive(self) -> None:
        if not self.alive:
            raise RuntimeError(f"{self.name} exited with {self.popen.returncode}:\n{self.tail()}")


class ProcessGroup:
    """API and worker processes for one test, all SIGKILLed on exit; logs printed on failure."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.processes: list[Process] = []

    async def __aenter__(self) -> ProcessGroup:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for process in self.processes:
            process.kill()
        if exc is not None:
            for process in self.processes:
                print(f"--- {process.name} (pid {process.pid}) ---\n{process.tail()}")

    def _spawn(self, name: str, argv: Sequence[str], settings: Settings) -> Process:
        process = Process(name, argv, settings_env(settings), self.log_dir)
        self.processes.append(process)
        return process

    def spawn_worker(
        self,
        settings: Settings,
        *,
        name: str = "worker",
        settings_path: str = "worker.main.WorkerSettings",
    ) -> Process:
        """Start `python -m worker <settings_path>` and return at once; see `worker_ready`."""
        return self._spawn(name, [sys.executable, "-m", "worker", settings_path], settings)

    async def worker_ready(
        self, process: Process, settings: Settings, timeout_s: float = 30.0
    ) -> Process:
        """Wait until the worker has started and registered itself in Redis."""
        client = connect(settings.queue_url, retries=0)  # workers register on the queue role
        marker = f":{process.pid}:"

        async def registered() -> bool:
            process.check_alive()
            with contextlib.suppress(RedisError, OSError):
                members = await client.zrange(keys.WORKERS, 0, -1)
                return any(marker in member.decode() for member in members)
            return False

        try:
            await wait_for(registered, timeout_s)
        finally:
            await client.aclose()
        return process

    async def worker(
        self,
        settings: Settings,
        *,
        name: str = "worker",
        settings_path: str = "worker.main.WorkerSettings",
        timeout_s: float = 30.0,
    ) -> Process:
        """`python -m worker <settings_path>`, returned once it has registered itself in Redis."""
        process = self.spawn_worker(settings, name=name, settings_path=settings_path)
        return await self.worker_ready(process, settings, timeout_s)

    async def api(
        self,
        settings: Settings,
        *,
        name: str = "api",
        timeout_s: float = 30.0,
        port: int | None = None,
    ) -> Process:
        """`uvicorn api.main:app` on `port` (a free one by default), returned once its
        /healthz answers."""
        port = port or free_port()
        argv = [str(BIN / "uvicorn"), "api.main:app", "--host", "127.0.0.1", "--port", str(port)]
        process = self._spawn(name, [*argv, "--log-level", "warning"], settings)
        base_url = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base_url, timeout=1.0) as client:

            async def healthy() -> bool:
                process.check_alive()
                with contextlib.suppress(httpx.HTTPError):
                    return (await client.get("/healthz")).status_code == 200
                return False

            await wait_for(healthy, timeout_s)
        process.base_url = base_url
        return process
