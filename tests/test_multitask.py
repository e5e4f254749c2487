"""A second message while a turn runs on its conversation: it interrupts that turn (the
default), waits in line behind it, or is refused, as its `multitask_strategy` or
BERNARD_MULTITASK_STRATEGY says (shared/conversation_state.py `Strategy`).

Through the real API and worker, with real clients (httpx, the `openai` SDK) and the
scripted upstream pacing the first answer's tokens: what each client reads, what the
conversation's history holds, and what the next turn's prompt says of the answer cut short.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from httpx_sse import EventSource

from shared import keys
from shared.lifecycle import Cause
from shared.turns import TurnStore
from tests.support.sse import Frame, frames
from tests.support.stack import Stack, make_settings, run_stack, run_worker
from tests.support.upstream import Reply, ScriptedUpstream, last_user_text
from tests.support.users import ALICE, keys_for_two

CHAT = "/v1/chat/completions"
SSE = {"Accept": "text/event-stream"}
# Within what a cancel takes to reach a running turn and end it, with room for a loaded
# machine (the bench measures it: docs/benchmarks.md, "Cancel latency").
CANCEL_BOUND_S = 1.0
INTERRUPTED = "[Interrupted here: the user spoke over this answer with the message that follows"


def chat_body(content: str, conversation: str, **more: Any) -> dict[str, Any]:
    return {
        "model": "bernard-v1",
        "messages": [{"role": "user", "content": content}],
        "conversation_id": conversation,
        "stream": True,
        **more,
    }


def sdk(stack: Stack) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key="key-alice", max_retries=0)


async def history(stack: Stack, conversation: str) -> list[tuple[str, str, str | None]]:
    page = await stack.client.get(f"/v1/conversations/{conversation}/messages", headers=ALICE)
    return [(row["role"], row["content"], row.get("stopped")) for row in page.json()["data"]]


async def read_until(stream: AsyncIterator[Frame], text: str) -> str:
    """The content of the frames read until it holds `text`."""
    seen = ""
    async for frame in stream:
        seen += frame.content
        if text in seen:
            return seen
    raise AssertionError(f"the stream ended before {text!r}: {seen!r}")


async def to_the_end(stream: AsyncIterator[Frame]) -> tuple[list[Frame], float]:
    """The frames left, and when the last one came."""
    rest = [frame async for frame in stream]
    return rest, time.perf_counter()


def ending(rest: list[Frame]) -> tuple[str, Any]:
    """How a chat completion stream ended: its error's code, or its finish reason; and
    whether `[DONE]` closed it."""
    assert rest and rest[-1].done, rest
    last = rest[-2].json
    if "error" in last:
        return last["error"]["code"], rest[-1].done
    return last["choices"][0]["finish_reason"], rest[-1].done


async def test_a_second_message_from_another_client_interrupts_the_running_turn(
    two_users: Stack, upstream: ScriptedUpstream
) -> None:
    """Every client attached to the interrupted turn (its own stream, a second reader
    resuming it) reads `turn_interrupted` within the cancel bound; the new message's turn
    runs on a history holding the interrupted answer as far as it went, marked so."""
    first = upstream.script(Reply.text(["Once", " upon", " a", " time"], block_after=2))
    upstream.script(Reply.text(["Fine", ", the", " weather."]))
    async with two_users.client.stream(
        "POST", CHAT, json=chat_body("tell me a story", "kitchen"), headers=ALICE
    ) as response:
        turn_id = response.headers["x-bernard-turn-id"]
        stream = frames(response)
        assert await read_until(stream, "Once upon") == "Once upon"
        await first.wait_blocked()
        # A second reader of the same turn, from another client.
        async with (
            httpx.AsyncClient(base_url=two_users.base_url, timeout=30) as other,
            other.stream("GET", f"/v1/turns/{turn_id}/events", headers=ALICE) as resumed,
        ):
            reader = frames(resumed)
            assert await read_until(reader, "Once upon") == "Once upon"
            sent = time.perf_counter()
            answer = asyncio.create_task(ask(two_users, "what about the weather?"))
            (rest, ended_at), (again, _) = await asyncio.gather(
                to_the_end(stream), to_the_end(reader)
            )
        second, first_token_at = await answer

    code, closed = ending(rest)
    assert (code, closed) == ("turn_interrupted", True)
    assert ending(again) == ("turn_interrupted", True)
    assert "".join(frame.content for frame in rest) == ""
    assert ended_at - sent < CANCEL_BOUND_S, f"interrupted after {ended_at - sent:.3f} s"
    assert first_token_at - sent < CANCEL_BOUND_S + 1
    assert second == "Fine, the weather."
    assert (await upstream.wait_disconnect(0)).ended, "the first answer's upstream call closed"
    turn = (await two_users.client.get(f"/v1/turns/{turn_id}", headers=ALICE)).json()
    assert (turn["status"], turn["error"]["code"]) == ("cancelled", "turn_interrupted")
    assert await history(two_users, "kitchen") == [
        ("user", "tell me a story", None),
        ("assistant", "Once upon", "turn_interrupted"),
        ("user", "what about the weather?", None),
        ("assistant", "Fine, the weather.", None),
    ]
    # The second turn's prompt says where the first answer was cut, and why.
    prompt = [m for m in upstream.requests[-1]["messages"] if m["role"] != "system"]
    assert [m["role"] for m in prompt] == ["user", "assistant", "user"]
    assert prompt[1]["content"].startswith("Once upon\n\n" + INTERRUPTED)


async def ask(stack: Stack, content: str) -> tuple[str, float]:
    """A message from the `openai` SDK, streamed: its answer, and when its first token came."""
    stream = await sdk(stack).chat.completions.create(
        model="bernard-v1",
        messages=[{"role": "user", "content": content}],
        stream=True,
        extra_body={"conversation_id": "kitchen"},
    )
    text, first_at = "", 0.0
    async for chunk in stream:
        piece = chunk.choices[0].delta.content if chunk.choices else None
        if piece and not first_at:
            first_at = time.perf_counter()
        text += piece or ""
    return text, first_at


async def named(response: httpx.Response) -> list[tuple[str, Any]]:
    return [(sse.event, sse.json()) async for sse in EventSource(response).aiter_sse()]


async def test_an_enqueued_message_opens_its_stream_at_once_and_runs_once_the_turn_ends(
    two_users: Stack, upstream: ScriptedUpstream
) -> None:
    await two_users.client.post("/v1/conversations", json={"id": "hall"}, headers=ALICE)
    first = upstream.script(Reply.text(["Slow", " and", " whole."], block_after=1))
    upstream.script(Reply.text("Then this."))
    url = "/v1/conversations/hall/messages"
    started = asyncio.create_task(
        two_users.client.post(url, json={"content": "first"}, headers=ALICE)
    )
    await first.wait_blocked()
    body = {"content": "second", "multitask_strategy": "enqueue"}
    async with two_users.client.stream("POST", url, json=body, headers={**ALICE, **SSE}) as waiting:
        # Its stream is open (headers, its turn) while the first turn still runs.
        assert waiting.status_code == 200
        second_id = waiting.headers["x-bernard-turn-id"]
        shown = (await two_users.client.get("/v1/conversations/hall", headers=ALICE)).json()
        await asyncio.sleep(0.3)
        assert len(upstream.requests) == 1, "the second turn waits: no model call yet"
        first.release()
        done = await started
        events = await named(waiting)
    assert done.status_code == 200 and done.json()["status"] == "completed"
    assert shown["status"] == "running" and shown["turn_id"] != second_id
    assert [data["text"] for name, data in events if name == "text_delta"] == ["Then", " this."]
    assert events[-1][0] == "done" and events[-1][1]["status"] == "completed"
    assert last_user_text(upstream.requests[1]) == "second"
    assert await history(two_users, "hall") == [
        ("user", "first", None),
        ("assistant", "Slow and whole.", None),
        ("user", "second", None),
        ("assistant", "Then this.", None),
    ]


async def test_reject_is_a_409_as_a_request_or_the_deployment_says(
    upstream: ScriptedUpstream,
) -> None:
    settings = make_settings(upstream, api_keys=keys_for_two(), multitask_strategy="reject")
    async with run_stack(settings) as stack:
        await stack.client.post("/v1/conversations", json={"id": "den"}, headers=ALICE)
        gate = upstream.script(Reply.text(["held"], block_after=0))
        url = "/v1/conversations/den/messages"
        first = asyncio.create_task(stack.client.post(url, json={"content": "a"}, headers=ALICE))
        await gate.wait_blocked()
        refused = await stack.client.post(url, json={"content": "b"}, headers=ALICE)
        # The request's own strategy wins over the deployment's.
        upstream.script(Reply.text("queued one"))
        queued = asyncio.create_task(
            stack.client.post(
                url, json={"content": "c", "multitask_strategy": "enqueue"}, headers=ALICE
            )
        )
        await asyncio.sleep(0.2)
        gate.release()
        ran, after = await first, await queued
    error = refused.json()["error"]
    assert (refused.status_code, error["code"]) == (409, "conversation_busy")
    assert ran.json()["status"] == "completed"
    assert (after.status_code, after.json()["status"]) == (200, "completed")


async def test_two_messages_racing_each_get_their_answer_and_the_running_turn_stops(
    two_users: Stack, upstream: ScriptedUpstream
) -> None:
    """Neither interrupts the other: both wait behind the turn they interrupt, in the order
    they came, and each is answered."""
    gate = upstream.script(Reply.text(["Let", " me", " think"], block_after=1))
    upstream.script(Reply.text("One answer."))
    upstream.script(Reply.text("Another answer."))
    url = "/v1/conversations/porch/messages"
    await two_users.client.post("/v1/conversations", json={"id": "porch"}, headers=ALICE)
    first = asyncio.create_task(two_users.client.post(url, json={"content": "hm"}, headers=ALICE))
    await gate.wait_blocked()
    async with (
        httpx.AsyncClient(base_url=two_users.base_url, timeout=30) as one,
        httpx.AsyncClient(base_url=two_users.base_url, timeout=30) as two,
    ):
        answers = await asyncio.gather(
            one.post(url, json={"content": "lights on"}, headers=ALICE),
            two.post(url, json={"content": "music off"}, headers=ALICE),
        )
    stopped = await first
    gate.release()

    assert stopped.status_code == 409 and stopped.json()["error"]["code"] == "turn_interrupted"
    assert [a.status_code for a in answers] == [200, 200]
    assert [a.json()["status"] for a in answers] == ["completed", "completed"]
    rows = await history(two_users, "porch")
    assert rows[:2] == [("user", "hm", None), ("assistant", "Let", "turn_interrupted")]
    asked = [content for role, content, _ in rows[2:] if role == "user"]
    assert sorted(asked) == ["lights on", "music off"]
    # Each answer follows its own question, the second turn's after the first's.
    assert [role for role, _, _ in rows[2:]] == ["user", "assistant", "user", "assistant"]
    assert [content for role, content, _ in rows[2:] if role == "assistant"] == [
        "One answer.",
        "Another answer.",
    ]


async def test_a_line_holds_at_most_its_budget(upstream: ScriptedUpstream) -> None:
    settings = make_settings(upstream, api_keys=keys_for_two(), max_waiting_turns=1)
    async with run_stack(settings) as stack:
        await stack.client.post("/v1/conversations", json={"id": "attic"}, headers=ALICE)
        gate = upstream.script(Reply.text(["held"], block_after=0))
        url = "/v1/conversations/attic/messages"
        enqueue = {"multitask_strategy": "enqueue"}
        first = asyncio.create_task(stack.client.post(url, json={"content": "a"}, headers=ALICE))
        await gate.wait_blocked()
        upstream.script(Reply.text("b's answer"))
        waiting = asyncio.create_task(
            stack.client.post(url, json={"content": "b", **enqueue}, headers=ALICE)
        )
        await wait_line(stack, "attic", 1)
        over = await stack.client.post(url, json={"content": "c", **enqueue}, headers=ALICE)
        interrupt = await stack.client.post(url, json={"content": "d"}, headers=ALICE)
        gate.release()
        await first
        assert (await waiting).json()["status"] == "completed"
    for refused in (over, interrupt):
        error = refused.json()["error"]
        assert (refused.status_code, error["code"]) == (409, "conversation_busy")
        assert "BERNARD_MAX_WAITING_TURNS" in error["message"]


async def wait_line(stack: Stack, conversation: str, length: int) -> None:
    owner = stack.settings.api_key_users()["key-alice"]
    meta = keys.conversation(owner, conversation)
    for _ in range(200):
        waiting = await stack.redis.hget(meta, "waiting")  # type: ignore[misc]
        if len((waiting or b"").split()) == length:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the line never held {length}")


async def test_a_responses_request_in_a_conversation_interrupts_the_running_one(
    two_users: Stack, upstream: ScriptedUpstream
) -> None:
    gate = upstream.script(Reply.text(["Counting", " sheep"], block_after=1))
    upstream.script(Reply.text("Good night."))
    client = sdk(two_users)
    await two_users.client.post("/v1/conversations", json={"id": "bedroom"}, headers=ALICE)
    stream = await client.responses.create(
        model="bernard-v1", input="count sheep", conversation="bedroom", stream=True
    )
    kinds: list[str] = []
    async for event in stream:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            break
    await gate.wait_blocked()
    second = await client.responses.create(
        model="bernard-v1", input="stop, good night", conversation="bedroom"
    )
    async for event in stream:
        kinds.append(event.type)
    assert second.output_text == "Good night."
    assert kinds[-1] == "response.cancelled", kinds
    rows = await history(two_users, "bedroom")
    assert rows[1] == ("assistant", "Counting", "turn_interrupted")


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (CHAT, chat_body("hi", "attic", multitask_strategy="sometimes"), "multitask_strategy"),
        (
            "/v1/conversations/attic/messages",
            {"content": "hi", "multitask_strategy": "later"},
            "multitask_strategy",
        ),
        (
            "/v1/responses",
            {"model": "bernard-v1", "input": "hi", "multitask_strategy": 3},
            "multitask_strategy",
        ),
    ],
)
async def test_an_unknown_strategy_is_a_400_naming_the_field(
    two_users: Stack, path: str, body: dict[str, Any], param: str
) -> None:
    await two_users.client.post("/v1/conversations", json={"id": "attic"}, headers=ALICE)
    response = await two_users.client.post(path, json=body, headers=ALICE)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


async def test_a_turn_whose_line_nobody_moved_on_takes_its_turn_when_its_job_comes_due(
    upstream: ScriptedUpstream,
) -> None:
    """The process that ended the turn it waited behind died before moving the line: once
    its job comes due (its deferral's end; made due early here), the waiting turn finds
    that turn ended, moves the line on itself and runs."""
    settings = make_settings(upstream, api_keys=keys_for_two())
    async with run_stack(settings, worker=False) as stack:
        await stack.client.post("/v1/conversations", json={"id": "cellar"}, headers=ALICE)
        url = "/v1/conversations/cellar/messages"
        first = asyncio.create_task(stack.client.post(url, json={"content": "a"}, headers=ALICE))
        owner = settings.api_key_users()["key-alice"]
        meta = keys.conversation(owner, "cellar")
        for _ in range(200):
            if await stack.redis.hget(meta, "active_turn"):  # type: ignore[misc]
                break
            await asyncio.sleep(0.01)
        body = {"content": "b", "multitask_strategy": "enqueue"}
        second = asyncio.create_task(stack.client.post(url, json=body, headers=ALICE))
        await wait_line(stack, "cellar", 1)
        raw = await stack.redis.hmget(meta, ["active_turn", "waiting"])  # type: ignore[misc]
        active, waiting = (value.decode() for value in raw)
        mute = Mute(stack.redis, retention_s=60, stream_maxlen=100)
        await mute.end(active, owner, Cause.CANCELLED_QUEUED)
        cancelled = await first
        stood = await stack.redis.hget(meta, "waiting")  # type: ignore[misc]
        assert stood == waiting.encode(), "the line stood"
        upstream.script(Reply.text("At last."))
        await stack.redis.zadd(settings.queue_name, {waiting: 0})
        async with run_worker(settings):
            answered = await second
    assert cancelled.json()["error"]["code"] == "turn_cancelled"
    assert (answered.status_code, answered.json()["status"]) == (200, "completed")
    assert [last_user_text(body) for body in upstream.requests] == ["b"]


class Mute(TurnStore):
    """A store whose endings never move a conversation's line, as a process that dies
    between a turn's ending and that move."""

    async def _advance_quietly(self, owner: str, conversation_id: str, ended: str) -> None:
        return None
