"""The relay: one turn's stream to one client as SSE, from any cursor, always to an end.

Each test relays a stream of its own through a real `StreamHub` on the session's Redis,
writing the entries a worker would, and reads the SSE events the client would get.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
import orjson
import pytest
import redis.asyncio as redis_asyncio
from prometheus_client import REGISTRY

import api.hub
import api.session
from api.cursors import Resume, after_start
from api.encoding import DONE, Encoder, Frame
from api.encodings import encoder_for
from api.hub import StreamHub
from api.relay import ending_frames, entry_frames
from api.relay import relay as relay_bytes
from shared import keys
from shared.endings import completed, ended
from shared.errors import ErrorCode
from shared.events import Delta, Error, Event, Stamped, Start, ToolCall, encode
from shared.lifecycle import Cause
from shared.requests import AgentRequest, Delivery, TurnRequest
from shared.streams import STREAM_FIELD
from shared.turn_record import TurnRecord

KEEPALIVE_S = 0.05


def encoder(kind: str = "chat", *, include_usage: bool = False) -> Encoder:
    request = TurnRequest(AgentRequest([]), Delivery(kind, include_usage=include_usage))
    return encoder_for(TurnRecord(id="t", owner="o", request=request, model="bernard-v1"))


@dataclass(frozen=True)
class Sent:
    """One SSE frame as a client reads it."""

    id: str | None = None
    data: str | None = None
    comment: str | None = None


def parse(chunk: bytes) -> list[Sent]:
    """The frames of one chunk (single-line fields: every frame these tests relay)."""
    sent = []
    for block in chunk.decode().split("\r\n\r\n")[:-1]:
        fields: dict[str, str] = {}
        for line in block.split("\r\n"):
            name, _, value = line.partition(": ")
            fields[name or "comment"] = value
        sent.append(Sent(fields.get("id"), fields.get("data"), fields.get("comment")))
    return sent


async def relay(*args: Any, **options: Any) -> AsyncGenerator[list[Sent], None]:
    """The relay's chunks, each read back as the client reads its frames."""
    chunks = relay_bytes(*args, **options)
    try:
        async for chunk in chunks:
            yield parse(chunk)
    finally:
        await chunks.aclose()


def frames_of(events: list[Sent]) -> list[tuple[str | None, str | None]]:
    return [(event.id, event.data) for event in events]


def unnamed(frames: list[Frame]) -> list[tuple[str | None, str | None]]:
    return [(None, frame) for frame in frames if isinstance(frame, str)]


@pytest.fixture
async def turn_id(redis: redis_asyncio.Redis) -> AsyncIterator[str]:
    turn_id = uuid.uuid4().hex
    yield turn_id
    await redis.delete(keys.events(turn_id))


async def write(redis: redis_asyncio.Redis, turn_id: str, *events: Event) -> list[str]:
    ids = []
    for event in events:
        entry_id = await redis.xadd(keys.events(turn_id), {STREAM_FIELD: encode(event)})
        ids.append(entry_id.decode())
    return ids


class Detaches:
    """A `detach` that records each call's `finished`, after an await of its own."""

    def __init__(self) -> None:
        self.calls: list[bool] = []

    async def __call__(self, finished: bool) -> None:
        await asyncio.sleep(0.01)
        self.calls.append(finished)


async def relayed(hub: StreamHub, enc: Encoder, turn_id: str, **options: Any) -> list[Sent]:
    options.setdefault("keepalive_s", KEEPALIVE_S)
    async with asyncio.timeout(5):
        return [event async for batch in relay(hub, enc, turn_id, **options) for event in batch]


def counter(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


# -- frames of one entry -----------------------------------------------------------------

DONE_EVENT = completed("stop", {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3})


@pytest.mark.parametrize(
    ("event", "include_usage", "ids"),
    [
        (Delta(text="hi"), False, ["1-2"]),
        (Start(), False, ["1-2"]),
        (DONE_EVENT, False, ["1-2:0", "1-2:1"]),  # finish, [DONE]
        (DONE_EVENT, True, ["1-2:0", "1-2:1", "1-2:2"]),  # finish, usage, [DONE]
    ],
)
def test_one_frame_keeps_its_entry_id_and_several_are_numbered_from_zero(
    event: Event, include_usage: bool, ids: list[str]
) -> None:
    enc = encoder(include_usage=include_usage)
    frames = entry_frames(enc, ("1-2", Stamped(event=event)))
    assert frames == list(zip(ids, enc.frames(event), strict=True))


def test_an_entry_with_no_frame_for_this_client_gives_no_event() -> None:
    call = ToolCall(id="c", name="t", arguments="{}", index=0)
    assert entry_frames(encoder("completion"), ("1-2", Stamped(event=call))) == []


@pytest.mark.parametrize(
    ("cause", "code"),
    [
        (Cause.RECORD_GONE, ErrorCode.TURN_LOST),
        (Cause.UNREADABLE, ErrorCode.STREAM_UNREADABLE),
        (Cause.TRIMMED, ErrorCode.STREAM_TRIMMED),
    ],
)
def test_a_stream_that_cannot_go_on_closes_with_an_error_and_its_done(
    cause: Cause, code: ErrorCode
) -> None:
    enc = encoder()
    done = ended(code)
    assert done.error is not None
    error = Error(message=done.error["message"], code=code)
    frames = ending_frames(enc, cause)
    assert frames == [*enc.frames(error), *enc.frames(done)]
    assert isinstance(frames[0], str) and isinstance(frames[1], str)
    assert orjson.loads(frames[0])["bernard"]["code"] == str(code)
    assert orjson.loads(frames[1])["error"]["code"] == str(code)
    assert frames[-1] == DONE


# -- relaying a stream -------------------------------------------------------------------


async def test_every_entry_is_relayed_under_its_id_until_the_done(
    redis: redis_asyncio.Redis, hub: StreamHub, turn_id: str
) -> None:
    enc = encoder(include_usage=True)
    start, delta, done = await write(redis, turn_id, Start(), Delta(text="hi"), DONE_EVENT)
    await write(redis, turn_id, Delta(text="after the end"))
    detach = Detaches()
    events = await relayed(hub, enc, turn_id, detach=detach)
    assert frames_of(events) == [
        (start, enc.frames(Start())[0]),
        (delta, enc.frames(Delta(text="hi"))[0]),
        *[(f"{done}:{k}", frame) for k, frame in enumerate(enc.frames(DONE_EVENT))],
    ]
    assert detach.calls == [True]


async def test_entries_written_while_the_client_watches_reach_it(
    redis: redis_asyncio.Redis, hub: StreamHub, turn_id: str
) -> None:
    enc = encoder()
    (start,) = await write(redis, turn_id, Start())
    stream = relay(hub, enc, turn_id, keepalive_s=5)
    assert [event.id for event in await anext(stream)] == [start]
    for text in ("one", "two"):
        (entry_id,) = await write(redis, turn_id, Delta(text=text))
        batch = await asyncio.wait_for(anext(stream), 2)
        assert frames_of(batch) == [(entry_id, enc.frames(Delta(text=text))[0])]
    await write(redis, turn_id, DONE_EVENT)
    rest = [event async for batch in stream for event in batch]
    assert rest[-1].data == DONE


async def test_entries_that_arrived_together_go_out_in_one_batch(
    redis: redis_asyncio.Redis, hub: StreamHub, turn_id: str
) -> None:
    enc = encoder()
    ids = await write(redis, turn_id, Start(), Delta(text="a"), Delta(text="b"), DONE_EVENT)
    async with asyncio.timeout(5):
        batches = [batch async for batch in relay(hub, enc, turn_id, keepalive_s=5)]
    assert len(batches) == 1
    assert [event.id for event in batches[0]] == [*ids[:3], f"{ids[3]}:0", f"{ids[3]}:1"]


async def test_a_resumed_stream_sends_what_the_cursor_still_owes_then_the_entries_after_it(
    redis: redis_asyncio.Redis, hub: StreamHub, turn_id: str
) -> None:
    enc = encoder()
    first, second, done = await write(
        redis, turn_id, Delta(text="a"), Delta(text="b"), completed("stop", None)
    )
    resume = Resume(after=first, head=[(f"{first}:1", "owed")])
    events = await relayed(hub, enc, turn_id, resume=resume)
    assert frames_of(events) == [
        (f"{first}:1", "owed"),
        (second, enc.frames(Delta(text="b"))[0]),
        (f"{done}:0", enc.frames(completed("stop", None))[0]),
        (f"{done}:1", DONE),
    ]


async def test_a_resume_past_the_done_sends_its_head_and_reads_nothing(
    redis: redis_asyncio.Redis, turn_id: str
) -> None:
    idle = StreamHub(redis)  # never started: reading from it would raise
    detach = Detaches()
    resume = Resume(after="5-0", head=[(None, DONE)], finished=True)
    events = await relayed(idle, encoder(), turn_id, resume=resume, detach=detach)
    assert frames_of(events) == [(None, DONE)]
    assert detach.calls == [True]


async def test_a_new_turns_stream_starts_without_reading_its_start_back(
    redis: redis_asyncio.Redis, hub: StreamHub, turn_id: str
) -> None:
    """The creation returned the `start` entry's id: its frames go out at once with that
    id (the hub holds nothing for the turn yet), and reading begins after it."""
    enc = encoder()
    (start,) = await write(redis, turn_id, Start())
    stream = relay(hub, enc, turn_id, resume=after_start(enc, start), keepalive_s=5)
    first = await anext(stream)
    assert frames_of(first) == [(start, enc.frames(Start())[0])]
    (delta,) = await write(redis, turn_id, Delta(text="a"))
    assert frames_of(await asyncio.wait_for(anext(stream), 2)) == [
        (delta, enc.frames(Delta(text="a"))[0])
    ]
    await stream.aclose()


async def test_a_client_that_leaves_detaches_as_not_finished(
    redis: redis_asyncio.Redis, hub: StreamHub, turn_id: str
) -> None:
    await write(redis, turn_id, Start())
    detach = Detaches()
    stream = relay(hub, encoder(), turn_id, keepalive_s=5, detach=detach)
    await anext(stream)
    await stream.aclose()
    assert detach.calls == [False]


async def test_a_client_cancelled_away_still_detaches_to_the_end(
    redis: redis_asyncio.Redis, hub: StreamHub, turn_id: str
) -> None:
    """sse-starlette stops a stream by cancelling its task group: the detach (which closes
    the stream's slot and may cancel the turn) must still run its awaits."""
    await write(redis, turn_id, Start())
    detach = Detaches()
    got = []
    with anyio.CancelScope() as scope:
        async for event in relay(hub, encoder(), turn_id, keepalive_s=5, detach=detach):
            got.append(event)
            scope.cancel()
    assert len(got) == 1
    assert detach.calls == [False]


# -- a quiet stream ----------------------------------------------------------------------


async def test_a_quiet_stream_gets_a_keepalive_chunk_every_keepalive(
    hub: StreamHub, turn_id: str
) -> None:
    enc = encoder()
    stream = relay(hub, enc, turn_id, keepalive_s=KEEPALIVE_S, alive=lambda: _true())
    loop = asyncio.get_running_loop()
    started = loop.time()
    pings = [await asyncio.wait_for(anext(stream), 2) for _ in range(3)]
    assert loop.time() - started >= 3 * KEEPALIVE_S * 0.9
    await stream.aclose()
    assert [[(p.id, p.data, p.comment) for p in batch] for batch in pings] == [
        [(None, enc.keepalive(), None)]
    ] * 3


async def test_a_quiet_text_completion_stream_gets_ping_comments(
    hub: StreamHub, turn_id: str
) -> None:
    stream = relay(hub, encoder("completion"), turn_id, keepalive_s=KEEPALIVE_S)
    (ping,) = await asyncio.wait_for(anext(stream), 2)
    await stream.aclose()
    assert (ping.data, ping.comment) == (None, "ping")


async def _true() -> bool:
    return True


async def test_a_stream_whose_turn_record_vanished_ends_with_turn_lost(
    hub: StreamHub, turn_id: str
) -> None:
    enc = encoder()
    asked = []

    async def alive() -> bool:
        asked.append(True)
        return len(asked) < 2  # still there at the first silence, gone at the second

    detach = Detaches()
    events = await relayed(hub, enc, turn_id, alive=alive, detach=detach)
    assert frames_of(events) == [
        (None, enc.keepalive()),
        *unnamed(ending_frames(enc, Cause.RECORD_GONE)),
    ]
    assert detach.calls == [True], "no `done` can ever come: nothing left to cancel"


async def test_a_stream_redis_refuses_to_read_ends_with_stream_unreadable(
    redis: redis_asyncio.Redis, hub: StreamHub, turn_id: str
) -> None:
    await redis.set(keys.events(turn_id), "not a stream")
    enc = encoder()
    detach = Detaches()
    events = await relayed(hub, enc, turn_id, detach=detach)
    assert frames_of(events) == unnamed(ending_frames(enc, Cause.UNREADABLE))
    assert detach.calls == [False]


# -- a reader further behind than the stream keeps (MAXLEN) ------------------------------

# What these streams are trimmed to, as a worker trims a turn's (`XADD MAXLEN ~`). Redis
# trims whole nodes of 100 entries, so a stream of a few hundred loses its first ones.
MAXLEN = 10


@pytest.fixture
async def trimming_hub(redis: redis_asyncio.Redis) -> AsyncIterator[StreamHub]:
    """A hub told its streams are trimmed to `MAXLEN`: it checks batches that long."""
    running = StreamHub(redis, block_ms=200, maxlen=MAXLEN)
    await running.start()
    yield running
    await running.stop()


async def burst(redis: redis_asyncio.Redis, turn_id: str, events: list[Event]) -> list[str]:
    """Append `events` at once (one transaction: a read sees all or none), trimmed to
    `MAXLEN` as a worker's appends are."""
    async with redis.pipeline(transaction=True) as pipe:
        for event in events:
            pipe.xadd(
                keys.events(turn_id),
                {STREAM_FIELD: encode(event)},
                maxlen=MAXLEN,
                approximate=True,
            )
        return [entry_id.decode() for entry_id in await pipe.execute()]


async def test_a_reader_that_falls_further_behind_than_the_stream_keeps_ends_stream_trimmed(
    redis: redis_asyncio.Redis, trimming_hub: StreamHub, turn_id: str
) -> None:
    """Entries written while the reader is not reading, more than the stream keeps: what
    is left after the hole is not sent; the terminal error is."""
    enc = encoder()
    (start,) = await write(redis, turn_id, Start())
    detach = Detaches()
    stream = relay(trimming_hub, enc, turn_id, keepalive_s=5, detach=detach)
    assert [event.id for event in await anext(stream)] == [start]
    written = await burst(redis, turn_id, [Delta(text=f" {k}") for k in range(300)])
    held = [entry_id.decode() for entry_id, _ in await redis.xrange(keys.events(turn_id))]
    assert start not in held and written[0] not in held, "the stream was not trimmed"
    async with asyncio.timeout(5):
        rest = [event async for batch in stream for event in batch]
    assert frames_of(rest) == unnamed(ending_frames(enc, Cause.TRIMMED))
    assert detach.calls == [False]


async def test_a_reader_that_keeps_up_with_a_stream_longer_than_it_keeps_gets_every_entry(
    redis: redis_asyncio.Redis,
    trimming_hub: StreamHub,
    turn_id: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Batches as long as the stream keeps (so each is checked), each read before the next
    lands: 300 entries through a stream of about `MAXLEN`, every one sent, no error."""
    asked: list[object] = []
    head_from = api.hub.head_from

    def counted(reply: object) -> object:
        asked.append(reply)
        return head_from(reply)

    monkeypatch.setattr(api.hub, "head_from", counted)
    enc = encoder()
    (start,) = await write(redis, turn_id, Start())
    stream = relay(trimming_hub, enc, turn_id, keepalive_s=5)
    sent = [event.id for event in await anext(stream)]
    expected = [start]
    for k in range(30):
        ids = await burst(redis, turn_id, [Delta(text=f" {k}.{j}") for j in range(MAXLEN)])
        expected += ids
        async with asyncio.timeout(5):
            while sent[-1] != ids[-1]:
                sent += [event.id for event in await anext(stream)]
    held = [entry_id.decode() for entry_id, _ in await redis.xrange(keys.events(turn_id))]
    assert start not in held, "the stream was not trimmed"
    (done,) = await write(redis, turn_id, DONE_EVENT)
    async with asyncio.timeout(5):
        sent += [event.id async for batch in stream for event in batch]
    assert sent == [*expected, f"{done}:0", f"{done}:1"]
    assert len(asked) >= 30, "every burst is a batch as long as the stream keeps: checked"


async def test_a_wait_for_the_done_is_not_ended_by_a_hole(
    redis: redis_asyncio.Redis, trimming_hub: StreamHub, turn_id: str
) -> None:
    """A cancel waits for the turn's `done` alone: whatever was trimmed before it does not
    matter to it (`whole=False`), while a relay from the start of that stream ends."""
    await write(redis, turn_id, Start())
    await burst(redis, turn_id, [Delta(text=f" {k}") for k in range(300)])
    await write(redis, turn_id, DONE_EVENT)
    async with asyncio.timeout(5):
        assert await api.session.StreamSession(trimming_hub, turn_id, 1.0).wait_for_done()
        events = await relayed(trimming_hub, encoder(), turn_id)
    assert frames_of(events) == unnamed(ending_frames(encoder(), Cause.TRIMMED))


# -- renewing the stream's slot, and the process's metrics --------------------------------


async def test_a_short_stream_is_not_renewed(
    redis: redis_asyncio.Redis, hub: StreamHub, turn_id: str
) -> None:
    renewals = []

    async def renew() -> None:
        renewals.append(True)

    await write(redis, turn_id, Start(), Delta(text="a"), Delta(text="b"), DONE_EVENT)
    await relayed(hub, encoder(), turn_id, renew=renew)
    assert renewals == []


async def test_a_long_stream_renews_its_slot_once_per_renewal_period(
    hub: StreamHub, turn_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(api.session, "RENEW_S", 0.2)
    renewals = []

    async def renew() -> None:
        renewals.append(True)

    stream = relay(hub, encoder(), turn_id, keepalive_s=0.02, renew=renew)
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with asyncio.timeout(5):
        async for _ in stream:
            if loop.time() - started > 0.7:
                break
    await stream.aclose()
    assert 2 <= len(renewals) <= 4, renewals


async def test_the_process_counts_open_streams_and_relayed_frames(
    redis: redis_asyncio.Redis, hub: StreamHub, turn_id: str
) -> None:
    await write(redis, turn_id, Start(), Delta(text="a"), completed("stop", None))
    open_before = counter("bernard_streams_open")
    relayed_before = counter("bernard_frames_relayed_total")
    stream = relay(hub, encoder(), turn_id, keepalive_s=5)
    first = await anext(stream)
    assert counter("bernard_streams_open") == open_before + 1
    rest = [event async for batch in stream for event in batch]
    assert counter("bernard_streams_open") == open_before
    frames = len(first) + len(rest)
    assert frames == 4  # start, delta, finish, [DONE]
    assert counter("bernard_frames_relayed_total") == relayed_before + frames
