"""Keeps this worker's liveness from a thread of its own (shared/liveness.py).

One key says "this worker lives"; when it lapses, any process ends the worker's turns
`worker_lost`. Renewed from the worker's event loop, it lapsed whenever that loop was
merely busy: at a thousand concurrent turns the renewal waited its turn for longer than
the key lived, and live turns were failed by the reaper. This thread runs its own event
loop and Redis clients, so a busy worker stays alive.

What it must not do is keep a wedged worker alive. The worker's loop calls `beat()` every
renewal period; if it has not for `STALL_LIMIT_S`, the thread stops renewing and the key
lapses, as it would if the process had died.

Each renewal also tells the turns running here whether each goes on
(shared/lifecycle.py, `RENEWAL_STOPS`): asked to stop (a cancel whose pub/sub message this
worker missed), or over (another process ended it; its record is gone). It costs a fixed
number of commands a period however many turns run here: one script on the queue role, and
on the data role one `EXISTS` of all their records and one of all their cancel keys (what
an API whose queue role is another's, in another cell, can reach), looked at beside the
renewal, never holding it up: a data role failing over must not lapse a live worker. On a
Cluster such an `EXISTS` is one per slot, so one per turn: there each renewal looks at a
fifth of the turns in turn (`_CLUSTER_RECORD_ROUNDS`), so a record lost with its shard, or another
cell's cancel, is noticed within five periods (the turn's next write notices the first
sooner: its stream went with it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable

from redis.asyncio import Redis

from shared import keys
from shared.backends import backend_of
from shared.connection import REDIS_ERRORS, connect, connect_data, queue_client
from shared.lifecycle import RENEWAL_STOPS, Cause, Renewal
from shared.liveness import MEMBERS_PER_COMMAND, Liveness
from shared.settings import Settings
from shared.turns import TurnStore

logger = logging.getLogger("bernard.worker")

# How long the worker's event loop may go without beating before its liveness lapses.
STALL_LIMIT_S = 30.0
# How long a worker's entry in `keys.WORKERS` outlives its last renewal (the reapers drop
# a dead worker's at once, once its turns are ended: this is for the rest), and how many
# renewals apart the renewal drops those.
_STALE_WORKER_S = 3600.0
_STALE_EVERY = 60
# On a Cluster, the renewals over which every turn's record is looked at once.
_CLUSTER_RECORD_ROUNDS = 5

StopTurn = Callable[[str, Cause], None]


class LivenessKeeper:
    """Renews this worker's liveness, and reports turns running here that must stop.

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
        # Turns whose job returned since the last renewal: they leave the worker's set.
        self._released: set[str] = set()
        self._lock = threading.Lock()
        self._last_beat = time.monotonic()
        self._renewals = 0
        # The look at the data role of the last renewal, while it lasts (`_renew`).
        self._looking: asyncio.Task[None] | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bernard-liveness", daemon=True)

    def add(self, turn_id: str) -> None:
        with self._lock:
            self._turns.add(turn_id)
            self._released.discard(turn_id)

    def discard(self, turn_id: str) -> None:
        with self._lock:
            self._turns.discard(turn_id)
            self._released.add(turn_id)

    def beat(self) -> None:
        """The worker's loop is alive; called from it once per renewal period."""
        self._last_beat = time.monotonic()

    async def keep_once(self, liveness: Liveness) -> None:
        """Renew now, on the caller's loop and clients: the worker is alive (and in
        `keys.WORKERS`, where the reapers look) before it claims its first turn."""
        await liveness.keep(self.worker_id, self.settings.lease_ttl_s, stale_s=_STALE_WORKER_S)

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
            queue_name=self.settings.queue_name,
        )
        liveness = Liveness(queue)
        try:
            while not self._stopping.is_set():
                await asyncio.sleep(self.settings.lease_renew_s)
                if time.monotonic() - self._last_beat > STALL_LIMIT_S:
                    logger.error("the worker's event loop is stuck; letting its liveness lapse")
                    continue
                try:
                    await self._renew(store, liveness)
                except REDIS_ERRORS as exc:
                    logger.warning("liveness renewal failed (%s); retrying", exc)
        finally:
            if self._looking is not None:
                self._looking.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._looking
            if queue is not redis:
                await queue.aclose()
            await redis.aclose()

    async def _renew(self, store: TurnStore, liveness: Liveness) -> None:
        with self._lock:
            released = list(self._released)[:MEMBERS_PER_COMMAND]
            self._released.difference_update(released)
        try:
            stale_s = _STALE_WORKER_S if self._renewals % _STALE_EVERY == 0 else None
            kept = await liveness.keep(
                self.worker_id, self.settings.lease_ttl_s, released, stale_s=stale_s
            )
        except BaseException:
            with self._lock:  # let go of them at the next renewal
                self._released.update(t for t in released if t not in self._turns)
            raise
        with self._lock:
            turns = list(self._turns)
        self._renewals += 1
        stops: dict[str, Renewal] = dict.fromkeys(kept.cancelled, Renewal.CANCEL_REQUESTED)
        stops.update(dict.fromkeys(kept.over, Renewal.OVER))
        self._stop(stops, turns)
        # The data role may be failing over while the queue role is fine: what is looked at
        # there never holds up the next renewal (the worker would lapse, alive). One look at
        # a time; a renewal that finds the last one still going skips its own, and a stray
        # it leaves is a reaper's (shared/liveness.py).
        if self._looking is None or self._looking.done():
            going = [t for t in turns if t not in stops]  # the rest are stopping already
            self._looking = asyncio.create_task(self._look_at_data(store, going, kept.stray))
            await asyncio.wait({self._looking}, timeout=self.settings.lease_renew_s)

    async def _look_at_data(self, store: TurnStore, turns: list[str], stray: list[str]) -> None:
        try:
            await self._look(store, turns, stray)
        except REDIS_ERRORS as exc:
            logger.warning("liveness could not look at the data role (%s); retrying", exc)

    async def _look(self, store: TurnStore, turns: list[str], stray: list[str]) -> None:
        if stray:
            # Their jobs returned without an ending that landed: end them as a reaper would
            # (should Redis not take it yet, every reaper tries again: shared/liveness.py).
            await store.end_lapsed(stray, cause=Cause.LET_GO)
        looked_at = turns
        if backend_of(store.redis).splits_by_slot:
            round_ = self._renewals % _CLUSTER_RECORD_ROUNDS
            looked_at = [t for t in turns if hash(t) % _CLUSTER_RECORD_ROUNDS == round_]
        stops: dict[str, Renewal] = {}
        # The data role's own word: a cancel key (set by an API of any cell, whose queue role
        # and its `keys.CANCELS` may be another's: docs/scaling.md), a record gone.
        asked = await _found(store.redis, keys.cancel, looked_at, present=True)
        stops.update(dict.fromkeys(asked, Renewal.CANCEL_REQUESTED))
        gone = await _found(store.redis, keys.turn, looked_at, present=False)
        stops.update(dict.fromkeys(gone, Renewal.OVER))
        self._stop(stops, turns)

    def _stop(self, stops: dict[str, Renewal], turns: list[str]) -> None:
        """Tell the turns of `stops` still running here (`turns`) to stop, on the worker's
        loop."""
        for turn_id, renewal in stops.items():
            if turn_id in turns:
                self.loop.call_soon_threadsafe(self.stop_turn, turn_id, RENEWAL_STOPS[renewal])


async def _found(
    redis: Redis, key: Callable[[str], str], turn_ids: list[str], *, present: bool
) -> list[str]:
    """Those of `turn_ids` whose `key` exists (`present`) or not: one `EXISTS` of them all
    (of each slot, on a Cluster), and one of each only when some are found."""
    found: list[str] = []
    for start in range(0, len(turn_ids), MEMBERS_PER_COMMAND):
        chunk = turn_ids[start : start + MEMBERS_PER_COMMAND]
        count = await redis.exists(*(key(t) for t in chunk))
        if count == (0 if present else len(chunk)):
            continue
        async with redis.pipeline(transaction=False) as pipe:
            for turn_id in chunk:
                pipe.exists(key(turn_id))
            each = await pipe.execute()
        found += [t for t, here in zip(chunk, each, strict=True) if bool(here) is present]
    return found
