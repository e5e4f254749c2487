"""Turns that outlive their connection: resume, background turns, stop, disconnect policy."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

import worker.liveness
from shared import keys
from shared.connection import connect
from shared.lifecycle import Cause, Finished
from shared.settings import Settings
from shared.streams import parse_entries
from shared.turns import TurnStore
from tests.support.chat import body
from tests.support.sse import Frame, collect, frames, wire
from tests.support.stack import Stack, make_settings, run_stack, run_worker, wait_status
from tests.support.upstream import Reply, ScriptedUpstream

CHAT = "/v1/chat/completions"


async def stored_types(stack: Stack, turn_id: str) -> list[str]:
    """The types of the entries in the turn's stream as Redis holds them (joined deltas
    counted once): what any reader could ever be sent, not what one relay sent."""
    types: list[str] = []
    for _, stamped in parse_entries(await stack.redis.xrange(keys.events(turn_id))):
        if not (types and types[-1] == stamped.event.type == "delta"):
            types.append(stamped.event.type)
    return types


async def finished_turn(stack: Stack, upstream: ScriptedUpstream, **extra: Any) -> str:
    upstream.script(Reply.text([f"t{i} " for i in range(12)], usage=(3, 12)))
    response = await stack.client.post(
        CHAT,
        json=body(stream=True, stream_options={"include_usage": True, "trace": True}, **extra),
    )
    return response.headers["x-bernard-turn-id"]


async def test_resuming_after_every_frame_gives_exactly_the_rest_of_the_stream(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    turn_id = await finished_turn(stack, upstream)
    full = await stack.replay(turn_id)
    # Role, content (deltas may be coalesced), two traces, finish, usage, [DONE].
    assert full[-1].done and len(full) >= 8
    assert len({f.id for f in full}) == len(full), "every frame has its own id"
    for k, frame in enumerate(full[:-1]):
        rest = await stack.replay(turn_id, after=frame.id)
        assert wire(full[: k + 1] + rest) == wire(full), f"resume after frame {k}"


async def test_resume_with_the_after_query_parameter(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    turn_id = await finished_turn(stack, upstream)
    full = await stack.replay(turn_id)
    rest = await collect(stack.client, "GET", f"/v1/turns/{turn_id}/events?after={full[3].id}")
    assert wire(rest) == wire(full[4:])


@pytest.mark.parametrize("chunk", [1, 2, 3, 5])
async def test_a_client_that_keeps_dropping_and_resuming_misses_and_repeats_nothing(
    stack: Stack, upstream: ScriptedUpstream, chunk: int
) -> None:
    upstream.script(Reply.text([f"w{i} " for i in range(20)], chunk_delay=0.005))
    seen: list[Frame] = []
    async with stack.client.stream(
        "POST", CHAT, json=body(stream=True, on_disconnect="continue")
    ) as response:
        turn_id = response.headers["x-bernard-turn-id"]
        async for frame in frames(response):
            seen.append(frame)
            if len(seen) >= chunk:
                break
    while not seen[-1].done:
        headers = {"Last-Event-ID": seen[-1].id}
        url = f"/v1/turns/{turn_id}/events"
        async with stack.client.stream("GET", url, headers=headers) as response:
            taken = 0
            async for frame in frames(response):
                seen.append(frame)
                taken += 1
                if taken >= chunk:
                    break
    assert wire(seen) == wire(await stack.replay(turn_id))


async def test_background_turn_answers_202_then_runs_with_nobody_attached(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.text(["in", " the", " background"], chunk_delay=0.01))
    response = await stack.client.post(CHAT, json=body(background=True, stream=True))
    assert response.status_code == 202
    turn = response.json()
    assert turn["object"] == "bernard.turn"
    assert turn["status"] == "queued"
    done = await wait_status(stack, turn["id"], {"completed"})
    assert done["result"]["choices"][0]["message"]["content"] == "in the background"
    assert done["started_at"] <= done["finished_at"]
    events = await stack.replay(turn["id"])
    assert "".join(f.content for f in events) == "in the background"
    assert events[-1].done


async def test_cancelling_a_background_turn_closes_the_upstream(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.slow(interval=0.01))
    turn = (await stack.client.post(CHAT, json=body(background=True))).json()
    await upstream.wait_requests(1)
    first = await stack.client.post(f"/v1/turns/{turn['id']}/cancel")
    assert first.status_code == 200
    assert first.json()["status"] == "cancelled", "the answer is the turn after the cancel"
    assert first.json()["error"]["code"] == "turn_cancelled"
    exchange = await upstream.wait_disconnect(timeout_s=5)
    assert exchange.ended
    done = await wait_status(stack, turn["id"], {"cancelled"})
    again = await stack.client.post(f"/v1/turns/{turn['id']}/cancel")
    assert again.status_code == 200 and again.json()["status"] == "cancelled"
    assert done["status"] == "cancelled"
    events = await stack.replay(turn["id"])
    assert events[-2].json["error"]["code"] == "turn_cancelled" and events[-1].done


async def test_cancel_of_a_finished_turn_changes_nothing(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    turn_id = await finished_turn(stack, upstream)
    response = await stack.client.post(f"/v1/turns/{turn_id}/cancel")
    assert response.json()["status"] == "completed"
    assert not await stack.redis.exists(keys.cancel(turn_id))


async def test_a_turn_cancelled_before_any_worker_took_it_never_calls_the_model(
    upstream: ScriptedUpstream,
) -> None:
    settings = make_settings(upstream)
    async with run_stack(settings, worker=False) as stack:
        turn = (await stack.client.post(CHAT, json=body(background=True))).json()
        cancelled = await stack.client.post(f"/v1/turns/{turn['id']}/cancel")
        assert cancelled.json()["status"] == "cancelled", "no worker needed to cancel it"
        async with run_worker(settings):
            done = await wait_status(stack, turn["id"], {"cancelled", "completed"})
    assert done["status"] == "cancelled"
    assert upstream.requests == [] and upstream.router_requests == []


async def test_a_client_returning_within_the_grace_keeps_the_turn_alive(
    upstream: ScriptedUpstream,
) -> None:
    gate = upstream.script(Reply.text(["one", " two"], block_after_first=True))
    async with run_stack(make_settings(upstream, disconnect_grace_s=0.5)) as stack:
        async with stack.client.stream("POST", CHAT, json=body(stream=True)) as response:
            turn_id = response.headers["x-bernard-turn-id"]
            stream = frames(response)
            last = await anext(stream)
            await gate.wait_blocked()
        url = f"/v1/turns/{turn_id}/events"
        async with stack.client.stream("GET", url, headers={"Last-Event-ID": last.id}) as back:
            # The turn is still waiting on the model when the first client's grace runs
            # out: only the returning client's attachment can keep it alive.
            await asyncio.sleep(1.0)
            assert not any(e.ended for e in upstream.exchanges), "the turn was cancelled"
            gate.release()
            rest = [frame async for frame in frames(back)]
        turn = (await stack.client.get(f"/v1/turns/{turn_id}")).json()
    assert "".join(f.content for f in rest) == "one two"
    assert turn["status"] == "completed"


async def test_a_client_that_never_returns_is_cancelled_after_the_grace(
    upstream: ScriptedUpstream,
) -> None:
    upstream.script(Reply.slow(interval=0.01))
    async with run_stack(make_settings(upstream, disconnect_grace_s=0.3)) as stack:
        async with stack.client.stream("POST", CHAT, json=body(stream=True)) as response:
            turn_id = response.headers["x-bernard-turn-id"]
            await anext(frames(response))
        running = (await stack.client.get(f"/v1/turns/{turn_id}")).json()
        await upstream.wait_disconnect(timeout_s=5)
        done = await wait_status(stack, turn_id, {"cancelled"})
    assert running["status"] in {"queued", "running"}
    assert done["status"] == "cancelled"


async def test_after_retention_events_answer_with_a_compacted_replay(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    turn_id = await finished_turn(stack, upstream)
    live = await stack.replay(turn_id)
    await stack.redis.delete(keys.events(turn_id))
    replayed = await stack.replay(turn_id)
    assert replayed[-1].done
    assert all(f.bernard == {"type": "replay", "compacted": True} for f in replayed[:-1])
    assert "".join(f.content for f in replayed) == "".join(f"t{i} " for i in range(12))
    finish, usage = replayed[-3].json, replayed[-2].json
    assert finish["choices"][0]["finish_reason"] == "stop"
    assert usage["usage"] == live[-2].json["usage"], "the same ending as the live stream"


async def test_a_redelivered_job_does_not_run_its_turn_again(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    turn_id = await finished_turn(stack, upstream)
    requests_before = len(upstream.requests)
    await stack.redis.delete(f"arq:result:{turn_id}", f"arq:job:{turn_id}")
    from arq.connections import ArqRedis

    arq = ArqRedis.from_url(stack.settings.redis_url)
    job = await arq.enqueue_job(
        "run_turn", turn_id, _job_id=f"{turn_id}-again", _queue_name=stack.settings.queue_name
    )
    await arq.lpush(keys.wake(stack.settings.queue_name), b"1")
    assert job is not None
    async with asyncio.timeout(5):
        while True:
            if await arq.zscore(stack.settings.queue_name, f"{turn_id}-again") is None:
                break
            await asyncio.sleep(0.02)
    await arq.aclose()
    assert len(upstream.requests) == requests_before
    types = await stored_types(stack, turn_id)
    assert types[-1] == "done" and types.count("done") == 1, "the job ran nothing again"


@contextlib.asynccontextmanager
async def streaming_background_turn(
    upstream: ScriptedUpstream, **settings: Any
) -> AsyncIterator[tuple[Stack, str]]:
    """A stack and a background turn whose slow upstream call is under way; leases are
    renewed every 0.2 s unless `settings` say otherwise."""
    upstream.script(Reply.slow(interval=0.01))
    async with run_stack(make_settings(upstream, **{"lease_renew_s": 0.2, **settings})) as stack:
        turn = (await stack.client.post(CHAT, json=body(background=True))).json()
        await upstream.wait_requests(1)
        yield stack, turn["id"]


async def test_a_turn_whose_record_vanished_stops_spending_tokens(
    upstream: ScriptedUpstream,
) -> None:
    """A Redis restart without persistence loses the record: the worker must stop too."""
    async with streaming_background_turn(upstream) as (stack, turn_id):
        await stack.redis.delete(keys.turn(turn_id))
        exchange = await upstream.wait_disconnect(timeout_s=5)
        assert exchange.ended
        async with asyncio.timeout(5):
            while True:
                if not await stack.redis.exists(keys.events(turn_id)):
                    break
                await asyncio.sleep(0.05)


async def test_a_saturated_worker_loop_is_not_mistaken_for_a_dead_worker(
    upstream: ScriptedUpstream,
) -> None:
    """Leases are renewed from their own thread: a busy loop keeps its turns."""
    async with streaming_background_turn(upstream, lease_ttl_s=1.0) as (stack, turn_id):
        # Another process's reaper looks while this loop (API and worker) is held for over
        # twice the lease TTL, as a thousand streaming turns on two cores held it.
        reaper = threading.Thread(target=asyncio.run, args=(_reap_after(stack.settings, 1.8),))
        reaper.start()
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            pass
        reaper.join()
        status = (await stack.client.get(f"/v1/turns/{turn_id}")).json()["status"]
        await stack.client.post(f"/v1/turns/{turn_id}/cancel")
        await wait_status(stack, turn_id, {"cancelled"})
    assert status == "running"


async def test_a_wedged_worker_loop_loses_its_turns_as_a_dead_worker_does(
    upstream: ScriptedUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop that stops beating for `STALL_LIMIT_S` stops its liveness being renewed: a
    reaper elsewhere ends its turns `worker_lost`, and the worker, once it wakes, writes
    nothing after that ending."""
    monkeypatch.setattr(worker.liveness, "STALL_LIMIT_S", 0.3)
    async with streaming_background_turn(upstream, lease_ttl_s=1.0) as (stack, turn_id):
        reaper = threading.Thread(target=asyncio.run, args=(_reap_after(stack.settings, 1.8),))
        reaper.start()
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:  # wedged: the loop never yields
            pass
        reaper.join()
        await wait_status(stack, turn_id, {"failed"})
        exchange = await upstream.wait_disconnect(timeout_s=5)
        assert exchange.ended
        error = (await stack.client.get(f"/v1/turns/{turn_id}")).json()["error"]
        types = await stored_types(stack, turn_id)
    assert error["code"] == "worker_lost"
    assert types[-1] == "done" and types.count("done") == 1, "nothing after the end"


@pytest.mark.parametrize("written", ["cancels", "cancel key"])
async def test_a_cancel_whose_message_its_worker_missed_reaches_it_at_the_next_renewal(
    upstream: ScriptedUpstream, written: str
) -> None:
    """The published message is the fast path; a worker that missed it (its subscription
    reconnecting) finds the cancel at its next liveness renewal, within
    `BERNARD_LEASE_RENEW_S` (0.2 s here), as a lease renewal used to find it: among its
    turns' in `keys.CANCELS` (queue role), or by the turn's cancel key (data role: all an
    API of another cell reaches)."""
    async with streaming_background_turn(upstream) as (stack, turn_id):
        # Of what `request_cancel` writes (shared/cancel.py), one and no message.
        if written == "cancels":
            await stack.redis.zadd(keys.CANCELS, {turn_id: time.time() + 60})
        else:
            await stack.redis.set(keys.cancel(turn_id), b"1", ex=60)
        asked_at = time.monotonic()
        exchange = await upstream.wait_disconnect(timeout_s=5)
        stopped_after = time.monotonic() - asked_at
        await wait_status(stack, turn_id, {"cancelled"})
    assert exchange.ended
    assert stopped_after < 1.0, stopped_after  # a renewal period and the upstream's close


async def _reap_after(settings: Settings, delay_s: float) -> None:
    await asyncio.sleep(delay_s)
    redis = connect(settings.redis_url)
    try:
        store = TurnStore(redis, retention_s=60, stream_maxlen=100)
        await store.reap_lapsed()
    finally:
        await redis.aclose()


async def test_a_turn_ended_elsewhere_stops_running_on_its_worker(
    upstream: ScriptedUpstream,
) -> None:
    """A reaper that took a stalled worker for dead ended the turn: the worker must stop."""
    async with streaming_background_turn(upstream) as (stack, turn_id):
        store = TurnStore(stack.redis, retention_s=60, stream_maxlen=1000)
        ended = await store.end(turn_id, "local", Cause.OVER, "declared lost")
        assert ended is Finished.ENDED
        exchange = await upstream.wait_disconnect(timeout_s=5)
        assert exchange.ended
        await asyncio.sleep(0.5)
        events = await stack.replay(turn_id)
        types = await stored_types(stack, turn_id)
    assert types[-1] == "done" and types.count("done") == 1, "nothing after the end"
    assert events[-2].json["error"]["code"] == "worker_lost"


# -- one ending, however it is read -----------------------------------------------------------


def terminal(collected: list[Frame]) -> dict[str, Any]:
    """What a stream says about how its turn ended: the error, or the finish reason."""
    for frame in reversed(collected):
        if frame.done:
            continue
        if "error" in frame.json:
            return {"error": {k: v for k, v in frame.json["error"].items() if k != "param"}}
        choices = frame.json.get("choices") or []
        if choices and choices[0].get("finish_reason"):
            return {"finish_reason": choices[0]["finish_reason"]}
    raise AssertionError("the stream has no ending")


ENDINGS = {
    "completed": (Reply.text(["fine"]), None),
    "cancelled": (Reply.slow(), "cancel"),
    "upstream_error": (Reply.error(500, "boom"), None),
    "worker_lost": (Reply.slow(), "reap"),
}


@pytest.mark.parametrize("ending", list(ENDINGS))
async def test_a_turn_ends_the_same_live_replayed_compacted_and_polled(
    upstream: ScriptedUpstream, ending: str
) -> None:
    reply, action = ENDINGS[ending]
    upstream.script(reply)
    async with run_stack(make_settings(upstream)) as stack:
        async with stack.client.stream(
            "POST", CHAT, json=body(stream=True, on_disconnect="continue")
        ) as response:
            turn_id = response.headers["x-bernard-turn-id"]
            stream = frames(response)
            live = [await anext(stream)]
            if action is not None:
                await upstream.wait_requests(1)
            if action == "cancel":
                await stack.client.post(f"/v1/turns/{turn_id}/cancel")
            elif action == "reap":  # what a reaper does to a turn whose worker died
                store = TurnStore(stack.redis, retention_s=60, stream_maxlen=100)
                await store.end(turn_id, "local", Cause.OVER)
            live += [frame async for frame in stream]
        replayed = await stack.replay(turn_id)
        polled = (await stack.client.get(f"/v1/turns/{turn_id}")).json()
        await stack.redis.delete(keys.events(turn_id))
        compacted = await stack.replay(turn_id)

    seen = terminal(live)
    assert terminal(replayed) == terminal(compacted) == seen
    if ending == "completed":
        assert seen == {"finish_reason": "stop"} and polled["error"] is None
    else:
        assert seen["error"]["code"] == ("turn_cancelled" if ending == "cancelled" else ending)
        assert polled["error"] == seen["error"]
    assert polled["status"] == {"completed": "completed", "cancelled": "cancelled"}.get(
        ending, "failed"
    )


async def test_a_non_stream_answer_ends_with_the_same_error_and_its_status(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.error(500, "boom"))
    response = await stack.client.post(CHAT, json=body())
    polled = (await stack.client.get(f"/v1/turns/{response.headers['x-bernard-turn-id']}")).json()
    assert response.status_code == 502
    assert response.headers["retry-after"] == "1", "an upstream failure may pass: retry later"
    error = response.json()["error"]
    assert {k: v for k, v in error.items() if k != "param"} == polled["error"]
    assert error["code"] == "upstream_error"


async def test_a_non_stream_answer_whose_stream_cannot_be_read_is_503_stream_unreadable(
    upstream: ScriptedUpstream,
) -> None:
    owner = f"user-{time.time_ns()}"
    settings = make_settings(upstream, api_keys=f"key-{owner}:{owner}")
    headers = {"Authorization": f"Bearer key-{owner}"}
    async with run_stack(settings, worker=False) as stack:
        waiting = asyncio.create_task(stack.client.post(CHAT, json=body(), headers=headers))
        async with asyncio.timeout(10):
            while True:
                created = await stack.redis.zrange(keys.turns(owner), 0, -1)
                if created:
                    break
                await asyncio.sleep(0.02)
        turn_id = created[0].decode()
        # Redis now refuses to read it as a stream, as a relay's reader would be refused.
        await stack.redis.delete(keys.events(turn_id))
        await stack.redis.set(keys.events(turn_id), "not a stream", ex=60)
        try:
            async with asyncio.timeout(20):
                response = await waiting
        finally:
            await stack.redis.delete(keys.events(turn_id), keys.turn(turn_id))
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "stream_unreadable"
    assert response.headers["x-bernard-turn-id"] == turn_id


async def test_cancel_answers_the_turn_as_it_stands_when_its_stream_cannot_be_read(
    upstream: ScriptedUpstream,
) -> None:
    async with run_stack(make_settings(upstream), worker=False) as stack:
        turn = (await stack.client.post(CHAT, json=body(background=True))).json()
        # As a worker's claim leaves it (no worker here will end it), its stream unreadable.
        await stack.redis.hset(keys.turn(turn["id"]), "status", "running")
        await stack.redis.delete(keys.events(turn["id"]))
        await stack.redis.set(keys.events(turn["id"]), "not a stream", ex=60)
        try:
            async with asyncio.timeout(20):
                cancelled = await stack.client.post(f"/v1/turns/{turn['id']}/cancel")
        finally:
            await stack.redis.delete(keys.events(turn["id"]), keys.turn(turn["id"]))
    assert (cancelled.status_code, cancelled.json()["status"]) == (200, "running")
