"""The Redis of a test session: a private `redis-server`, unless one is named.

Unless `BERNARD_TEST_REDIS_URL` names one (which must then be a server or database given
over to tests), the session fixture `redis_url` (tests/conftest.py) starts a
`redis-server` on a free loopback port when the first test needs it and stops it when
the session ends: no test reads or writes a Redis that other work uses, nothing is ever
flushed, and a run that collects only starts none. Each pytest-xdist worker is a session
of its own, so each has its own server.
"""

from __future__ import annotations

import atexit
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from launcher.children import stop_process
from launcher.redis_server import find_redis_binary, free_port, local_url, start_redis

ENV = "BERNARD_TEST_REDIS_URL"


@contextlib.contextmanager
def session_redis(workdir: Path) -> Iterator[str]:
    """The URL of the session's Redis, started in `workdir` unless `ENV` names one."""
    named = os.environ.get(ENV)
    if named:
        yield named
        return
    port = free_port()
    proc = start_redis(find_redis_binary(), port, workdir)
    # Should the session's teardown never run, at exit all the same (a no-op once stopped).
    atexit.register(stop_process, proc)
    url = local_url(port)
    # Children (fault tests' API and worker processes) find it through the environment,
    # and so does `session_redis_url`.
    os.environ[ENV] = url
    try:
        yield url
    finally:
        del os.environ[ENV]
        stop_process(proc)


def session_redis_url() -> str:
    """The URL of the session's Redis, for what a test builds itself (`make_settings`)."""
    url = os.environ.get(ENV)
    if not url:
        raise RuntimeError("no test Redis yet: the session fixture `redis_url` starts it")
    return url
