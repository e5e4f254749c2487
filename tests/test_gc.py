"""API and worker take their long-lived objects out of the collector's full passes.

A full collection scans every tracked object; with LangChain, pydantic and the clients
loaded, that stalled a busy worker's event loop for 100-130 ms at a time, which was the
p99 of first tokens at 10 concurrent turns. `gc.freeze()` once started avoids it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from tests.conftest import make_settings, run_api
from tests.upstream import ScriptedUpstream
from worker.main import shutdown, startup
from worker.queue import WakeWorker


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


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
