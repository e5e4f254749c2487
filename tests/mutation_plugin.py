"""A pytest plugin for mutation runs (docs/testing.md), loaded with `-p tests.mutation_plugin`.

A fresh Redis for every session, dying with its process: mutmut runs the tests many times
in one process and in processes forked from it, and kills a mutant's run that takes too
long, before its session's teardown stops the Redis of tests/support/session_redis.py.
Data one run leaves behind must not reach the next either: a mutant that leaks a user's
active turns would answer every later mutant's turns with a 429 and count them as killed.
So each pytest session gets its own throwaway redis-server, named to the fixtures by
`BERNARD_TEST_REDIS_URL`, stopped when the session ends or when its process dies.

The fast tests first: mutmut stops a mutant's run at its first failing test (`-x`), so
the tests of tests/api and tests/shared, which drive the modules directly in
milliseconds, run before the end-to-end ones that start an API and a worker each.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from launcher.redis_server import (
    find_redis_binary,
    free_port,
    local_url,
    redis_answers,
    redis_argv,
)
from tests.support.session_redis import ENV

_TESTS = Path(__file__).resolve().parent
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL it when the process that started it exits."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="bernard-mutation-redis-"))
    port = free_port()
    proc = subprocess.Popen(
        redis_argv(find_redis_binary(), port, workdir),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        preexec_fn=_die_with_parent,
    )
    url = local_url(port)
    deadline = time.monotonic() + 10
    while not redis_answers(url):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the mutation run's redis-server did not start; see {workdir}")
        time.sleep(0.01)
    session.config.stash[_SERVER] = (proc, workdir)
    os.environ[ENV] = url


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    server = session.config.stash.get(_SERVER, None)
    if server is None:
        return
    proc, workdir = server
    os.environ.pop(ENV, None)
    proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)
    shutil.rmtree(workdir, ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    fast = {_TESTS / "api", _TESTS / "shared"}
    items.sort(key=lambda item: Path(item.path).resolve().parent not in fast)


_SERVER = pytest.StashKey[tuple[subprocess.Popen[bytes], Path]]()
