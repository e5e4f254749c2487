"""The only module that leans on arq's internals (arq is pinned in pyproject.toml).

arq polls its queue every `poll_delay` seconds, which adds about half of that to every
turn's first token. `WakeWorker` instead blocks on a wake list that the API pushes a token
to after each enqueue, so an idle worker picks a job up within a couple of milliseconds
while issuing about two Redis commands a second; and a started job leaves arq's queue at
once, so polls cost the same with one turn running or a thousand.
"""

from __future__ import annotations

import asyncio
from typing import Any

import arq.worker
from arq.worker import Worker

from shared import keys

# Fallback poll while idle: picks up deferred jobs and a token lost to a Redis restart.
WAKE_TIMEOUT_S = 1
# While every job slot is busy, how often to look for a free one.
FULL_RECHECK_S = 0.05


class WakeWorker(Worker):
    """An arq `Worker` that waits on a wake list instead of sleeping between polls."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # arq sleeps `poll_delay` minus the iteration's duration; the wait below replaces it.
        kwargs["poll_delay"] = 0
        super().__init__(*args, **kwargs)
        self.wake_key = keys.wake(self.queue_name)

    async def run_job(self, job_id: str, score: int) -> None:
        # arq leaves a running job in the queue's sorted set, and every poll of every worker
        # then spends four round trips on it (WATCH, EXISTS, ZSCORE, UNWATCH): with hundreds
        # of turns in flight that dwarfed the turns' own traffic. A turn never runs twice
        # (its claim refuses), so its job can leave the queue as soon as it starts.
        await self.pool.zrem(self.queue_name, job_id)
        await super().run_job(job_id, score)

    async def _poll_iteration(self) -> None:
        await super()._poll_iteration()
        if self.allow_pick_jobs and self.job_counter < self.max_jobs:
            await self.pool.blpop([self.wake_key], timeout=WAKE_TIMEOUT_S)  # type: ignore[misc]
        else:
            await asyncio.sleep(FULL_RECHECK_S)


def _create_wake_worker(settings_cls: Any, **kwargs: Any) -> Worker:
    return WakeWorker(**{**arq.worker.get_kwargs(settings_cls), **kwargs})


# The `arq` command line always builds a plain `Worker` (arq.worker.run_worker calls the
# module-level `create_worker`). Importing this module makes it build a `WakeWorker`, so the
# Procfile's `arq worker.main.WorkerSettings` gets fast pickup too.
arq.worker.create_worker = _create_wake_worker
