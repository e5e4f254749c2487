"""Keeps this worker's turn leases alive from a thread of its own.

A lease says "a live worker runs this turn"; when it lapses, any process ends the turn
`worker_lost`. Renewed from the worker's event loop, a lease lapsed whenever that loop
was merely busy: at a thousand concurrent turns the renewal task waited its turn for
longer than the lease lived, and live turns were failed by the reaper. This thread runs
its own event loop and Redis client, so a busy worker keeps its leases.

What it must not do is keep a wedged worker alive. The worker's loop calls `beat()` every
renewal period; if it has not for `STALL_LIMIT_S`, the thread stops renewing and the
leases lapse, as they would if the process had died.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

from shared import keys
from shared.connection import REDIS_ERRORS, connect, connect_data, queue_client
from shared.lifecycle import RENEWAL_STOPS, Cause
from shared.settings import Settings
from shared.turns import TurnStore

logger = logging.getLogger("bernard.worker")

# How long the worker's event loop may go without beating before its leases lapse.
STALL_LIMIT_S = 30.0
# How long a worker's entry in `keys.WORKERS` outlives its last renewal.
_STALE_WORKER_S = 3600.0

StopTurn = Callable[[str, Cause], None]


class LeaseKeeper:
    """Renews the leases of the turns running here, and reports turns that must stop.

    `stop_turn(turn_id, cause)` is called on the worker's loop, with the cause the renewal
    names (shared/lifecycle.py, `RENEWAL_STOPS`): `CANCELLED` (somebody asked) or `OVER`
    (the turn's record vanished, or another process ended it).
    """

    def __init__(
        self,
        settings: Settings,
        worker_id: str,
        stop_turn: StopTurn,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.settings = settings
        self.worker_id = worker_id
        self.stop_turn = stop_turn
        self.loop = loop
        self._turns: set[str] = set()
        self._lock = threading.Lock()
        self._last_beat = time.monotonic()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bernard-leases", daemon=True)

    def add(self, turn_id: str) -> None:
        with self._lock:
            self._turns.add(turn_id)

    def discard(self, turn_id: str) -> None:
        with self._lock:
            self._turns.discard(turn_id)

    def beat(self) -> None:
        """The worker's loop is alive; called from it once per renewal period."""
        self._last_beat = time.monotonic()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        asyncio.run(self._renew_forever())

    async def _renew_forever(self) -> None:
        # Clients of this thread's own loop: the data role, and the queue role (one client
        # when one Redis holds both).
        redis = connect_data(self.settings.redis_url)
        queue = queue_client(self.settings, redis, lambda: connect(self.settings.queue_url))
        store = TurnStore(
            redis,
            retention_s=self.settings.turn_retention_s,
            stream_maxlen=self.settings.stream_maxlen,
            queue=queue,
        )
        try:
            while not self._stopping.is_set():
                await asyncio.sleep(self.settings.lease_renew_s)
                if time.monotonic() - self._last_beat > STALL_LIMIT_S:
                    logger.error("the worker's event loop is stuck; letting its leases lapse")
                    continue
                try:
                    await self._renew(store)
                except REDIS_ERRORS as exc:
                    logger.warning("lease renewal failed (%s); retrying", exc)
        finally:
            if queue is not redis:
                await queue.aclose()
            await redis.aclose()

    async def _renew(self, store: TurnStore) -> None:
        with self._lock:
            turns = list(self._turns)
        states = await store.renew(turns, self.worker_id, self.settings.lease_ttl_s)
        now = time.time()
        async with store.queue.pipeline(transaction=False) as pipe:
            if turns:
                expiry = now + self.settings.lease_ttl_s
                pipe.zadd(keys.RUNNING_TURNS, dict.fromkeys(turns, expiry))
            pipe.zadd(keys.WORKERS, {self.worker_id: now})
            # A worker that died without saying so leaves its entry: drop those an hour old.
            pipe.zremrangebyscore(keys.WORKERS, "-inf", now - _STALE_WORKER_S)
            await pipe.execute()
        for turn_id, renewal in states.items():
            cause = RENEWAL_STOPS.get(renewal)
            if cause is not None:
                self.loop.call_soon_threadsafe(self.stop_turn, turn_id, cause)
