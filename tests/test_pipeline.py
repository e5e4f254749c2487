"""The pipeline end to end: HTTP → Redis turn → arq worker → Redis Stream → SSE.

Every test runs the real app on a loopback port, a real arq worker and the real Redis;
the worker's `ChatOpenAI` talks to the scripted upstream over real HTTP.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import redis.asyncio as redis_asyncio

import worker.tools.catalog
from api.cursors import parse_cursor
from api.hub import StreamHub
from api.session import StreamSession
from launcher.redis_server import free_port
from shared import keys
from shared.events import Delta, Done, MessageStored, encode
from shared.streams import STREAM_FIELD
from tests.support.chat import body
from tests.support.session_redis import session_redis_url
from tests.support.sse import collect, frames, text_of
from tests.support.stack import Stack, make_settings, run_stack, wait_status
from tests.support.upstream import Reply, ScriptedUpstream

CHAT = "/v1/chat/completions"


async def test_stream_frames_follow_the_openai_chunk_sequence(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.text(["Hel", "lo", " world"], usage=(7, 3)))
    got = await collect(
        stack.client, "POST", CHAT, json=body(stream=True, stream_options={"include_usage": True})
    )

    chunks = [f.json for f in got[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert text_of(got) == "Hello world"
    finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert [c["choices"][0]["finish_reason"] for c in finish] == ["stop"]
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    assert got[-1].done
    assert {(c["id"], c["created"], c["model"]) for c in chunks} == {
        (chunks[0]["id"], chunks[0]["created"], "bernard-v1")
    }
    assert chunks[0]["id"].startswith("chatcmpl-")
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


async def test_sse_ids_increase_and_no_event_lines_are_sent(stack: Stack) -> None:
    async with stack.client.stream("POST", CHAT, json=body(stream=True)) as response:
        raw = (await response.aread()).decode()
    lines = [line for line in raw.splitlines() if line]
    assert not [line for line in lines if line.startswith("event:")]
    ids = [line.removeprefix("id: ") for line in lines if line.startswith("id:")]
    # As the server reads them back (`done:<k>` names the stream's last entry).
    cursors = [parse_cursor(i) for i in ids]
    keys_in_order = [(c.key, -1 if c.frame is None else c.frame) for c in cursors if c]
    assert len(keys_in_order) == len(ids)
    assert keys_in_order == sorted(keys_in_order)
    assert len(set(ids)) == len(ids)


async def test_non_stream_answers_one_chat_completion(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.text("The answer is 42.", usage=(5, 6)))
    response = await stack.client.post(CHAT, json=body())
    assert response.status_code == 200
    data = response.json()
    assert data["object"] == "chat.completion"
    assert data["choices"][0]["message"] == {
        "role": "assistant",
        "content": "The answer is 42.",
        "refusal": None,
    }
    assert data["choices"][0]["finish_reason"] == "stop"
    assert data["usage"]["total_tokens"] == 11
    assert response.headers["x-bernard-turn-id"] == data["bernard"]["turn_id"]


async def test_first_frame_reaches_the_client_while_the_upstream_is_still_blocked(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    gate = upstream.script(Reply.text(["first", " second"], block_after_first=True))
    async with stack.client.stream("POST", CHAT, json=body(stream=True)) as response:
        stream = frames(response)
        content = ""
        while not content:
            content = (await anext(stream)).content
        assert content == "first"
        assert gate.blocked, "the upstream must still be holding its second token"
        gate.release()
        rest = [frame async for frame in stream]
    assert text_of(rest) == " second"
    assert rest[-1].done


async def test_client_disconnect_closes_the_upstream_and_cancels_the_turn(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.slow(interval=0.01))
    async with stack.client.stream("POST", CHAT, json=body(stream=True)) as response:
        turn_id = response.headers["x-bernard-turn-id"]
        stream = frames(response)
        seen = 0
        while seen < 3:
            seen += bool((await anext(stream)).content)
    exchange = await upstream.wait_disconnect(timeout_s=5)
    assert exchange.ended
    assert (await wait_status(stack, turn_id, {"cancelled"}))["status"] == "cancelled"


async def test_upstream_error_before_any_token_ends_the_stream_with_an_error_frame(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.error(500, "upstream exploded"))
    got = await collect(stack.client, "POST", CHAT, json=body(stream=True))
    assert got[-1].done
    error = got[-2].json["error"]
    assert error["code"] == "upstream_error"
    assert "500" in error["message"]
    assert "choices" not in got[-2].json


async def test_upstream_error_without_stream_is_a_502_with_the_error_envelope(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.error(500, "upstream exploded"))
    response = await stack.client.post(CHAT, json=body())
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_error"


async def test_silence_is_filled_with_keepalive_chunks(upstream: ScriptedUpstream) -> None:
    gate = upstream.script(Reply.text(["a", "b"], block_after_first=True))
    async with run_stack(make_settings(upstream, keepalive_s=0.2)) as stack:
        async with stack.client.stream("POST", CHAT, json=body(stream=True)) as response:
            stream = frames(response)
            while True:
                frame = await anext(stream)
                if frame.bernard and frame.bernard["type"] == "keepalive":
                    break
            assert frame.json["choices"] == []
            gate.release()
            rest = [f async for f in stream]
        assert rest[-1].done


async def test_a_finished_turns_stream_and_record_expire(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    response = await stack.client.post(CHAT, json=body())
    turn_id = response.headers["x-bernard-turn-id"]
    ttl = await stack.redis.ttl(keys.events(turn_id))
    assert 0 < ttl <= stack.settings.turn_retention_s
    assert 0 < await stack.redis.ttl(keys.turn(turn_id)) <= stack.settings.turn_retention_s


async def test_a_non_stream_read_keeps_only_the_events_asked_for(
    redis: redis_asyncio.Redis,
) -> None:
    """A long turn's tokens are not held in memory until its `done` (api/session.py)."""
    turn_id = uuid.uuid4().hex
    stored = MessageStored(row={"id": "m1", "role": "assistant", "content": "hi"})
    for event in (Delta(text="h"), stored, Delta(text="i"), Done(status="completed")):
        await redis.xadd(keys.events(turn_id), {STREAM_FIELD: encode(event)})
    hub = StreamHub(redis, block_ms=1000, lanes=1)
    await hub.start()
    session = StreamSession(hub, turn_id, make_settings().keepalive_s)
    try:
        events, done = await session.read_to_done(keep=(MessageStored,))
    finally:
        await hub.stop()
        await redis.delete(keys.events(turn_id))
    assert events == [stored]
    assert done.status == "completed"


async def test_models_are_listed_under_v1_and_the_api_v1_alias(stack: Stack) -> None:
    for prefix in ("/v1", "/api/v1"):
        data = (await stack.client.get(f"{prefix}/models")).json()
        assert [m["id"] for m in data["data"]] == ["bernard-v1"]
    alias = await stack.client.post("/api/v1/chat/completions", json=body())
    assert alias.status_code == 200


PREFLIGHT = {
    "Origin": "http://localhost:3000",
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization,content-type,x-stainless-os",
}


async def test_browser_preflight_from_an_allowed_origin_allows_the_sdk_headers(
    upstream: ScriptedUpstream,
) -> None:
    settings = make_settings(upstream, cors_origins="http://localhost:3000, https://chat.lan")
    async with run_stack(settings, worker=False) as stack:
        response = await stack.client.options(CHAT, headers=PREFLIGHT)
        other = await stack.client.options(
            CHAT, headers={**PREFLIGHT, "Origin": "https://evil.example"}
        )
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == "http://localhost:3000"
    allowed = response.headers["access-control-allow-headers"].lower()
    assert "x-stainless-os" in allowed and "authorization" in allowed
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers


async def test_no_other_origin_may_call_the_api_from_a_browser_unless_configured(
    stack: Stack,
) -> None:
    """The playground is the API's own origin and needs no CORS; by default no other web
    page may read an answer (a page on the user's machine calling a local Bernard, say)."""
    preflight = await stack.client.options(CHAT, headers=PREFLIGHT)
    assert preflight.status_code == 400
    assert "access-control-allow-origin" not in preflight.headers
    simple = await stack.client.get("/v1/models", headers={"Origin": "https://evil.example"})
    assert simple.status_code == 200
    assert "access-control-allow-origin" not in simple.headers


async def test_readyz_reports_a_live_worker_and_healthz_always_answers(stack: Stack) -> None:
    assert (await stack.client.get("/healthz")).json() == {"status": "ok"}
    for _ in range(50):
        ready = await stack.client.get("/readyz")
        if ready.status_code == 200:
            break
        await asyncio.sleep(0.1)
    assert ready.status_code == 200 and ready.json()["workers"] >= 1


async def test_readyz_is_unavailable_without_workers(upstream: ScriptedUpstream) -> None:
    async with run_stack(make_settings(upstream), worker=False) as stack:
        await stack.redis.delete(keys.WORKERS)
        assert (await stack.client.get("/readyz")).status_code == 503


async def test_a_turn_runs_with_the_queue_role_on_a_redis_apart(upstream: ScriptedUpstream) -> None:
    # Two databases stand for two servers: a job enqueued on the data side is never run.
    server = session_redis_url().rsplit("/", 1)[0]
    settings = make_settings(upstream, redis_url=f"{server}/0", queue_redis_url=f"{server}/1")
    upstream.script(Reply.text("Apart."))
    async with run_stack(settings) as stack:
        response = await stack.chat()
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "Apart."


async def test_readyz_is_unavailable_while_the_data_redis_apart_does_not_answer(
    redis: redis_asyncio.Redis,
) -> None:
    # The queue role answers and a worker reported in; the data role (turns, streams) does not.
    settings = make_settings(queue_redis_url=session_redis_url(), redis_url="redis://127.0.0.1:1/0")
    worker_id = f"test-worker-{uuid.uuid4().hex}"
    await redis.zadd(keys.WORKERS, {worker_id: time.time()})
    try:
        async with run_stack(settings, worker=False) as stack:
            ready = await stack.client.get("/readyz")
    finally:
        await redis.zrem(keys.WORKERS, worker_id)
    assert (ready.status_code, ready.json()["redis"]) == (503, False)


async def test_redis_unreachable_is_a_503_with_a_clear_message() -> None:
    settings = make_settings(redis_url="redis://127.0.0.1:1/0")
    async with run_stack(settings, worker=False) as stack:
        response = await stack.client.post(CHAT, json=body())
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "redis_unavailable"
    assert response.headers["retry-after"] == "1"


async def test_a_redis_cluster_that_cannot_be_reached_is_a_503_too() -> None:
    # The queue role answers; the data role, a Cluster, has no node that does.
    settings = make_settings(
        queue_redis_url=session_redis_url(), redis_url=f"redis+cluster://127.0.0.1:{free_port()}"
    )
    async with run_stack(settings, worker=False) as stack:
        response = await stack.client.post(CHAT, json=body())
        ready = await stack.client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "redis_unavailable"
    assert ready.status_code == 503 and ready.json()["redis"] is False


@pytest.mark.parametrize("accept", ["application/json", "*/*"])
async def test_the_format_follows_stream_not_accept(stack: Stack, accept: str) -> None:
    async with stack.client.stream(
        "POST", CHAT, json=body(stream=True), headers={"Accept": accept}
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        await response.aread()


async def test_turn_record_tracks_queued_running_completed(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    gate = upstream.script(Reply.text(["a", "b"], block_after_first=True))
    async with stack.client.stream("POST", CHAT, json=body(stream=True)) as response:
        turn_id = response.headers["x-bernard-turn-id"]
        await gate.wait_blocked()
        running = (await stack.client.get(f"/v1/turns/{turn_id}")).json()
        gate.release()
        await response.aread()
    assert running["status"] == "running" and running["started_at"]
    assert (await wait_status(stack, turn_id, {"completed"}))["status"] == "completed"


async def test_a_continue_turn_completes_after_its_client_left(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    """The turn runs on the worker, not in the request: it outlives its client."""
    gate = upstream.script(Reply.text(["a", "b"], block_after_first=True))
    async with stack.client.stream(
        "POST", CHAT, json=body(stream=True, on_disconnect="continue")
    ) as streamed:
        turn_id = streamed.headers["x-bernard-turn-id"]
        await gate.wait_blocked()
    gate.release()
    ended = await wait_status(stack, turn_id, {"completed", "cancelled"})
    assert ended["status"] == "completed"


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text (0 when absent)."""
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(f"{name}{{{wanted}}} ") or line.startswith(f"{name} "):
            return float(line.split()[-1])
    return 0.0


async def test_metrics_count_turns_frames_and_how_they_ended(stack: Stack) -> None:
    await collect(stack.client, "POST", CHAT, json=body(stream=True))
    text = (await stack.client.get("/metrics")).text
    assert metric(text, "bernard_turns_created_total", kind="chat", mode="stream") >= 1
    assert metric(text, "bernard_frames_relayed_total") >= 3
    assert metric(text, "bernard_streams_open") == 0


# uvicorn takes the client's address from X-Forwarded-For when the peer is 127.0.0.1 (its
# proxy headers, on by default): a scrape through a proxy on this host, from elsewhere.
FROM_ELSEWHERE = {"X-Forwarded-For": "198.51.100.7"}


async def test_metrics_answer_on_loopback_and_elsewhere_not_without_a_metrics_key(
    upstream: ScriptedUpstream,
) -> None:
    """With BERNARD_API_KEYS unset as well: the API's keys are not the metrics key."""
    async with run_stack(make_settings(upstream), worker=False) as stack:
        local = await stack.client.get("/metrics")
        remote = await stack.client.get("/metrics", headers=FROM_ELSEWHERE)
    assert local.status_code == 200 and "bernard_streams_open" in local.text
    assert remote.status_code == 403
    assert remote.json()["error"]["code"] == "permission_denied"
    assert "BERNARD_METRICS_KEY" in remote.json()["error"]["message"]


@pytest.mark.parametrize(
    ("authorization", "status"),
    [
        (None, 401),
        ("Bearer wrong-metrics-key", 401),
        ("Bearer key-alice", 401),  # a user's key is not the operator's
        ("Basic scrape-key-42", 401),
        ("Bearer scrape-key-42", 200),
        ("bearer scrape-key-42", 200),
    ],
)
async def test_metrics_from_elsewhere_need_the_metrics_key(
    upstream: ScriptedUpstream, authorization: str | None, status: int
) -> None:
    settings = make_settings(upstream, metrics_key="scrape-key-42", api_keys="key-alice:alice")
    headers = {**FROM_ELSEWHERE, **({"Authorization": authorization} if authorization else {})}
    async with run_stack(settings, worker=False) as stack:
        remote = await stack.client.get("/metrics", headers=headers)
        local = await stack.client.get("/metrics")
    assert remote.status_code == status, remote.text
    if status == 401:
        assert remote.json()["error"]["code"] == "invalid_api_key"
    assert local.status_code == 200


async def test_each_turn_ending_is_counted_once_however_it_is_read(
    stack: Stack, upstream: ScriptedUpstream
) -> None:
    async def endings() -> tuple[float, float]:
        text = (await stack.client.get("/metrics")).text
        return (
            metric(text, "bernard_turns_ended_total", status="completed", code=""),
            metric(text, "bernard_turns_ended_total", status="cancelled", code="turn_cancelled"),
        )

    before = await endings()
    streamed = await stack.client.post(CHAT, json=body(stream=True))
    turn_id = streamed.headers["x-bernard-turn-id"]
    for _ in range(2):  # relayed twice more
        await collect(stack.client, "GET", f"/v1/turns/{turn_id}/events")
    assert (await stack.client.post(CHAT, json=body())).status_code == 200  # not streamed
    upstream.script(Reply.slow())
    background = (await stack.client.post(CHAT, json=body(background=True))).json()
    await upstream.wait_requests(3)
    await stack.client.post(f"/v1/turns/{background['id']}/cancel")
    after = await endings()
    assert (after[0] - before[0], after[1] - before[1]) == (2, 1)


async def test_the_tools_the_workers_offer_are_listed_with_their_schemas(
    upstream: ScriptedUpstream,
) -> None:
    settings = make_settings(
        upstream, confirm_tools="cancel_timer", auto_approve_tools="delete_note"
    )
    async with run_stack(settings) as stack:
        listed = (await stack.client.get("/v1/tools")).json()
    tools = {tool["name"]: tool for tool in listed["data"]}
    assert listed["object"] == "list"
    assert set(tools) >= {"calculator", "get_time", "save_note", "list_notes", "set_timer"}
    assert tools["calculator"]["parameters"]["properties"] == {
        "expression": {"title": "Expression", "type": "string"}
    }
    waits = {name: tool["requires_confirmation"] for name, tool in tools.items()}
    assert waits["save_note"] and not waits["list_notes"] and not waits["calculator"]
    assert waits["cancel_timer"], "BERNARD_CONFIRM_TOOLS makes a tool wait"
    assert not waits["delete_note"], "BERNARD_AUTO_APPROVE_TOOLS makes it run at once"


async def test_the_tools_and_what_the_worker_runs_stay_published_though_redis_lost_them(
    upstream: ScriptedUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The entry expires a day after it was written: a worker that runs longer than that
    # must write it again, as it must after Redis lost it.
    monkeypatch.setattr(worker.tools.catalog, "REPUBLISH_S", 0.0)
    async with run_stack(make_settings(upstream, lease_renew_s=0.1)) as stack:
        await stack.redis.delete(keys.TOOLS, keys.DEPLOYMENT)
        async with asyncio.timeout(10):
            while True:
                if await stack.redis.exists(keys.TOOLS, keys.DEPLOYMENT) == 2:
                    break
                await asyncio.sleep(0.05)
        listed = (await stack.client.get("/v1/tools")).json()
        ttls = [await stack.redis.ttl(key) for key in (keys.TOOLS, keys.DEPLOYMENT)]
    assert "calculator" in {tool["name"] for tool in listed["data"]}
    assert all(ttl > 0 for ttl in ttls)
