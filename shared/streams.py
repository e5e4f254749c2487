"""Turn streams in Redis: the worker's writer, and reading entries back.

A worker writes the events of all its turns through one `StreamBatcher`. When no write is
in flight an event goes out at once (a model-call event as soon as the producer next waits,
see `StreamWriter.write`). Events that pile up while a
write is in flight, from any turn, go out together in the next pipeline, and a turn's
adjacent text deltas among them are joined into one entry. So an idle worker sends each
token the moment it exists, and a busy one sends fewer, fuller commands in fewer round
trips: one write in flight per process, not one per turn. A producer writing behind a write
in flight goes on without waiting for the loop (`StreamWriter.write`). A round that carried
many turns (`_BUSY_ROUND`) is followed by a short pause (`_BUSY_PAUSE_S`) before the next:
on a worker that keeps up with its upstreams a round is one token per turn, and the pause
lets each turn's next tokens arrive and join (at 1,000 unpaced streams: 0.99 → 0.41 XADDs per
token, 1.78 → 1.16 Redis commands per token, relay p99 at 1,000 streams not worse;
docs/benchmarks.md).

Only the turn's own worker writes to its stream, and only while the turn runs: a turn's
`done` entry seals its stream (shared/lifecycle.py, `SEALED_ID`), after which Redis refuses
every append, and an append never creates a stream that is gone (`NOMKSTREAM`: the turn's
record went with it). A worker that was stopped long enough for a reaper to end its turn
(SIGSTOP, a frozen VM) learns so from its next write (`TurnOverError`), and nothing lands
after the turn's `done`.

Each turn's appends in a round carry what wakes the stream's readers on the data role's
topology (shared/backends.py: on a Cluster, an `SPUBLISH` on the stream's wake channel
after them). A Cluster pipeline sends each node its share at once, so a round costs one
round trip whatever the number of shards.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from shared.backends import backend_of
from shared.events import Delta, Event, LlmCallComplete, LlmPrompt, Stamped, decode, encode

# The field each entry of a turn's stream holds its encoded event under (shared/events.py
# `encode`); shared/lifecycle.py's CREATE and FINISH write it as the literal 'e'.
STREAM_FIELD = "e"
_STREAM_FIELD = STREAM_FIELD.encode()

Entry = tuple[str, Stamped]
# Above this many pending events of one turn, `write` waits for Redis instead of buffering.
_BACKPRESSURE = 1000
# A producer writing behind a round in flight lets the loop run at least every this many
# events (`StreamWriter.write`).
_YIELD_EVERY = 32
# A round of at least this many turns means a busy worker: pause this long before the next.
_BUSY_ROUND = 100
_BUSY_PAUSE_S = 0.004


class TurnOverError(Exception):
    """The turn is no longer running on this worker: its stream takes no more writes."""


class StreamBatcher:
    """Appends the events of every turn of a process to their streams, in order per turn."""

    def __init__(self, redis: Redis, *, maxlen: int) -> None:
        self.redis = redis
        self.maxlen = maxlen
        self.backend = backend_of(redis)
        # One round in flight at a time, each round a pipeline: on a connection kept for
        # them where the topology allows (shared/backends.py `pipelines`).
        self._pipelines = self.backend.pipelines()
        # Turn id → events not sent yet, in order.
        self._pending: dict[str, list[Event]] = {}
        # Turns in the write in flight, and the errors writes raised, by turn.
        self._in_flight: set[str] = set()
        self._errors: dict[str, BaseException] = {}
        self._round_done = asyncio.Event()
        self._pausing = False
        self._task: asyncio.Task[None] | None = None

    def writer(self, turn_id: str) -> StreamWriter:
        """The writer of `turn_id`'s stream."""
        return StreamWriter(self, turn_id)

    def add(self, key: str, event: Event) -> None:
        """Queue `event` for turn `key`'s stream; raises what an earlier write of it raised."""
        if key in self._errors:
            raise self._errors.pop(key)
        pending = self._pending.setdefault(key, [])
        last = pending[-1] if pending else None
        if isinstance(event, Delta) and isinstance(last, Delta):
            pending[-1] = Delta(text=last.text + event.text)
        else:
            pending.append(event)
        if self._task is None:
            self._task = asyncio.create_task(self._drain())

    @property
    def idle(self) -> bool:
        """Whether no round is in flight (nor a busy round's pause): an event added now
        goes out in the next round to start, as soon as the loop runs."""
        return not self._in_flight and not self._pausing

    def backlog(self, key: str) -> int:
        """How many events `key` has queued and not sent yet."""
        return len(self._pending.get(key, ()))

    async def flush(self, key: str) -> None:
        """Wait until every event queued for `key` is in Redis; raises what a write raised."""
        while key in self._pending or key in self._in_flight:
            if self._task is None:  # the drain task failed outside any write
                break
            await self._round_done.wait()
        if key in self._errors:
            raise self._errors.pop(key)

    def discard(self, key: str) -> None:
        """Drop what `key` has queued (its turn is over and its stream may be gone)."""
        self._pending.pop(key, None)
        self._errors.pop(key, None)

    async def aclose(self) -> None:
        """Give back the connection the rounds are sent on; while a round is in flight it
        stays taken, and the client's pool closes it when the client closes."""
        if self._task is None:
            await self._pipelines.aclose()

    async def _drain(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, {}
                self._in_flight = set(batch)
                try:
                    await self._write(batch)
                except Exception as exc:  # the round failed whole: every turn of it
                    for turn_id in batch:
                        self._errors.setdefault(turn_id, exc)
                finally:
                    self._in_flight = set()
                    self._round_done.set()
                    self._round_done = asyncio.Event()
                if len(batch) >= _BUSY_ROUND:
                    self._pausing = True
                    try:
                        await asyncio.sleep(_BUSY_PAUSE_S)
                    finally:
                        self._pausing = False
        finally:
            self._task = None

    async def _write(self, batch: dict[str, list[Event]]) -> None:
        # The turn each entry's reply is of; None for a wake-up's.
        sent: list[str | None] = []
        async with self._pipelines.pipeline() as pipe:
            for turn_id, events in batch.items():
                try:
                    payloads = [encode(event) for event in events]
                except Exception as exc:  # this turn's events cannot be written: its alone
                    self._errors.setdefault(turn_id, exc)
                    continue
                after = self.backend.append(
                    pipe, turn_id, STREAM_FIELD, payloads, maxlen=self.maxlen, nomkstream=True
                )
                sent.extend([turn_id] * len(payloads))
                if after:
                    sent.extend([None] * after)
            # A round that fails whole (the connection lost) fails every turn in it: `_drain`.
            replies = await pipe.execute(raise_on_error=False)
        for of, reply in zip(sent, replies, strict=True):
            if of is None:
                continue  # a wake-up that failed: the readers' sweep finds the entries anyway
            if reply is None or (isinstance(reply, ResponseError) and _sealed(reply)):
                # No stream (its record is gone) or a sealed one (the turn has ended).
                self._errors.setdefault(of, TurnOverError(of))
            elif isinstance(reply, Exception):
                self._errors.setdefault(of, reply)


def _sealed(error: ResponseError) -> bool:
    return "last possible ID" in str(error)


class StreamWriter:
    """Appends one turn's events to its stream, in order, through the process's batcher."""

    def __init__(self, batcher: StreamBatcher, turn_id: str) -> None:
        self.batcher = batcher
        self.key = turn_id
        # Events written since the producer last let the loop run (`write`).
        self._unyielded = 0

    async def write(self, event: Event) -> None:
        """Queue the event. When it starts a round (no write was in flight), let the round
        start before the producer goes on: an idle worker sends each token the moment it
        exists. Behind a round in flight, the event waits for that round whatever the
        producer does, so the producer goes on at once and what it writes meanwhile joins
        the event; it still lets the loop run every `_YIELD_EVERY` events, so a turn whose
        upstream sent much at once cannot hold up every other turn of the worker. (Yielding
        on every event was 18 µs of worker CPU per token at 100 unpaced streams, 50 against
        32, with five times the entries and frames: docs/benchmarks.md, cost per token.)"""
        starts = self.batcher.idle
        self.batcher.add(self.key, event)
        if self.batcher.backlog(self.key) > _BACKPRESSURE:
            await self.flush()
        if isinstance(event, LlmPrompt | LlmCallComplete):
            # Model-call events (streamed only to a client that asked for traces) never
            # yield: they go out once the producer next waits, typically on the model call
            # they announce, which so starts an event-loop iteration sooner.
            return
        self._unyielded += 1
        if starts or self._unyielded >= _YIELD_EVERY:
            self._unyielded = 0
            await asyncio.sleep(0)

    async def flush(self) -> None:
        """Wait until everything written so far is in Redis; raises what a write raised."""
        await self.batcher.flush(self.key)

    def discard(self) -> None:
        """Drop what is not written yet: the turn ended elsewhere."""
        self.batcher.discard(self.key)


def parse_entries(raw: Sequence[tuple[bytes, dict[bytes, bytes]]]) -> list[Entry]:
    """Decode XRANGE/XREAD entries into (entry id, stamped event)."""
    return [(entry_id.decode(), decode(fields[_STREAM_FIELD])) for entry_id, fields in raw]


def read_streams(reply: Any) -> list[tuple[str, Sequence[Any]]]:
    """The streams of an `XREAD` reply as Redis sent it (undecoded: shared/redis_pool.py
    `HeldConnection`), each its key and its raw entries (`parse_sent_entries`): a RESP2
    array of [key, entries] pairs or a RESP3 map; none when the read timed out."""
    if reply is None:
        return []
    pairs = reply.items() if isinstance(reply, dict) else reply
    return [(key.decode(), entries) for key, entries in pairs]


def parse_sent_entries(raw: Sequence[Any]) -> list[Entry]:
    """Decode entries as Redis sent them ([id, [field, value, ...]] each) into (entry id,
    stamped event)."""
    return [(entry_id.decode(), decode(_event_field(fields))) for entry_id, fields in raw]


def _event_field(fields: Sequence[bytes]) -> bytes:
    if fields[0] == _STREAM_FIELD:  # the one field every writer writes
        return fields[1]
    return dict(zip(fields[::2], fields[1::2], strict=True))[_STREAM_FIELD]


def entry_key(entry_id: str) -> tuple[int, int]:
    """Sortable form of a stream entry id ("1700000000000-3" → (1700000000000, 3))."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)
