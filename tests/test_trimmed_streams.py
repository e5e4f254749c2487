"""A client further behind than a stream keeps (`BERNARD_STREAM_MAXLEN`, `XADD MAXLEN ~`)
gets a terminal `stream_trimmed` error, never the rest of the stream after a hole; a client
that keeps up with a stream longer than that gets all of it.

Real API and worker over real HTTP, with streams trimmed to 10 entries. Redis trims whole
nodes of 100 entries, so a turn of a few hundred entries loses its first ones.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
from httpx_sse import EventSource

from shared import keys
from shared.events import Delta, encode
from shared.streams import STREAM_FIELD
from tests.support.chat import body
from tests.support.sse import Frame, collect, error_code, frames, text_of
from tests.support.stack import Stack, make_settings, run_stack
from tests.support.upstream import Reply, ScriptedUpstream

CHAT = "/v1/chat/completions"
MAXLEN = 10
TOKENS = [f"w{i} " for i in range(400)]
USER = f"trim-user-{uuid.uuid4().hex[:8]}"
AS_USER = {"Authorization": "Bearer key-t"}


@pytest.fixture
async def stack(upstream: ScriptedUpstream) -> AsyncIterator[Stack]:
    settings = make_settings(upstream, stream_maxlen=MAXLEN, api_keys=f"key-t:{USER}")
    async with run_stack(settings) as running:
        running.client.headers.update(AS_USER)
        yield running


async def trimmed_count(stack: Stack, stream: str) -> int:
    """How many entries Redis has trimmed from the stream's start so far."""
    info = await stack.redis.xinfo_stream(stream)
    return int(info["entries-added"]) - int(info["length"])


async def wait_finished(stack: Stack, turn_id: str) -> None:
    async with asyncio.timeout(20):
        while True:
            turn = (await stack.client.get(f"/v1/turns/{turn_id}")).json()
            if turn["status"] == "completed":
                return
            await asyncio.sleep(0.02)


async def a_long_turn_left_early(stack: Stack, upstream: ScriptedUpstream) -> tuple[str, Frame]:
    """A turn of some hundreds of entries whose client left after its first frames, run to
    its end: its turn id, and the last frame the client had."""
    upstream.script(Reply.text(TOKENS, chunk_delay=0.001))
    seen: list[Frame] = []
    request = body(stream=True, on_disconnect="continue")
    async with stack.client.stream("POST", CHAT, json=request) as response:
        turn_id = response.headers["x-bernard-turn-id"]
        async for frame in frames(response):
            seen.append(frame)
            if len(seen) == 3:
                break
    await wait_finished(stack, turn_id)
    assert text_of(seen), "the client had some of the answer"
    stream = keys.events(turn_id)
    held = {entry_id.decode() for entry_id, _ in await stack.redis.xrange(stream)}
    assert await trimmed_count(stack, stream) > 0 and seen[-1].id not in held, "not trimmed"
    return turn_id, seen[-1]


def ends_stream_trimmed(got: list[Frame]) -> None:
    """No answer text, the terminal error, `[DONE]`: the chat shape of a stream's end."""
    assert text_of(got) == "", "nothing after the hole is sent"
    assert error_code(got) == "stream_trimmed"
    assert got[-1].done
    assert "BERNARD_STREAM_MAXLEN" in got[-2].json["error"]["message"]


async def test_a_resume_from_an_entry_trimmed_since_ends_stream_trimmed_rather_than_jumping(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    turn_id, last = await a_long_turn_left_early(stack, upstream)
    async with asyncio.timeout(10):
        got = await collect(
            stack.client, "GET", f"/v1/turns/{turn_id}/events", headers={"Last-Event-ID": last.id}
        )
    ends_stream_trimmed(got)


async def test_a_reader_from_the_start_of_a_trimmed_stream_ends_stream_trimmed(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    """Its first read comes far behind the stream's end: the turn's first entries (its
    `start` among them) went before it read them."""
    turn_id, _ = await a_long_turn_left_early(stack, upstream)
    async with asyncio.timeout(10):
        got = await collect(stack.client, "GET", f"/v1/turns/{turn_id}/events")
    ends_stream_trimmed(got)


async def test_a_client_that_keeps_up_with_a_turn_longer_than_the_stream_keeps_gets_all_of_it(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.text(TOKENS, chunk_delay=0.001))
    async with (
        asyncio.timeout(20),
        stack.client.stream("POST", CHAT, json=body(stream=True)) as response,
    ):
        turn_id = response.headers["x-bernard-turn-id"]
        got = [frame async for frame in frames(response)]
    assert await trimmed_count(stack, keys.events(turn_id)) > 0, "the stream was trimmed"
    assert error_code(got) is None
    assert text_of(got) == "".join(TOKENS)
    assert got[-1].done


async def test_the_users_event_stream_resumed_past_what_it_keeps_ends_with_an_error_event(
    stack: Stack,
) -> None:
    """`GET /v1/events`: the terminal error as that stream's own `error` event, which
    tells the client to come back without its cursor."""
    stream = keys.events(keys.user_stream_id(USER))
    ids = []
    for k in range(300):  # as `timer_fired` events land, trimmed here to `MAXLEN`
        payload = encode(Delta(text=f"{k}"))
        entry_id = await stack.redis.xadd(stream, {STREAM_FIELD: payload}, maxlen=MAXLEN)
        ids.append(entry_id.decode())
    assert await trimmed_count(stack, stream) > 0
    got = []
    async with (
        httpx.AsyncClient(base_url=stack.base_url, timeout=10, headers=AS_USER) as client,
        client.stream("GET", "/v1/events", headers={"Last-Event-ID": ids[0]}) as response,
        asyncio.timeout(10),
    ):
        assert response.status_code == 200, await response.aread()
        async for sse in EventSource(response).aiter_sse():
            got.append((sse.event, json.loads(sse.data)))
    assert [event for event, _ in got] == ["error"]
    assert got[0][1]["code"] == "stream_trimmed"
    await stack.redis.delete(stream)
