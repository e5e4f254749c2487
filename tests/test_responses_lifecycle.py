"""Responses that outlive their request (api/routes/responses.py), through the official
`openai` SDK: background mode, polling, resuming a stream after any `sequence_number` on
any API process, cancel (which closes the upstream call), delete, input items, and the
per-user 404."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest

from shared import keys
from shared.events import Start
from shared.streams import parse_entries
from tests.support.stack import Stack, make_settings, run_api, run_stack
from tests.support.upstream import Reply, ScriptedUpstream


def sdk(base_url: str, key: str = "anything") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0)


async def poll(client: openai.AsyncOpenAI, response_id: str, wanted: set[str]) -> Any:
    async with asyncio.timeout(10):
        while True:
            response = await client.responses.retrieve(response_id)
            if response.status in wanted:
                return response
            await asyncio.sleep(0.02)


def dumped(events: list[Any]) -> list[dict[str, Any]]:
    """The SDK's events as the JSON they were parsed from."""
    return [event.model_dump(mode="json") for event in events]


async def events_of(client: openai.AsyncOpenAI, response_id: str, after: int | None) -> list[Any]:
    if after is None:
        stream = await client.responses.retrieve(response_id, stream=True)
    else:
        stream = await client.responses.retrieve(response_id, stream=True, starting_after=after)
    return [event async for event in stream]


async def test_background_answers_the_queued_response_at_once_then_polls_to_completed(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    gate = upstream.script(Reply.text(["in", " the", " background"], block_after_first=True))
    client = sdk(stack.base_url)
    queued = await client.responses.create(model="bernard-v1", input="hello", background=True)
    assert queued.status in ("queued", "in_progress")
    assert queued.background is True and queued.output == []
    await gate.wait_blocked()
    assert (await client.responses.retrieve(queued.id)).status == "in_progress"
    gate.release()
    done = await poll(client, queued.id, {"completed"})
    assert done.output_text == "in the background"
    assert done.id == queued.id and done.background is True
    assert done.completed_at is not None


@pytest.mark.parametrize("tool", [False, True], ids=["text", "bernards tool then text"])
async def test_resuming_after_every_sequence_number_gives_exactly_the_rest_on_any_api(
    stack: Stack, upstream: ScriptedUpstream, tool: bool
) -> None:
    if tool:  # an mcp_call item with its argument, progress and completion events first
        upstream.script_router(Reply.tool_calls([("calculator", {"expression": "6 * 7"})]))
    upstream.script(Reply.text([f"t{i} " for i in range(8)], usage=(3, 8)))
    first = sdk(stack.base_url)
    created = await first.responses.create(model="bernard-v1", input="hello", background=True)
    await poll(first, created.id, {"completed"})
    full = await events_of(first, created.id, None)
    assert [e.sequence_number for e in full] == list(range(len(full)))
    assert full[-1].type == "response.completed" and len(full) >= 9
    kinds = {event.type for event in full}
    assert ("response.mcp_call.progress" in kinds) is tool
    async with run_api(stack.settings) as other_url:
        other = sdk(other_url)
        for n in range(len(full)):
            client = other if n % 2 else first
            rest = await events_of(client, created.id, n)
            assert dumped(rest) == dumped(full[n + 1 :]), f"resume after {n}"


async def xrange_calls(stack: Stack) -> int:
    """The XRANGE commands the test's Redis has run (the replays' reads: api/replays.py)."""
    stats = await stack.redis.info("commandstats")
    return int(stats.get("cmdstat_xrange", {}).get("calls", 0))


async def test_a_long_stream_is_replayed_a_chunk_at_a_time_and_exactly(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    """A resume reads the stream 200 entries a round trip (two XRANGEs: the chunk, then
    the stream's first entry, which says nothing after the chunk was trimmed), and gives
    exactly the live stream's events after any number, across the chunks' seams."""
    tokens = [f" w{i}" for i in range(450)]
    upstream.script(Reply.text(tokens, chunk_delay=0.002))
    client = sdk(stack.base_url)
    created = await client.responses.create(model="bernard-v1", input="hi", background=True)
    await poll(client, created.id, {"completed"})
    length = int(await stack.redis.xlen(keys.events(created.id.removeprefix("resp_"))))
    assert length > 400, length  # three chunks at least
    full = await events_of(client, created.id, None)
    assert [e.sequence_number for e in full] == list(range(len(full)))
    for n in (0, 150, 200, 201, 398, len(full) - 2):
        before = await xrange_calls(stack)
        rest = await events_of(client, created.id, n)
        assert await xrange_calls(stack) - before == 2 * -(-length // 200), n
        assert dumped(rest) == dumped(full[n + 1 :]), f"resume after {n}"


async def test_a_resume_over_the_users_streams_is_refused_before_reading_the_stream(
    upstream: ScriptedUpstream,
) -> None:
    """The user's stream budget (BERNARD_MAX_STREAMS_PER_USER) is taken before the replay:
    a resume past it is a 429 that read nothing of the stream."""
    async with run_stack(make_settings(upstream, max_streams_per_user=1)) as stack:
        client = sdk(stack.base_url)
        upstream.script(Reply.text([f" w{i}" for i in range(50)]))
        done = await client.responses.create(model="bernard-v1", input="hi")
        gate = upstream.script(Reply.text(["held", " open"], block_after=1))
        held = await client.responses.create(model="bernard-v1", input="hi", stream=True)
        async for event in held:
            if event.type == "response.output_text.delta":
                break
        await gate.wait_blocked()
        before = await xrange_calls(stack)
        refused = await stack.client.get(
            f"/v1/responses/{done.id}", params={"stream": "true", "starting_after": 3}
        )
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert await xrange_calls(stack) == before
        gate.release()
        async for _ in held:
            pass
        # Once the held stream's slot is given back (as it closes), a resume is taken again.
        async with asyncio.timeout(5):
            while True:
                try:
                    rest = await events_of(client, done.id, 3)
                    break
                except openai.RateLimitError:
                    await asyncio.sleep(0.05)
        assert rest[-1].type == "response.completed"


async def test_a_dropped_stream_resumes_exactly_where_it_left(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    tokens = [f" w{i}" for i in range(20)]
    upstream.script(Reply.text(tokens, chunk_delay=0.01))
    client = sdk(stack.base_url)
    seen: list[Any] = []
    stream = await client.responses.create(
        model="bernard-v1", input="hello", background=True, stream=True
    )
    async for event in stream:
        seen.append(event)
        if event.type == "response.output_text.delta":
            break
    await stream.close()  # the connection drops mid-answer
    assert (seen[0].response.status, seen[0].response.background) == ("queued", True)
    response_id = seen[0].response.id
    seen += await events_of(client, response_id, seen[-1].sequence_number)
    assert [e.sequence_number for e in seen] == list(range(len(seen)))
    assert seen[-1].type == "response.completed"
    text = "".join(e.delta for e in seen if e.type == "response.output_text.delta")
    assert text == "".join(tokens)
    assert dumped(seen) == dumped(await events_of(client, response_id, None))


async def test_cancel_stops_the_turn_and_closes_the_upstream_call(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.slow(interval=0.01))
    client = sdk(stack.base_url)
    created = await client.responses.create(model="bernard-v1", input="hello", background=True)
    await upstream.wait_requests(1)
    cancelled = await client.responses.cancel(created.id)
    assert cancelled.status == "cancelled"
    exchange = await upstream.wait_disconnect(timeout_s=5)
    assert exchange.ended and exchange.completed_at is None
    assert (await client.responses.retrieve(created.id)).status == "cancelled"
    again = await client.responses.cancel(created.id)
    assert again.status == "cancelled"
    events = await events_of(client, created.id, None)
    assert events[-1].type == "response.cancelled"
    assert events[-1].response["status"] == "cancelled"  # a type the SDK does not know


def texts(items: list[Any]) -> list[str]:
    return [item.content[0].text for item in items]


async def test_input_items_and_delete(stack: Stack, upstream: ScriptedUpstream) -> None:
    upstream.script(Reply.text("Answer."))
    client = sdk(stack.base_url)
    response = await client.responses.create(
        model="bernard-v1", input=[{"role": "user", "content": "the question"}]
    )
    items = await client.responses.input_items.list(response.id)
    assert [(i.type, i.role, i.content[0].text) for i in items.data] == [  # type: ignore[union-attr]
        ("message", "user", "the question")
    ]
    upstream.script(Reply.text("Later."))
    later = await client.responses.create(
        model="bernard-v1",
        previous_response_id=response.id,
        input=[{"role": "user", "content": f"q{i}"} for i in range(5)],  # type: ignore[misc]
    )
    # Newest first, as OpenAI lists them; each page after the last item of the one before.
    newest = await client.responses.input_items.list(later.id)
    assert texts(newest.data) == ["q4", "q3", "q2", "q1", "q0"]
    oldest = await client.responses.input_items.list(later.id, order="asc", limit=2)
    assert texts(oldest.data) == ["q0", "q1"] and oldest.has_more
    async with asyncio.timeout(10):
        paged = [item async for item in client.responses.input_items.list(later.id, limit=2)]
    assert texts(paged) == ["q4", "q3", "q2", "q1", "q0"]
    with pytest.raises(openai.BadRequestError) as unknown:
        await client.responses.input_items.list(later.id, after=items.data[0].id)
    assert unknown.value.param == "after"  # type: ignore[attr-defined]
    await client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.delete(response.id)


async def test_another_users_response_is_a_404_everywhere(upstream: ScriptedUpstream) -> None:
    settings = make_settings(upstream, api_keys="key-alice:alice,key-bob:bob")
    async with run_stack(settings) as stack:
        upstream.script(Reply.text("Alice's."))
        alice = sdk(stack.base_url, "key-alice")
        bob = sdk(stack.base_url, "key-bob")
        response = await alice.responses.create(model="bernard-v1", input="hello")
        for attempt in (
            bob.responses.retrieve(response.id),
            bob.responses.cancel(response.id),
            bob.responses.delete(response.id),
            bob.responses.input_items.list(response.id),
            bob.responses.create(
                model="bernard-v1", input="more", previous_response_id=response.id
            ),
        ):
            with pytest.raises(openai.NotFoundError):
                await attempt
        with pytest.raises(openai.NotFoundError):
            await events_of(bob, response.id, 0)
        assert (await alice.responses.retrieve(response.id)).output_text == "Alice's."


async def test_after_the_streams_retention_the_replay_is_built_from_the_record(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script_router(Reply.tool_calls([("calculator", {"expression": "6 * 7"})]))
    upstream.script(Reply.text(["It", " is", " 42."], usage=(3, 3)))
    client = sdk(stack.base_url)
    response = await client.responses.create(model="bernard-v1", input="6*7?")
    await stack.redis.delete(keys.events(response.id.removeprefix("resp_")))  # as if expired
    replay = await events_of(client, response.id, None)
    assert [e.type for e in replay] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.output_item.done",
        "response.output_item.added",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in replay] == list(range(7))
    assert replay[3].item.type == "mcp_call" and replay[3].item.output == "42"
    assert replay[-1].response.output_text == "It is 42."


async def exact_or_refused(client: openai.AsyncOpenAI, response_id: str, live: list[Any]) -> int:
    """Resume after every sequence number of `live` (the stream as it was sent): each gives
    exactly the rest of it, or is refused with a 409 naming `starting_after`, never other
    events. How many were refused."""
    refused = 0
    for n in range(len(live)):
        try:
            rest = await events_of(client, response_id, n)
        except openai.ConflictError as conflict:
            body = conflict.body
            assert isinstance(body, dict), body
            assert (body["code"], body["param"]) == ("resume_unavailable", "starting_after")
            refused += 1
            continue
        assert dumped(rest) == dumped(live[n + 1 :]), f"resume after {n}"
    return refused


async def test_after_the_streams_retention_no_resume_gives_other_numbers_than_the_live_stream(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script_router(Reply.tool_calls([("calculator", {"expression": "6 * 7"})]))
    upstream.script(Reply.text(["It", " is", " 42."], usage=(3, 3)))
    client = sdk(stack.base_url)
    response = await client.responses.create(model="bernard-v1", input="6*7?")
    live = await events_of(client, response.id, None)
    assert len(live) > 7  # the replay of the record has 7: its numbers after 1 differ
    await stack.redis.delete(keys.events(response.id.removeprefix("resp_")))  # as if expired
    assert await exact_or_refused(client, response.id, live) == len(live)


async def test_a_stream_trimmed_by_its_maxlen_is_never_resumed_with_other_numbers(
    upstream: ScriptedUpstream,
) -> None:
    # Redis trims a stream (`XADD MAXLEN ~`) a whole node of entries (100) at a time: the
    # answer's pieces, each an entry, come far enough apart to be written one by one.
    # A resume after each of its events: more requests than the rate limit's burst.
    tokens = [f" m{i}" for i in range(250)]
    settings = make_settings(upstream, stream_maxlen=10, rate_limit_per_minute=0)
    async with run_stack(settings) as stack:
        client = sdk(stack.base_url)
        upstream.script(Reply.text(tokens, chunk_delay=0.002))
        live_stream = await client.responses.create(model="bernard-v1", input="hi", stream=True)
        live = [event async for event in live_stream]
        assert [e.sequence_number for e in live] == list(range(len(live)))
        assert live[-1].response.output_text == "".join(tokens)
        response_id = live[0].response.id
        stream = keys.events(response_id.removeprefix("resp_"))
        ((_, first),) = parse_entries(await stack.redis.xrange(stream, count=1))
        assert not isinstance(first.event, Start), "the stream lost its start to the MAXLEN"
        assert await exact_or_refused(client, response_id, live) == len(live)
        # From the start, the finished response is replayed from its record: whole, dense.
        replay = await events_of(client, response_id, None)
        assert [e.sequence_number for e in replay] == list(range(len(replay)))
        assert replay[-1].type == "response.completed"
        assert replay[-1].response.output_text == "".join(tokens)


async def test_a_bad_starting_after_or_id_is_refused(stack: Stack) -> None:
    bad = await stack.client.get("/v1/responses/resp_x?stream=true&starting_after=-1")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "starting_after"
    for unknown in ("resp_nothing", "nothing", "resp_"):
        missing = await stack.client.get(f"/v1/responses/{unknown}")
        assert missing.status_code == 404, unknown
        assert missing.json()["error"]["param"] == "response_id"


async def test_a_running_response_resumes_on_another_api_process(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    tokens = [f" r{i}" for i in range(12)]
    gate = upstream.script(Reply.text(tokens, block_after=4))
    first = sdk(stack.base_url)
    seen: list[Any] = []
    stream = await first.responses.create(
        model="bernard-v1", input="hello", background=True, stream=True
    )
    async for event in stream:
        seen.append(event)
        if event.type == "response.output_text.delta":
            break
    await stream.close()
    await gate.wait_blocked()
    async with run_api(stack.settings) as other_url:
        resumed = await sdk(other_url).responses.retrieve(
            seen[0].response.id, stream=True, starting_after=seen[-1].sequence_number
        )
        gate.release()  # the rest is written while the other process relays it
        seen += [event async for event in resumed]
    assert [e.sequence_number for e in seen] == list(range(len(seen)))
    assert seen[-1].type == "response.completed"
    text = "".join(e.delta for e in seen if e.type == "response.output_text.delta")
    assert text == "".join(tokens)
