"""The Redis of the test session: a private `redis-server`, unless one is named.

Unless `BERNARD_TEST_REDIS_URL` names one (which must then be a server or database given
over to tests), a `redis-server` on a free loopback port is started for the session and
stopped at the end, so no test reads or writes a Redis that other work uses, and nothing
is ever flushed.
"""

from __future__ import annotations

import atexit
import os
import tempfile
from pathlib import Path

from launcher.children import stop_process
from launcher.redis_server import find_redis_binary, free_port, local_url, start_redis


def _session_redis() -> str:
    """The URL of the Redis this test session owns, started here unless one was named."""
    named = os.environ.get("BERNARD_TEST_REDIS_URL")
    if named:
        return named
    workdir = tempfile.mkdtemp(prefix="bernard-test-redis-")
    port = free_port()
    proc = start_redis(find_redis_binary(), port, Path(workdir))
    atexit.register(stop_process, proc)
    # Children (fault tests' API and worker processes) find it through the environment.
    url = local_url(port)
    os.environ["BERNARD_TEST_REDIS_URL"] = url
    return url


TEST_REDIS_URL = _session_redis()
