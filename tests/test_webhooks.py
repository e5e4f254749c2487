"""Signed webhooks end to end (shared/webhooks.py, worker/webhooks.py): a background chat
turn ends, and a receiver of our own on a loopback port gets the POST over real HTTP, which
the official `openai` SDK's `client.webhooks.unwrap` verifies with the deployment's secret.
Failures are retried from the queue (across a worker's restart) under one `webhook-id`, a
receiver that hangs slows no turn, each attempt shows in its owner's log (which reads the
same for every attempt that got no HTTP answer), and a request's own target is refused on
an origin not allowed."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from launcher.redis_server import free_port
from shared import keys
from shared.connection import connect
from shared.settings import Settings
from shared.webhooks import delivery_job_id
from tests.support.processes import Process, ProcessGroup, private_redis, wait_for
from tests.support.serving import serve
from tests.support.stack import Stack, make_settings, run_api, run_stack, run_worker, wait_status
from tests.support.upstream import Reply, ScriptedUpstream
from worker.webhooks import pinned

CHAT = "/v1/chat/completions"
# base64 of b"bernard webhook test key".
SECRET = "whsec_YmVybmFyZCB3ZWJob29rIHRlc3Qga2V5"
HANG = -1


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float


@dataclass
class Receiver:
    """A webhook receiver on 127.0.0.1: answers each POST with the next of `answers` (a
    status, or `HANG`: no answer until the test ends), then 200; keeps what it got."""

    answers: list[int] = field(default_factory=list)
    got: list[Received] = field(default_factory=list)
    hanging: int = 0
    port: int = 0
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _release: asyncio.Event = field(default_factory=asyncio.Event)

    def url(self, path: str = "/hook", host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    async def _hook(self, request: Request) -> Response:
        self.got.append(
            Received(request.url.path, dict(request.headers), await request.body(), time.time())
        )
        self._changed.set()
        answer = self.answers.pop(0) if self.answers else 200
        if answer == HANG:
            self.hanging += 1
            self._changed.set()
            await self._release.wait()
            answer = 200
        return Response(status_code=answer)

    async def wait(self, count: int, timeout_s: float = 10.0) -> list[Received]:
        async with asyncio.timeout(timeout_s):
            while len(self.got) < count:
                self._changed.clear()
                await self._changed.wait()
        return self.got

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Receiver]:
        app = Starlette(routes=[Route("/{path:path}", self._hook, methods=["POST"])])
        async with serve(app, lifespan="off") as port:
            self.port = port
            try:
                yield self
            finally:
                self._release.set()


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    async with Receiver().running() as running:
        yield running


def webhook_settings(upstream: ScriptedUpstream, receiver: Receiver, **overrides: Any) -> Settings:
    """Webhooks to `receiver`, quick retries, and a user of the test's own (the suite's
    tests share one Redis, so a user's log would hold earlier tests' attempts)."""
    values: dict[str, Any] = {
        # Two users: the first makes the turns, the second reads the logs of nobody else.
        "api_keys": ",".join(f"key-{uuid.uuid4().hex}:user-{uuid.uuid4().hex[:8]}" for _ in "ab"),
        "webhook_url": receiver.url(),
        "webhook_secret": SECRET,
        "webhook_origins": f"http://localhost:{receiver.port}",
        # The receivers are on loopback.
        "webhook_allow_private": True,
        "webhook_retry_delays": "0.3,0.3,0.3",
        "webhook_timeout_s": 2.0,
    }
    return make_settings(upstream, **{**values, **overrides})


def bearer(settings: Settings, user: int = 0) -> dict[str, str]:
    key = list(settings.api_key_users())[user]
    return {"authorization": f"Bearer {key}"}


@contextlib.asynccontextmanager
async def hooked_stack(settings: Settings) -> AsyncIterator[Stack]:
    async with run_stack(settings) as running:
        running.client.headers.update(bearer(settings))
        yield running


@pytest.fixture
async def hooked(upstream: ScriptedUpstream, receiver: Receiver) -> AsyncIterator[Stack]:
    async with hooked_stack(webhook_settings(upstream, receiver)) as running:
        yield running


def body(content: str = "hello", **extra: object) -> dict[str, object]:
    return {"model": "bernard-v1", "messages": [{"role": "user", "content": content}], **extra}


def unwrap(got: Received) -> Any:
    """The event, as the official SDK verifies and parses it."""
    return openai.OpenAI(api_key="unused").webhooks.unwrap(got.body, got.headers, secret=SECRET)


async def deliveries(stack: Stack) -> list[dict[str, Any]]:
    response = await stack.client.get("/v1/webhooks/deliveries")
    assert response.status_code == 200
    return response.json()["data"]


@dataclass
class Doomed:
    """A background turn blocked mid-answer on a worker about to be killed (`doomed`), with
    the API's client and the process group to start its successor in."""

    procs: ProcessGroup
    client: httpx.AsyncClient
    worker: Process
    turn: dict[str, Any]


@contextlib.asynccontextmanager
async def doomed_turn(settings: Settings, gate: Reply, logs: Path) -> AsyncIterator[Doomed]:
    """An API and one worker ("doomed-worker") on `settings`, and a background chat turn
    started there and held at `gate` (its upstream blocked after the first token)."""
    async with (
        ProcessGroup(logs) as procs,
        run_api(settings) as base_url,
        httpx.AsyncClient(base_url=base_url, headers=bearer(settings)) as client,
    ):
        doomed = await procs.worker(settings, name="doomed-worker")
        turn = (await client.post(CHAT, json=body(background=True))).json()
        await gate.wait_blocked()
        yield Doomed(procs, client, doomed, turn)


@pytest.mark.parametrize(
    ("reply", "extra", "kind"),
    [
        (Reply.text(["all", " done"]), {}, "response.completed"),
        (Reply.text(["one", " two", " three", " four"]), {"max_tokens": 2}, "response.incomplete"),
        (Reply.error(500, "upstream broke"), {}, "response.failed"),
    ],
)
async def test_a_background_turns_end_is_posted_signed_and_the_sdk_verifies_it(
    hooked: Stack,
    upstream: ScriptedUpstream,
    receiver: Receiver,
    reply: Reply,
    extra: dict[str, Any],
    kind: str,
) -> None:
    # A turn somebody waits on sends nothing: only a background one does.
    upstream.script(Reply.text("waited on"))
    waited = await hooked.client.post(CHAT, json=body())
    assert waited.status_code == 200
    upstream.script(reply)
    turn = (await hooked.client.post(CHAT, json=body(background=True, **extra))).json()

    (got,) = await receiver.wait(1)
    event = unwrap(got)
    assert event.type == kind
    assert event.id == f"evt_{turn['id']}"
    assert event.data.id == turn["id"]
    assert event.object == "event"
    assert got.path == "/hook"
    assert got.headers["webhook-id"] == f"evt_{turn['id']}"
    assert got.headers["content-type"] == "application/json"
    ended = await wait_status(hooked, turn["id"], {"completed", "failed"})
    assert abs(event.created_at - ended["finished_at"]) <= 1
    await asyncio.sleep(0.3)
    assert len(receiver.got) == 1, "one delivery per turn, none for the turn waited on"
    # Nothing of it is left on the queue to be sent again (`_hold`'s entry went with it).
    job_id = delivery_job_id(next(iter(hooked.settings.api_key_users().values())), turn["id"])
    assert await hooked.redis.zscore(hooked.settings.queue_name, job_id) is None
    assert not await hooked.redis.exists(f"arq:job:{job_id}")


async def test_a_cancelled_background_turn_is_posted_as_cancelled(
    hooked: Stack, upstream: ScriptedUpstream, receiver: Receiver
) -> None:
    upstream.script(Reply.slow(interval=0.01))
    turn = (await hooked.client.post(CHAT, json=body(background=True))).json()
    await upstream.wait_requests(1)
    await hooked.client.post(f"/v1/turns/{turn['id']}/cancel")
    (got,) = await receiver.wait(1)
    event = unwrap(got)
    assert (event.type, event.data.id) == ("response.cancelled", turn["id"])


async def test_failures_are_retried_under_one_webhook_id_and_logged(
    hooked: Stack, upstream: ScriptedUpstream, receiver: Receiver
) -> None:
    receiver.answers = [500, 500]
    upstream.script(Reply.text("retried"))
    turn = (await hooked.client.post(CHAT, json=body(background=True))).json()

    got = await receiver.wait(3)
    assert [g.headers["webhook-id"] for g in got] == [f"evt_{turn['id']}"] * 3
    assert len({g.body for g in got}) == 1, "the same event each time"
    assert all(unwrap(g).type == "response.completed" for g in got)
    # Each retry waits its delay (0.3 s) at least.
    assert got[1].at - got[0].at >= 0.3 and got[2].at - got[1].at >= 0.3
    await asyncio.sleep(0.2)
    log = await deliveries(hooked)
    assert [(a["attempt"], a["status_code"], a["outcome"]) for a in log] == [
        (3, 200, "delivered"),
        (2, 500, "retrying"),
        (1, 500, "retrying"),
    ]
    assert [a["error"] for a in log] == [None, "answered 500", "answered 500"]
    assert log[0]["next_attempt_at"] is None
    assert all(a["next_attempt_at"] > a["at"] for a in log[1:])
    assert {(a["event_id"], a["turn_id"], a["type"]) for a in log} == {
        (f"evt_{turn['id']}", turn["id"], "response.completed")
    }
    assert {a["url"] for a in log} == {f"http://127.0.0.1:{receiver.port}"}
    user = next(iter(hooked.settings.api_key_users().values()))
    assert 0 < await hooked.redis.ttl(keys.webhook_deliveries(user)) <= 7 * 86_400
    # Nobody else reads it.
    other = await hooked.client.get("/v1/webhooks/deliveries", headers=bearer(hooked.settings, 1))
    assert other.json() == {"object": "list", "data": []}


async def test_a_delivery_is_given_up_after_the_last_delay(
    upstream: ScriptedUpstream, receiver: Receiver
) -> None:
    receiver.answers = [503, 503, 503]
    settings = webhook_settings(upstream, receiver, webhook_retry_delays="0.1,0.1")
    async with hooked_stack(settings) as stack:
        upstream.script(Reply.text("nobody takes it"))
        await stack.client.post(CHAT, json=body(background=True))
        await receiver.wait(3)
        await asyncio.sleep(0.5)
        assert len(receiver.got) == 3
        log = await deliveries(stack)
    assert [(a["attempt"], a["outcome"]) for a in log] == [
        (3, "gave_up"),
        (2, "retrying"),
        (1, "retrying"),
    ]


async def test_a_worker_restart_between_attempts_still_delivers(
    upstream: ScriptedUpstream, receiver: Receiver
) -> None:
    receiver.answers = [500]
    settings = webhook_settings(upstream, receiver, webhook_retry_delays="1.5")
    async with (
        run_api(settings) as base_url,
        httpx.AsyncClient(base_url=base_url, headers=bearer(settings)) as client,
    ):
        async with run_worker(settings):
            upstream.script(Reply.text("before the restart"))
            turn = (await client.post(CHAT, json=body(background=True))).json()
            await receiver.wait(1)
            await asyncio.sleep(0.1)
            stopping = time.monotonic()
        # The worker stopped at once: no job of its own waited out the delay.
        assert time.monotonic() - stopping < 1.0
        # The worker that tried is gone; the retry waits on the queue for another.
        assert len(receiver.got) == 1
        async with run_worker(settings):
            got = await receiver.wait(2)
    assert [g.headers["webhook-id"] for g in got] == [f"evt_{turn['id']}"] * 2
    assert unwrap(got[1]).data.id == turn["id"]
    assert got[1].at - got[0].at >= 1.5


async def test_a_hanging_receiver_slows_no_turn(
    upstream: ScriptedUpstream, receiver: Receiver
) -> None:
    receiver.answers = [HANG]
    settings = webhook_settings(upstream, receiver, webhook_timeout_s=5.0)
    async with hooked_stack(settings) as stack:
        upstream.script(Reply.text("first"))
        first = (await stack.client.post(CHAT, json=body(background=True))).json()
        await receiver.wait(1)
        assert receiver.hanging == 1
        # While the first turn's delivery hangs, the next turns run and end at once, and
        # their ends are posted beside it.
        for text in ("second", "third"):
            upstream.script(Reply.text(text))
            started = time.monotonic()
            turn = (await stack.client.post(CHAT, json=body(background=True))).json()
            ended = await wait_status(stack, turn["id"], {"completed"})
            # Well inside the 5 s the receiver holds the first delivery (a loaded box's
            # turn takes a fraction of a second).
            assert time.monotonic() - started < 2.5, "its end waited on the receiver"
            assert ended["result"]["choices"][0]["message"]["content"] == text
        await receiver.wait(3)
        assert receiver.hanging == 1
        # The hung attempt is given up at its timeout and tried again.
        got = await receiver.wait(4, timeout_s=10)
        log = await deliveries(stack)
    assert got[3].headers["webhook-id"] == f"evt_{first['id']}"
    hung = next(a for a in log if a["turn_id"] == first["id"] and a["attempt"] == 1)
    assert (hung["status_code"], hung["error"]) == (None, "no HTTP answer within 5 s")


async def test_a_requests_own_target_only_on_an_allowed_origin(
    hooked: Stack, upstream: ScriptedUpstream, receiver: Receiver
) -> None:
    allowed = f"http://localhost:{receiver.port}"
    for url, origin in [
        ("https://evil.example/hook", "https://evil.example:443"),
        # The allowed host on another port, or the allowed port on another scheme.
        ("http://localhost:6379/", "http://localhost:6379"),
        (f"https://localhost:{receiver.port}/mine", f"https://localhost:{receiver.port}"),
        ("http://localhost/mine", "http://localhost:80"),
    ]:
        refused = await hooked.client.post(CHAT, json=body(background=True, webhook_url=url))
        assert refused.status_code == 400, url
        assert refused.json()["error"] == {
            "message": f"webhook_url's origin '{origin}' is not one this server may call "
            "(BERNARD_WEBHOOK_ORIGINS)",
            "type": "invalid_request_error",
            "param": "webhook_url",
            "code": "invalid_value",
        }
    # Read as httpx and urlsplit read it alike, or refused.
    for url, message in [
        (f"http://evil.example:1\\@localhost:{receiver.port}/", "webhook_url holds a backslash"),
        (f"http://me@localhost:{receiver.port}/", "webhook_url must not hold a user name"),
    ]:
        refused = await hooked.client.post(CHAT, json=body(background=True, webhook_url=url))
        assert refused.status_code == 400, url
        assert refused.json()["error"]["message"].startswith(message)
    not_background = await hooked.client.post(CHAT, json=body(webhook_url=f"{allowed}/mine"))
    assert not_background.status_code == 400
    assert not_background.json()["error"]["param"] == "webhook_url"

    upstream.script(Reply.text("to my own hook"))
    own = f"{allowed}/mine?from=alice"
    turn = (await hooked.client.post(CHAT, json=body(background=True, webhook_url=own))).json()
    (got,) = await receiver.wait(1)
    assert got.path == "/mine"
    assert unwrap(got).data.id == turn["id"]
    await asyncio.sleep(0.3)
    assert len(receiver.got) == 1, "nothing was created for the refused requests"


async def test_a_receiver_that_resolves_to_a_private_address_is_refused_at_delivery(
    upstream: ScriptedUpstream, receiver: Receiver
) -> None:
    # The API's settings allow private receivers and the worker's do not: as when a name
    # that passed the check at start resolves to a private address by the time of delivery
    # (both Settings refuse a loopback target at start without the allowance).
    settings = webhook_settings(upstream, receiver)
    strict = settings.model_copy(update={"webhook_allow_private": False})
    async with (
        run_api(settings) as base_url,
        httpx.AsyncClient(base_url=base_url, headers=bearer(settings)) as client,
        run_worker(strict),
    ):
        turns = []
        for own in (None, receiver.url("/mine", host="localhost")):  # 127.0.0.1; a name
            upstream.script(Reply.text("to a private receiver"))
            hook = {"webhook_url": own} if own else {}
            turns.append((await client.post(CHAT, json=body(background=True, **hook))).json())

        async def both_tried() -> bool:
            return len((await client.get("/v1/webhooks/deliveries")).json()["data"]) >= 2

        await wait_for(both_tried, 10)
        log = (await client.get("/v1/webhooks/deliveries")).json()["data"]
    assert receiver.got == []
    refused = "refused: the receiver is not public (BERNARD_WEBHOOK_ALLOW_PRIVATE)"
    assert {a["turn_id"]: (a["status_code"], a["error"]) for a in log} == {
        turn["id"]: (None, refused) for turn in turns
    }


async def test_a_pinned_post_reaches_the_address_checked_under_the_hosts_name(
    receiver: Receiver,
) -> None:
    url, headers, extensions = pinned(receiver.url("/hook?x=1", host="localhost"), "127.0.0.1")
    assert (str(url), headers, extensions) == (
        f"http://127.0.0.1:{receiver.port}/hook?x=1",
        {"host": f"localhost:{receiver.port}", "connection": "close"},
        {},
    )
    async with httpx.AsyncClient() as client:
        answer = await client.post(url, content=b"{}", headers=headers, extensions=extensions)
    assert answer.status_code == 200
    (got,) = receiver.got
    assert (got.path, got.headers["host"]) == ("/hook", f"localhost:{receiver.port}")
    secure = pinned("https://hooks.example.com/in", "2606:4700::1")
    assert (str(secure[0]), secure[1]["host"], secure[2]) == (
        "https://[2606:4700::1]/in",
        "hooks.example.com",
        {"sni_hostname": "hooks.example.com"},
    )


@contextlib.asynccontextmanager
async def not_http() -> AsyncIterator[int]:
    """A server on loopback that answers whatever it is sent as Redis would, then hangs up."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1024)
        writer.write(b"-ERR unknown command 'POST'\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def test_the_log_tells_no_closed_port_from_one_that_speaks_another_protocol(
    upstream: ScriptedUpstream, receiver: Receiver
) -> None:
    async with not_http() as other_protocol:
        closed = free_port()
        targets = {"closed": closed, "other protocol": other_protocol}
        origins = ",".join(f"http://localhost:{port}" for port in targets.values())
        settings = webhook_settings(
            upstream, receiver, webhook_origins=origins, webhook_retry_delays="30"
        )
        async with hooked_stack(settings) as stack:
            turns = {}
            for name, port in targets.items():
                upstream.script(Reply.text(name))
                hook = body(background=True, webhook_url=f"http://localhost:{port}/hook")
                turns[name] = (await stack.client.post(CHAT, json=hook)).json()

            async def both_tried() -> bool:
                return len(await deliveries(stack)) >= 2

            await wait_for(both_tried, 10)
            log = await deliveries(stack)
    seen = {a["turn_id"]: (a["status_code"], a["error"], a["outcome"]) for a in log}
    assert seen == {
        turn["id"]: (None, "no HTTP answer within 2 s", "retrying") for turn in turns.values()
    }


async def test_an_ending_written_by_the_api_is_delivered_too(
    upstream: ScriptedUpstream, receiver: Receiver
) -> None:
    """Whoever ends the turn queues its delivery: here the API, cancelling a turn no worker
    took yet; the first worker to come delivers it."""
    settings = webhook_settings(upstream, receiver)
    async with (
        run_api(settings) as base_url,
        httpx.AsyncClient(base_url=base_url, headers=bearer(settings)) as client,
    ):
        turn = (await client.post(CHAT, json=body(background=True))).json()
        cancelled = await client.post(f"/v1/turns/{turn['id']}/cancel")
        assert cancelled.json()["status"] == "cancelled"
        assert receiver.got == []
        async with run_worker(settings):
            (got,) = await receiver.wait(1)
            await asyncio.sleep(0.2)
    event = unwrap(got)
    assert (event.type, event.data.id) == ("response.cancelled", turn["id"])
    assert upstream.requests == [], "the turn itself never ran"


async def test_a_worker_killed_mid_attempt_loses_no_delivery(
    upstream: ScriptedUpstream, receiver: Receiver, tmp_path: Path
) -> None:
    """SIGKILL while the receiver holds the POST: once the attempt's time is surely over,
    another worker tries again."""
    receiver.answers = [HANG]
    settings = webhook_settings(upstream, receiver, webhook_timeout_s=1.0)
    async with (
        ProcessGroup(tmp_path / "logs") as procs,
        run_api(settings) as base_url,
        httpx.AsyncClient(base_url=base_url, headers=bearer(settings)) as client,
    ):
        doomed = await procs.worker(settings, name="doomed-worker")
        upstream.script(Reply.text("its worker dies delivering"))
        turn = (await client.post(CHAT, json=body(background=True))).json()
        await receiver.wait(1)
        doomed.send(signal.SIGKILL)
        await procs.worker(settings, name="fresh-worker")
        got = await receiver.wait(2, timeout_s=30)
    waited = got[1].at - got[0].at
    print(f"\nworker SIGKILLed mid-attempt -> tried again {waited:.1f} s after the first")
    assert [g.headers["webhook-id"] for g in got] == [f"evt_{turn['id']}"] * 2
    assert unwrap(got[1]).data.id == turn["id"]
    # Once the attempt's own time (1 s) and its margin (10 s) are over, not before.
    assert 11 <= waited < 20


async def test_a_turn_whose_worker_dies_is_posted_as_failed(
    upstream: ScriptedUpstream, receiver: Receiver, tmp_path: Path
) -> None:
    """The reaper that ends the turn `worker_lost` queues its delivery, as any ending does."""
    settings = webhook_settings(upstream, receiver, lease_ttl_s=2.0, lease_renew_s=0.5)
    gate = upstream.script(Reply.text(["first", " second"], block_after_first=True))
    async with doomed_turn(settings, gate, tmp_path / "logs") as doomed:
        turn = doomed.turn
        doomed.worker.send(signal.SIGKILL)
        await doomed.procs.worker(settings, name="fresh-worker")
        (got,) = await receiver.wait(1, timeout_s=20)
        ended = (await doomed.client.get(f"/v1/turns/{turn['id']}")).json()
    assert ended["error"]["code"] == "worker_lost"
    event = unwrap(got)
    assert (event.type, event.data.id) == ("response.failed", turn["id"])


async def test_a_background_response_is_posted_under_its_response_id(
    hooked: Stack, upstream: ScriptedUpstream, receiver: Receiver
) -> None:
    """Through the Responses API and the official SDK: the event names the response by the
    id its client holds (`resp_...`), as OpenAI's do."""
    key = next(iter(hooked.settings.api_key_users()))
    client = hooked.openai(key)
    upstream.script(Reply.text("in the background"))
    queued = await client.responses.create(model="bernard-v1", input="hello", background=True)
    (got,) = await receiver.wait(1)
    event = unwrap(got)
    assert (event.type, event.data.id) == ("response.completed", queued.id)
    assert queued.id.startswith("resp_")
    assert (await client.responses.retrieve(event.data.id)).output_text == "in the background"


async def test_a_streamed_background_response_is_posted_too(
    hooked: Stack, upstream: ScriptedUpstream, receiver: Receiver
) -> None:
    """`background` with `stream` (OpenAI's way of starting a resumable response) streams
    from the start, and its end is still POSTed, to the request's own allowed target."""
    key = next(iter(hooked.settings.api_key_users()))
    client = hooked.openai(key)
    upstream.script(Reply.text("streamed and hooked"))
    own = receiver.url("/responses", host="localhost")
    stream = await client.responses.create(
        model="bernard-v1",
        input="hello",
        background=True,
        stream=True,
        extra_body={"webhook_url": own},
    )
    types = [event.type async for event in stream]
    assert types[0] == "response.created"
    assert types[-1] == "response.completed"
    (got,) = await receiver.wait(1)
    assert got.path == "/responses"
    event = unwrap(got)
    assert event.type == "response.completed"
    assert (await client.responses.retrieve(event.data.id)).output_text == "streamed and hooked"


async def test_a_finish_cut_off_before_its_queue_half_still_delivers(
    upstream: ScriptedUpstream, receiver: Receiver, tmp_path: Path
) -> None:
    """The worker dies between the turn's ending (data role) and the queue pipeline that
    would queue its delivery: the queue role's writes are paused, the worker writes the
    ending, is SIGKILLed with its queue half waiting, and the pause is lifted. The reaper
    that releases the dead worker's turn queues the delivery; the receiver gets one event."""
    async with private_redis(tmp_path / "queue") as queue_server:
        settings = webhook_settings(
            upstream,
            receiver,
            queue_redis_url=queue_server.url,
            lease_ttl_s=2.0,
            lease_renew_s=0.5,
        )
        gate = upstream.script(Reply.text(["ended", " unannounced"], block_after_first=True))
        queue, data = connect(queue_server.url), connect(settings.redis_url)
        async with doomed_turn(settings, gate, tmp_path / "logs") as doomed:
            turn = doomed.turn
            await queue.execute_command("CLIENT", "PAUSE", 20_000, "WRITE")
            try:
                gate.release()

                async def ended() -> bool:
                    return await data.hget(keys.turn(turn["id"]), "status") == b"completed"

                await wait_for(ended, 10, interval_s=0.01)
                doomed.worker.send(signal.SIGKILL)
                killed_at = time.time()
                await doomed.worker.wait_exit(5)
            finally:
                await queue.execute_command("CLIENT", "UNPAUSE")
            user = next(iter(settings.api_key_users().values()))
            job_key = f"arq:job:{delivery_job_id(user, turn['id'])}"
            # Its liveness lapses (2 s), then the API's reaper (every 0.5 s) queues it.
            await wait_for(lambda: queue.exists(job_key), 10, interval_s=0.01)
            late = time.time() - killed_at
            print(f"\nworker SIGKILLed between its finish's halves -> queued {late:.1f} s after")
            assert late < 5
            await doomed.procs.worker(settings, name="fresh-worker")
            (got,) = await receiver.wait(1, timeout_s=20)
            # Nothing more comes: the reaper's queueing and the worker's (never sent) are
            # one delivery.
            await asyncio.sleep(1.5)
        await queue.aclose()
        await data.aclose()
    assert [g.headers["webhook-id"] for g in receiver.got] == [f"evt_{turn['id']}"]
    event = unwrap(got)
    assert (event.type, event.data.id) == ("response.completed", turn["id"])
