"""Timers: set from a turn, fired by whichever worker is up when they are due, into the
conversation and onto the user's event stream (`GET /v1/events`); once, and never when
cancelled."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from httpx_sse import EventSource

from shared import keys
from shared.connection import connect
from shared.events import TimerFired
from shared.queue import BackgroundKind, background_job_id
from shared.records.reads import Archivist
from shared.timers import (
    MAX_TIMERS,
    TimerError,
    TimerStore,
    duration_in,
    parse_duration,
    publish,
)
from tests.support.processes import ProcessGroup, private_redis, wait_for
from tests.support.session_redis import session_redis_url
from tests.support.stack import Stack, make_settings, run_stack
from tests.support.upstream import Reply, ScriptedUpstream
from worker.tools.runtime import ToolRuntime, runtime_config
from worker.tools.timers import list_timers, set_timer


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90),
        ("90s", 90),
        ("5 minutes", 300),
        ("5 min", 300),
        ("1h 30m", 5400),
        ("1 hour and 20 seconds", 3620),
        ("2.5 min", 150),
        ("in 2 hrs", 7200),
    ],
)
def test_durations_are_read_as_people_say_them(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1h30m", 5400),
        ("1 hour, 20 seconds", 3620),
        ("1 hour, and 20 seconds", 3620),
        ("for 10 mins", 600),
        ("  3 SECONDS ", 3),
        ("0.5 min", 30),
        ("0h 5m", 300),
        ("7 days", 604_800),
        ("1 day", 86_400),
    ],
)
def test_durations_may_combine_units_with_commas_and_and(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("soon", "is not a duration"),
        ("", "is not a duration"),
        ("0 s", "above zero"),
        ("0", "above zero"),
        ("8 days", "at most 7 days"),
        ("200 hours", "at most 7 days"),
        ("604801", "at most 7 days"),
        # a sign, an exponent or a digit of another script is not read around
        ("-5 minutes", "is not a duration"),
        ("+5 minutes", "is not a duration"),
        ("1e9s", "is not a duration"),
        ("1e3", "is not a duration"),
        ("٥ minutes", "is not a duration"),  # Arabic-Indic five
        ("５ minutes", "is not a duration"),  # fullwidth five
        ("5\u00a0minutes", "is not a duration"),  # a no-break space
        ("١٠s", "is not a duration"),
        # every number has its unit, and nothing else is said
        ("1 30m", "is not a duration"),
        ("1:30", "is not a duration"),
        ("5 minutes please", "is not a duration"),
        ("5 minutes 5", "is not a duration"),
        ("about 5 minutes", "is not a duration"),
        ("5 fortnights", "is not a duration"),
        ("5 mins.", "is not a duration"),
        (".5 min", "is not a duration"),
        ("1.2.3 s", "is not a duration"),
        ("nan s", "is not a duration"),
        ("inf", "is not a duration"),
        ("99999999 s", "is not a duration"),  # more digits than any week needs
        ("1.0001 s", "is not a duration"),
        ("5 minutes " * 20, "is not a duration"),
    ],
)
def test_anything_but_a_positive_duration_of_a_week_at_most_is_refused(text: str, why: str) -> None:
    with pytest.raises(TimerError, match=why):
        parse_duration(text)


@pytest.mark.parametrize(
    ("sentence", "found"),
    [
        ("Set a timer for 5 minutes for the pasta", "5 minutes"),
        ("start a timer for 1 hour and 20 seconds", "1 hour and 20 seconds"),
        ("a timer, 1h30m, for bread", "1h30m"),
        ("set a timer for -5 minutes", None),
        ("set a timer for 1e9s", None),
        ("set a timer for ٥ minutes", None),
        ("set a timer for 90", None),  # a lone number is seconds only on its own
        ("set a timer", None),
    ],
)
def test_a_duration_is_found_in_a_sentence_by_the_same_grammar(
    sentence: str, found: str | None
) -> None:
    assert duration_in(sentence) == found


async def test_a_duration_the_parser_refuses_is_an_error_the_model_reads_and_no_timer() -> None:
    user = owner()
    settings = make_settings()
    redis = connect(settings.redis_url)
    try:
        runtime = ToolRuntime(owner=user, redis=redis, settings=settings)
        said = await set_timer.ainvoke(
            {"duration": "-5 minutes", "label": "tea"}, config=runtime_config(runtime, {})
        )
        assert said.startswith("Error: '-5 minutes' is not a duration: say e.g. '5 minutes'")
        assert await redis.exists(keys.timers(user)) == 0
    finally:
        await redis.aclose()


def owner() -> str:
    return f"timer-user-{uuid.uuid4().hex[:8]}"


async def events_of(
    base_url: str,
    headers: dict[str, str],
    count: int,
    timeout_s: float,
    connected: asyncio.Event | None = None,
    **params: str,
) -> list[tuple[str, str, dict[str, Any]]]:
    """The first `count` (id, event, data) of `GET /v1/events`; `connected` is set once
    the answer's headers arrived (the route has fixed where "from now on" starts)."""
    got: list[tuple[str, str, dict[str, Any]]] = []
    async with (
        httpx.AsyncClient(base_url=base_url, timeout=30) as client,
        client.stream("GET", "/v1/events", headers=headers, params=params) as response,
    ):
        assert response.status_code == 200, await response.aread()
        if connected is not None:
            connected.set()
        async with asyncio.timeout(timeout_s):
            async for sse in EventSource(response).aiter_sse():
                got.append((sse.id, sse.event, json.loads(sse.data)))
                if len(got) == count:
                    break
    return got


@dataclass
class User:
    """A user with an API key on a running stack, their timers and their conversations."""

    id: str
    headers: dict[str, str]
    stack: Stack
    timers: TimerStore
    archivist: Archivist

    async def start_conversation(self, conversation_id: str) -> None:
        created = await self.stack.client.post(
            "/v1/conversations", json={"id": conversation_id}, headers=self.headers
        )
        assert created.status_code == 201, created.text

    async def say(self, conversation_id: str, content: str) -> httpx.Response:
        return await self.stack.client.post(
            f"/v1/conversations/{conversation_id}/messages",
            json={"content": content},
            headers=self.headers,
        )

    async def listen(
        self, count: int, timeout_s: float
    ) -> asyncio.Task[list[tuple[str, str, dict]]]:
        """The first `count` events of the user's event stream, read from now on: returned
        once connected, so an event published after it is one of them (a fixed sleep was
        not enough on a loaded box)."""
        connected = asyncio.Event()
        listening = asyncio.create_task(
            events_of(self.stack.base_url, self.headers, count, timeout_s, connected)
        )
        async with asyncio.timeout(10):
            await connected.wait()
        return listening

    async def contents(self, conversation_id: str) -> list[str]:
        return [m["content"] for m in await self.archivist.messages(conversation_id)]

    async def until_said(self, conversation_id: str, text: str) -> None:
        async def said() -> bool:
            return text in await self.contents(conversation_id)

        await wait_for(said, timeout_s=10)

    async def until_rung(self) -> None:
        async def rang() -> bool:
            return [t.state for t in await self.timers.all()] == ["fired"]

        await wait_for(rang, timeout_s=5)


@contextlib.asynccontextmanager
async def signed_in(
    upstream: ScriptedUpstream, *, worker: bool = True, **overrides: Any
) -> AsyncIterator[User]:
    """A new user, key `key-u`, on a stack of its own (`overrides` change its settings)."""
    user = owner()
    settings = make_settings(upstream, api_keys=f"key-u:{user}", **overrides)
    async with run_stack(settings, worker=worker) as stack:
        timers = TimerStore(stack.redis, user, retention_s=60, queue_name=settings.queue_name)
        yield User(
            id=user,
            headers={"Authorization": "Bearer key-u"},
            stack=stack,
            timers=timers,
            archivist=Archivist(stack.redis, user),
        )


@pytest.fixture
async def user(upstream: ScriptedUpstream) -> AsyncIterator[User]:
    async with signed_in(upstream) as user:
        yield user


async def test_the_event_stream_resumes_after_the_last_event_id(upstream: ScriptedUpstream) -> None:
    async with signed_in(upstream, worker=False) as user:
        stack, redis = user.stack, user.stack.redis
        for label in ("first", "second"):
            fired = TimerFired(timer_id=label, label=label, conversation_id=None, due_at=0)
            await publish(redis, user.id, fired, retention_s=60)
        entries = await redis.xrange(keys.events(keys.user_stream_id(user.id)))
        first_id = entries[0][0].decode()
        after_first = await events_of(stack.base_url, user.headers, 1, 5, after=first_id)
        assert [(e, d["label"]) for _, e, d in after_first] == [("timer_fired", "second")]
        waiting = await user.listen(1, 5)
        fired = TimerFired(timer_id="third", label="third", conversation_id=None, due_at=0)
        await publish(redis, user.id, fired, retention_s=60)
        assert [d["label"] for _, _, d in await waiting] == ["third"]
        other = await stack.client.get("/v1/events", params={"after": "٣-٣"}, headers=user.headers)
        assert other.status_code == 400
        assert (await stack.client.get("/v1/events")).status_code == 401


async def test_a_timer_set_in_a_turn_rings_in_its_conversation_and_on_the_event_stream(
    upstream: ScriptedUpstream, user: User
) -> None:
    upstream.script_router(Reply.tool_calls([("set_timer", {"duration": "1s", "label": "tea"})]))
    upstream.script(Reply.text("Timer set."))
    listening = await user.listen(1, 10)
    answer = await user.stack.client.post(
        "/v1/chat/completions",
        json={
            "model": "bernard-v1",
            "conversation_id": "kitchen",
            "messages": [{"role": "user", "content": "tea timer, one second"}],
        },
        headers=user.headers,
    )
    assert answer.status_code == 200, answer.text
    outputs = answer.json()["bernard"]["tool_outputs"]
    assert outputs[0]["content"].startswith("Timer “tea” set for 1 s")
    [(_, event, data)] = await listening
    assert (event, data["label"], data["conversation_id"]) == ("timer_fired", "tea", "kitchen")
    rows = await user.archivist.messages("kitchen")
    assert rows[-1] == {"role": "assistant", "content": "⏰ Your timer “tea” is done."}


def well_formed(rows: list[dict[str, Any]]) -> bool:
    """Whether every tool message follows its own call (after the call's other results), as
    an OpenAI-style upstream requires of a prompt, and every call has its result."""
    waiting: set[str] = set()
    for row in rows:
        if row["role"] == "tool":
            if row["tool_call_id"] not in waiting:
                return False
            waiting.discard(row["tool_call_id"])
            continue
        if waiting:
            return False
        waiting = {call["id"] for call in row.get("tool_calls") or ()}
    return not waiting


RANG = "⏰ Your timer “tea” is done."


async def test_a_timer_ringing_while_a_call_waits_for_a_decision_is_said_once_it_is_decided(
    upstream: ScriptedUpstream, user: User
) -> None:
    """The conversation waits for the user's decision on a tool call when the timer rings:
    the user hears it at once on the event stream, and the conversation says it after the
    call's result and the answer, never between the call and its result (the resumed turn
    then stored an orphan result, and every later prompt had a call without one)."""
    await user.start_conversation("kitchen")
    upstream.script_router(Reply.tool_calls([("save_note", {"text": "the door code is 1234"})]))
    paused = await user.say("kitchen", "remember the door code")
    assert paused.json()["status"] == "awaiting_confirmation", paused.text
    listening = await user.listen(1, 10)
    await user.timers.set(0.5, "tea", "kitchen")
    [(_, event, data)] = await listening
    assert (event, data["label"]) == ("timer_fired", "tea"), "heard on time"
    await asyncio.sleep(1.5)  # its job ran, and tried again, while the call waited
    assert RANG not in await user.contents("kitchen")

    upstream.script(Reply.text("Saved it."))
    confirmation = paused.json()["pending_confirmation"]["confirmation_id"]
    approved = await user.stack.client.post(
        "/v1/conversations/kitchen/resume",
        json={"confirmation_id": confirmation, "decision": "approve"},
        headers=user.headers,
    )
    assert approved.status_code == 200, approved.text

    await user.until_said("kitchen", RANG)
    rows = await user.archivist.messages("kitchen")
    timers = await user.timers.all()
    assert [(m["role"], m["content"]) for m in rows] == [
        ("user", "remember the door code"),
        ("assistant", "Shall I remember “the door code is 1234”?"),
        ("tool", "Saved: the door code is 1234"),
        ("assistant", "Saved it."),
        ("assistant", RANG),
    ]
    assert well_formed(rows)
    assert well_formed(
        [m for m in upstream.router_requests[-1]["messages"] if m["role"] != "system"]
    )
    assert [(t.state, t.announced) for t in timers] == [("fired", True)]


async def test_a_timer_ringing_after_a_call_lapsed_undecided_is_said_after_the_next_turn(
    upstream: ScriptedUpstream,
) -> None:
    """The call waited past its time: the conversation is idle, but its history ends on the
    call, which the next turn answers "not run"; the timer's message comes after that turn,
    never between the call and its answer."""
    async with signed_in(upstream, confirmation_ttl_s=1) as user:
        await user.start_conversation("kitchen")
        upstream.script_router(Reply.tool_calls([("save_note", {"text": "the door code is 1234"})]))
        paused = await user.say("kitchen", "remember the door code")
        assert paused.json()["status"] == "awaiting_confirmation", paused.text
        await asyncio.sleep(1.2)  # lapsed
        await user.timers.set(0.2, "tea", "kitchen")
        await user.until_rung()
        await asyncio.sleep(0.5)
        assert RANG not in await user.contents("kitchen")
        upstream.script(Reply.text("Never mind then."))
        moved_on = await user.say("kitchen", "forget it")
        assert moved_on.status_code == 200, moved_on.text
        await user.until_said("kitchen", RANG)
        rows = await user.archivist.messages("kitchen")
    assert [(m["role"], m["content"]) for m in rows] == [
        ("user", "remember the door code"),
        ("assistant", "Shall I remember “the door code is 1234”?"),
        ("tool", "Not run: the user did not confirm this in time."),
        ("user", "forget it"),
        ("assistant", "Never mind then."),
        ("assistant", RANG),
    ]
    assert well_formed(rows)


async def test_a_timer_ringing_while_a_turn_runs_is_said_after_its_answer(
    upstream: ScriptedUpstream, user: User
) -> None:
    await user.start_conversation("kitchen")
    held = upstream.script(Reply.text("Otters hold hands.", block_after_first=True))
    asking = asyncio.create_task(user.say("kitchen", "tell me about otters"))
    await held.wait_blocked()
    await user.timers.set(0.3, "tea", "kitchen")
    await user.until_rung()
    await asyncio.sleep(0.3)
    held.release()
    assert (await asking).status_code == 200
    await user.until_said("kitchen", RANG)
    await asyncio.sleep(1.2)  # time for a second message, were there one
    rows = await user.archivist.messages("kitchen")
    assert [(m["role"], m["content"]) for m in rows] == [
        ("user", "tell me about otters"),
        ("assistant", "Otters hold hands."),
        ("assistant", RANG),
    ]


async def test_a_timer_whose_job_stopped_after_it_rang_is_heard_and_said_by_its_next_run(
    user: User,
) -> None:
    """A job moved the timer to `fired` and was stopped there (its worker shut down; the job
    runs again, worker/queue.py): the next run publishes the event and says it, once."""
    await user.start_conversation("hall")
    listening = await user.listen(1, 5)
    timer = await user.timers.set(0.5, "bread", "hall")
    moved, _ = await user.timers.move(timer.id, "fired")  # as the stopped run did
    assert moved
    [(_, event, data)] = await listening
    assert (event, data["label"]) == ("timer_fired", "bread")
    await asyncio.sleep(1.0)  # time for a second ring, were there one
    stream = await user.stack.redis.xrange(keys.events(keys.user_stream_id(user.id)))
    rows = await user.archivist.messages("hall")
    timers = await user.timers.all()
    assert len(stream) == 1
    assert [m["content"] for m in rows] == ["⏰ Your timer “bread” is done."]
    assert [(t.state, t.heard, t.announced) for t in timers] == [("fired", True, True)]


async def test_a_cancelled_timer_never_rings(upstream: ScriptedUpstream) -> None:
    user = owner()
    settings = make_settings(upstream)
    async with run_stack(settings) as stack:
        store = TimerStore(
            connect(settings.redis_url), user, retention_s=60, queue_name=settings.queue_name
        )
        try:
            timer = await store.set(0.5, "eggs", None)
            cancelled = await store.cancel(timer.id)
            assert cancelled is not None and cancelled.state == "cancelled"
            await asyncio.sleep(2.0)  # well past due, with a worker polling the queue
            assert [t.state for t in await store.all()] == ["cancelled"]
            stream = keys.events(keys.user_stream_id(user))
            assert await stack.redis.exists(stream) == 0, "nothing was published"
        finally:
            await store.redis.aclose()


async def test_timers_are_listed_with_the_time_left(upstream: ScriptedUpstream) -> None:
    user = owner()
    settings = make_settings(upstream)
    redis = connect(settings.redis_url)
    try:
        store = TimerStore(redis, user, retention_s=60, queue_name=settings.queue_name)
        await store.set(125, "laundry", None)
        runtime = ToolRuntime(owner=user, redis=redis, settings=settings)
        listed = await list_timers.ainvoke({}, config=runtime_config(runtime, {}))
        assert listed.startswith("- “laundry” (timer_") and listed.endswith("2 min 5 s left")
        timers = await store.all()
        await redis.zrem(
            settings.queue_name,
            *(background_job_id(BackgroundKind.TIMER, user, t.id) for t in timers),
        )
    finally:
        await redis.aclose()


async def test_a_timer_rings_once_after_its_worker_restarted(
    upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    user = owner()
    async with private_redis(tmp_path / "redis") as server:
        settings = make_settings(upstream, redis_url=server.url, api_keys=f"key-u:{user}")
        headers = {"Authorization": "Bearer key-u"}
        async with ProcessGroup(tmp_path / "logs") as procs:
            first = await procs.worker(settings, name="first-worker")
            api = await procs.api(settings)
            redis = connect(server.url)
            try:
                store = TimerStore(redis, user, retention_s=60, queue_name=settings.queue_name)
                await redis.hset(
                    keys.conversation(user, "hall"),
                    mapping={"id": "hall", "owner": user, "created_at": 0, "updated_at": 0},
                )
                await store.set(2.0, "bread", "hall")
                first.kill()  # the worker that was up when it was set is gone
                listening = asyncio.create_task(events_of(api.base_url or "", headers, 1, 15))
                await procs.worker(settings, name="second-worker")
                [(_, event, data)] = await listening
                assert (event, data["label"]) == ("timer_fired", "bread")
                await asyncio.sleep(1.5)  # time for a second ring, were there one
                stream = await redis.xrange(keys.events(keys.user_stream_id(user)))
                rows = await Archivist(redis, user).messages("hall")
            finally:
                await redis.aclose()
    assert len(stream) == 1
    assert [r["content"] for r in rows] == ["⏰ Your timer “bread” is done."]


async def test_rung_and_cancelled_timers_make_room_and_running_ones_are_the_limit() -> None:
    """A user who keeps setting timers holds at most `MAX_TIMERS` records: the ones that rang
    or were cancelled are dropped when a new one needs the room; running ones never are."""
    user, queue = owner(), f"bernard:test:{uuid.uuid4().hex[:8]}"
    redis = connect(session_redis_url())
    store = TimerStore(redis, user, retention_s=60, queue_name=queue)
    made: list[str] = []
    try:
        first = [await store.set(600, f"t{k}", None) for k in range(MAX_TIMERS)]
        made += [t.id for t in first]
        with pytest.raises(TimerError, match="timers running"):
            await store.set(600, "one too many", None)
        for timer in first[:3]:
            await store.cancel(timer.id)
        newest = await store.set(600, "room again", None)
        made.append(newest.id)
        held = await store.all()
        assert len(held) == MAX_TIMERS - 2
        assert newest.id in {t.id for t in held}
        assert all(t.state == "pending" for t in held)
    finally:
        jobs = [f"arq:job:{background_job_id(BackgroundKind.TIMER, user, i)}" for i in made]
        await redis.delete(keys.timers(user), queue, *jobs)
        await redis.aclose()


async def test_the_timer_cap_holds_under_50_concurrent_set_timer_calls() -> None:
    """50 calls at once, with 45 timers running and 5 rung or cancelled: 5 are set, 45 told
    the limit, and none fails otherwise (the old check-then-write overran the cap and sent
    an HDEL with no fields when another call had already dropped the done ones)."""
    user = owner()
    settings = make_settings(queue_name=f"bernard:test:{uuid.uuid4().hex[:8]}")
    redis = connect(settings.redis_url)
    store = TimerStore(redis, user, retention_s=60, queue_name=settings.queue_name)
    try:
        first = [await store.set(600, f"t{k}", None) for k in range(MAX_TIMERS)]
        for timer in first[:5]:
            await store.cancel(timer.id)
        config = runtime_config(ToolRuntime(owner=user, redis=redis, settings=settings), {})
        said = await asyncio.gather(
            *(
                set_timer.ainvoke({"duration": "10 minutes", "label": f"c{k}"}, config=config)
                for k in range(50)
            )
        )
        held = await store.all()
    finally:
        made = [t.id for t in await store.all()]
        await redis.delete(
            keys.timers(user), settings.queue_name, *(f"arq:job:timer:{i}" for i in made)
        )
        await redis.aclose()
    refused = [s for s in said if s.startswith("Error:")]
    assert set(refused) == {f"Error: you already have {MAX_TIMERS} timers running"}
    assert len(said) - len(refused) == 5
    assert len(held) == MAX_TIMERS
    assert all(t.state == "pending" for t in held)
