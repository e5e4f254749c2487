"""API and worker take their long-lived objects out of the collector's full passes, and
the benchmark's scripted upstream holds its full passes until it is reset.

A full collection scans every tracked object; with LangChain, pydantic and the clients
loaded, that stalled a busy worker's event loop for 100-130 ms at a time, which was the
p99 of first tokens at 10 concurrent turns. `gc.freeze()` once started avoids it. The
benchmark's upstream paused up to 210 ms in a relay run, and all its streams with it
(bench/gc_hold.py).
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import httpx
import pytest

from bench.upstream import BenchUpstream
from tests.support.stack import make_settings, run_api
from tests.support.upstream import ScriptedUpstream
from worker.main import shutdown, startup
from worker.queue import WakeWorker


@pytest.fixture
def unfrozen() -> Iterator[None]:
    thresholds = gc.get_threshold()
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


class _Cycle:
    """Garbage only a full pass can find once it is old: it refers to itself."""

    def __init__(self) -> None:
        self.me = self


@pytest.mark.usefixtures("unfrozen")
async def test_the_worker_freezes_what_it_built_at_startup(upstream: ScriptedUpstream) -> None:
    # As `python -m worker` builds it (worker/queue.py marks its context).
    ctx = {"settings": make_settings(upstream), WakeWorker.MARK: True}
    assert gc.get_freeze_count() == 0
    await startup(ctx)
    try:
        assert gc.get_freeze_count() > 10_000
    finally:
        await shutdown(ctx)


@pytest.mark.usefixtures("unfrozen")
async def test_the_api_freezes_what_it_built_at_startup() -> None:
    assert gc.get_freeze_count() == 0
    async with run_api(make_settings()):
        assert gc.get_freeze_count() > 10_000


@pytest.mark.usefixtures("unfrozen")
async def test_the_bench_upstream_holds_full_collections_until_it_is_reset() -> None:
    async with BenchUpstream().serving() as upstream:
        assert gc.get_freeze_count() > 10_000
        assert gc.get_threshold()[2] == 1_000_000_000
        cycle = _Cycle()
        gc.collect(1)  # it survives the young passes: now it is old
        dropped = weakref.ref(cycle)
        del cycle
        gc.collect(1)
        assert dropped() is not None  # only a full pass frees it, and none runs

        base = upstream.base_url.removesuffix("/v1")
        async with httpx.AsyncClient() as client:
            reply = await client.post(f"{base}/bench/reset")
        assert reply.status_code == 200
        assert dropped() is None
