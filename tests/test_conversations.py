"""The conversations API and confirmations, through real HTTP, Redis, worker and upstream.

Every route is owner-scoped (another user's conversation is the same 404 as a missing one,
401 without a key). Posting a message runs a turn on the stored history and answers JSON or,
with `Accept: text/event-stream`, named events. A tool that changes the world (here the
notes tools) pauses the turn until the user approves or rejects it; the decision resumes the
conversation as a new turn.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from httpx_sse import EventSource

from shared import keys
from shared.notes import NoteStore
from shared.records.keeper import RecordKeeper
from tests.support.processes import ProcessGroup, private_redis, wait_for
from tests.support.sse import collect, named_events
from tests.support.stack import Stack, make_settings, run_stack
from tests.support.upstream import Reply, ScriptedUpstream
from tests.support.users import ALICE, BOB, keys_for_two


def alice(stack: Stack) -> str:
    return stack.settings.api_key_users()["key-alice"]


SSE = {"Accept": "text/event-stream"}
NOTE = ("save_note", {"text": "the door code is 1234"})


async def conversation(stack: Stack, conversation_id: str = "kitchen") -> str:
    created = await stack.client.post(
        "/v1/conversations", json={"id": conversation_id}, headers=ALICE
    )
    assert created.status_code == 201, created.text
    return conversation_id


async def post(
    stack: Stack,
    conversation_id: str,
    content: str,
    *,
    stream: bool = False,
    strategy: str | None = None,
) -> httpx.Response | list[tuple[str, Any]]:
    url = f"/v1/conversations/{conversation_id}/messages"
    body: dict[str, Any] = {"content": content}
    if strategy is not None:
        body["multitask_strategy"] = strategy
    if not stream:
        return await stack.client.post(url, json=body, headers=ALICE)
    return await named(stack, "POST", url, json=body)


async def named(stack: Stack, method: str, url: str, **kwargs: Any) -> list[tuple[str, Any]]:
    """The (event, data) pairs of a named-event stream."""
    async with stack.client.stream(method, url, headers={**ALICE, **SSE}, **kwargs) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        assert response.headers["x-accel-buffering"] == "no"
        return await named_events(response)


def kinds(events: list[tuple[str, Any]]) -> list[str]:
    """Event names, a run of text deltas counted once."""
    out: list[str] = []
    for name, _ in events:
        if not (out and out[-1] == name == "text_delta"):
            out.append(name)
    return out


def text(events: list[tuple[str, Any]]) -> str:
    return "".join(data["text"] for name, data in events if name == "text_delta")


async def resume(
    stack: Stack, conversation_id: str, body: dict[str, Any], *, stream: bool = False
) -> httpx.Response | list[tuple[str, Any]]:
    url = f"/v1/conversations/{conversation_id}/resume"
    if stream:
        return await named(stack, "POST", url, json=body)
    return await stack.client.post(url, json=body, headers=ALICE)


async def notes_of(stack: Stack) -> list[str]:
    store = NoteStore(stack.redis, alice(stack), retention_s=60)
    return [note.text for note in await store.all()]


# -- conversations -----------------------------------------------------------------------------


async def test_a_conversation_is_created_read_listed_and_deleted(two_users: Stack) -> None:
    created = await two_users.client.post(
        "/v1/conversations", json={"id": "kitchen", "metadata": {"room": "kitchen"}}, headers=ALICE
    )
    assert created.status_code == 201
    assert created.json() | {"created_at": 0, "updated_at": 0} == {
        "id": "kitchen",
        "object": "conversation",
        "created_at": 0,
        "updated_at": 0,
        "status": "idle",
        "turn_id": None,
        "title": None,
        "metadata": {"room": "kitchen"},
        "message_count": 0,
        "pending_confirmation": None,
    }
    fresh = (await two_users.client.post("/v1/conversations", headers=ALICE)).json()
    assert fresh["id"].startswith("conv_")
    taken = await two_users.client.post("/v1/conversations", json={"id": "kitchen"}, headers=ALICE)
    assert (taken.status_code, taken.json()["error"]["code"]) == (409, "conversation_exists")

    read = (await two_users.client.get("/v1/conversations/kitchen", headers=ALICE)).json()
    assert read["metadata"] == {"room": "kitchen"} and read["status"] == "idle"
    listed = (await two_users.client.get("/v1/conversations", headers=ALICE)).json()
    assert [c["id"] for c in listed["data"]] == [fresh["id"], "kitchen"], "newest first"

    deleted = await two_users.client.delete("/v1/conversations/kitchen", headers=ALICE)
    assert deleted.json()["deleted"] is True
    gone = await two_users.client.get("/v1/conversations/kitchen", headers=ALICE)
    assert gone.status_code == 404
    listed = (await two_users.client.get("/v1/conversations", headers=ALICE)).json()
    assert [c["id"] for c in listed["data"]] == [fresh["id"]]


async def test_conversations_page_newest_used_first(two_users: Stack) -> None:
    for n in range(5):
        await conversation(two_users, f"c{n}")
    await post(two_users, "c1", "bring me back up")
    first = (await two_users.client.get("/v1/conversations?limit=2", headers=ALICE)).json()
    rest = (
        await two_users.client.get(
            f"/v1/conversations?limit=10&after={first['last_id']}", headers=ALICE
        )
    ).json()
    assert [c["id"] for c in first["data"]] == ["c1", "c4"] and first["has_more"]
    assert [c["id"] for c in rest["data"]] == ["c3", "c2", "c0"] and not rest["has_more"]


async def test_messages_page_oldest_first_with_their_rows(two_users: Stack) -> None:
    await conversation(two_users)
    for n in range(3):
        await post(two_users, "kitchen", f"question {n}")
    page = (
        await two_users.client.get("/v1/conversations/kitchen/messages?limit=4", headers=ALICE)
    ).json()
    rest = (
        await two_users.client.get(
            f"/v1/conversations/kitchen/messages?after={page['last_id']}", headers=ALICE
        )
    ).json()
    rows = page["data"] + rest["data"]
    assert [r["id"] for r in rows] == [f"msg_{n}" for n in range(1, 7)]
    assert [r["role"] for r in rows] == ["user", "assistant"] * 3
    assert set(rows[0]) >= {"id", "role", "content", "turn_id", "created_at"}
    assert page["has_more"] and not rest["has_more"]
    bad = await two_users.client.get("/v1/conversations/kitchen/messages?after=nope", headers=ALICE)
    assert (bad.status_code, bad.json()["error"]["param"]) == (400, "after")


ROUTES = [
    ("GET", "/v1/conversations/{id}", None),
    ("GET", "/v1/conversations/{id}/messages", None),
    ("POST", "/v1/conversations/{id}/messages", {"content": "hi"}),
    ("POST", "/v1/conversations/{id}/resume", {"confirmation_id": "x", "decision": "approve"}),
    ("DELETE", "/v1/conversations/{id}", None),
]


@pytest.mark.parametrize(("method", "route", "payload"), ROUTES)
async def test_every_route_is_the_owners_alone(
    two_users: Stack, method: str, route: str, payload: dict[str, Any] | None
) -> None:
    await conversation(two_users, "alices")
    url = route.format(id="alices")
    kwargs = {"json": payload} if payload is not None else {}
    theirs = await two_users.client.request(method, url, headers=BOB, **kwargs)
    missing = await two_users.client.request(
        method, route.format(id="no-such"), headers=BOB, **kwargs
    )
    keyless = await two_users.client.request(method, url, **kwargs)
    assert theirs.status_code == missing.status_code == 404
    assert theirs.json()["error"]["code"] == missing.json()["error"]["code"]
    assert keyless.status_code == 401
    listed = await two_users.client.get("/v1/conversations", headers=BOB)
    assert listed.json()["data"] == []
    assert (await two_users.client.get("/v1/conversations")).status_code == 401
    assert (await two_users.client.post("/v1/conversations")).status_code == 401


# -- turns on a conversation -------------------------------------------------------------------


async def test_json_and_sse_give_the_same_rows(
    two_users: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.text(["Hello", " there"]))
    upstream.script(Reply.text(["Hello", " there"]))
    await conversation(two_users, "json")
    await conversation(two_users, "sse")
    answered = await post(two_users, "json", "hi")
    assert isinstance(answered, httpx.Response) and answered.status_code == 200
    body = answered.json()
    events = await post(two_users, "sse", "hi", stream=True)
    assert isinstance(events, list)

    streamed_rows = [data for name, data in events if name == "message"]

    def shape(rows: list[dict[str, Any]]) -> list[tuple[str, Any]]:
        return [(r["role"], r["content"]) for r in rows]

    assert body["status"] == "completed" and body["pending_confirmation"] is None
    assert (
        shape(body["messages"])
        == shape(streamed_rows)
        == [
            ("user", "hi"),
            ("assistant", "Hello there"),
        ]
    )
    assert kinds(events) == ["message", "text_delta", "message", "done"]
    assert events[-1][1]["status"] == "completed" and events[-1][1]["turn_id"]
    assert text(events) == "Hello there"


async def test_a_read_tool_round_streams_call_progress_and_result(
    two_users: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script_router(Reply.tool_calls([("calculator", {"expression": "6 * 7"})]))
    upstream.script(Reply.text("It is 42."))
    await conversation(two_users)
    events = await post(two_users, "kitchen", "6*7?", stream=True)
    assert isinstance(events, list)
    assert kinds(events) == [
        "message",  # the question
        "tool_call",
        "tool_progress",
        "tool_progress",
        "tool_result",
        "text_delta",
        "message",  # the router's tool call
        "message",  # its result
        "message",  # the answer
        "done",
    ]
    call = next(data for name, data in events if name == "tool_call")
    result = next(data for name, data in events if name == "tool_result")
    assert call["name"] == "calculator" and json.loads(call["arguments"]) == {"expression": "6 * 7"}
    assert result == {
        "tool_call_id": call["id"],
        "name": "calculator",
        "output": "42",
        "is_error": False,
    }


async def test_a_busy_conversation_refuses_a_second_turn_that_says_reject(
    two_users: Stack, upstream: ScriptedUpstream
) -> None:
    gate = upstream.script(Reply.text(["slow", " answer"], block_after_first=True))
    await conversation(two_users)
    first = asyncio.create_task(post(two_users, "kitchen", "first"))
    await gate.wait_blocked()
    running = (await two_users.client.get("/v1/conversations/kitchen", headers=ALICE)).json()
    second = await post(two_users, "kitchen", "second", strategy="reject")
    assert isinstance(second, httpx.Response)
    assert (second.status_code, second.json()["error"]["code"]) == (409, "conversation_busy")
    gate.release()
    done = await first
    assert isinstance(done, httpx.Response) and done.status_code == 200
    idle = (await two_users.client.get("/v1/conversations/kitchen", headers=ALICE)).json()
    assert (running["status"], idle["status"]) == ("running", "idle")
    # The running turn is named, so a client that did not start it can follow it.
    assert (running["turn_id"], idle["turn_id"]) == (done.json()["turn_id"], None)
    listed = (await two_users.client.get("/v1/conversations", headers=ALICE)).json()["data"]
    assert [c["turn_id"] for c in listed] == [None]
    assert (await post(two_users, "kitchen", "third")).status_code == 200  # type: ignore[union-attr]


async def test_a_message_or_a_decision_asking_for_a_trace_streams_one(
    two_users: Stack, upstream: ScriptedUpstream
) -> None:
    await conversation(two_users)
    upstream.script(Reply.text("Plain."))
    plain = await named(
        two_users, "POST", "/v1/conversations/kitchen/messages", json={"content": "a"}
    )
    assert "trace" not in kinds(plain)

    upstream.script(Reply.text("Traced.", usage=(12, 3)))
    body = {"content": "b", "trace": True}
    traced = await named(two_users, "POST", "/v1/conversations/kitchen/messages", json=body)
    traces = [data for name, data in traced if name == "trace"]
    assert [(t["type"], t.get("stage")) for t in traces] == [
        ("memory", None),
        ("llm_prompt", "router"),
        ("llm_call_complete", "router"),
        ("llm_prompt", "response"),
        ("llm_call_complete", "response"),
    ]
    assert traces[3]["messages"][-1] == {"role": "user", "content": "b"}
    assert traces[4]["usage"]["prompt_tokens"] == 12 and traces[4]["latency_ms"] >= 0

    upstream.script_router(Reply.tool_calls([NOTE]))
    paused = await post(two_users, "kitchen", "remember the door code")
    confirmation = paused.json()["pending_confirmation"]["confirmation_id"]  # type: ignore[union-attr]
    upstream.script(Reply.text("Saved."))
    decided = await resume(
        two_users,
        "kitchen",
        {"confirmation_id": confirmation, "decision": "approve", "trace": True},
        stream=True,
    )
    assert isinstance(decided, list)
    assert ("llm_prompt", "response") in [
        (data["type"], data.get("stage")) for name, data in decided if name == "trace"
    ]


# -- confirmations ---------------------------------------------------------------------------------


async def pause(stack: Stack, upstream: ScriptedUpstream, conversation_id: str = "kitchen") -> str:
    """A turn that proposes saving a note and waits; its confirmation id."""
    upstream.script_router(Reply.tool_calls([NOTE]))
    answered = await post(stack, conversation_id, "remember the door code")
    assert isinstance(answered, httpx.Response) and answered.status_code == 200, answered.text
    body = answered.json()
    assert body["status"] == "awaiting_confirmation"
    return str(body["pending_confirmation"]["confirmation_id"])


async def test_a_write_tool_waits_and_runs_only_once_approved(
    two_users: Stack, upstream: ScriptedUpstream
) -> None:
    await conversation(two_users)
    upstream.script_router(Reply.tool_calls([NOTE]))
    events = await post(two_users, "kitchen", "remember the door code", stream=True)
    assert isinstance(events, list)
    assert kinds(events) == ["message", "text_delta", "awaiting_confirmation", "message", "done"]
    assert text(events) == "Shall I remember “the door code is 1234”?"
    proposal = next(data for name, data in events if name == "awaiting_confirmation")
    assert proposal["summary"] == "Remember “the door code is 1234”"
    assert proposal["tool_call"]["name"] == "save_note"
    assert proposal["expires_at"] > time.time() + 3000
    assert events[-1][1]["status"] == "awaiting_confirmation"
    assert await notes_of(two_users) == [], "nothing ran"
    waiting = (await two_users.client.get("/v1/conversations/kitchen", headers=ALICE)).json()
    assert waiting["status"] == "awaiting_confirmation"
    assert waiting["pending_confirmation"]["confirmation_id"] == proposal["confirmation_id"]

    upstream.script(Reply.text("Saved it."))
    approved = await resume(
        two_users,
        "kitchen",
        {"confirmation_id": proposal["confirmation_id"], "decision": "approve"},
        stream=True,
    )
    assert isinstance(approved, list)
    assert kinds(approved) == [
        "tool_call",
        "tool_progress",
        "tool_result",
        "text_delta",
        "message",
        "message",
        "done",
    ]
    assert await notes_of(two_users) == ["the door code is 1234"]
    assert approved[-1][1]["status"] == "completed"
    # The model saw its call answered before it answered.
    tool_message = upstream.router_requests[-1]["messages"][-1]
    assert tool_message["role"] == "tool" and "Saved" in tool_message["content"]
    again = await resume(
        two_users, "kitchen", {"confirmation_id": proposal["confirmation_id"], "decision": "reject"}
    )
    assert isinstance(again, httpx.Response)
    assert (again.status_code, again.json()["error"]["code"]) == (
        409,
        "confirmation_already_decided",
    )


async def test_a_rejected_write_never_runs_and_the_model_hears_why(
    two_users: Stack, upstream: ScriptedUpstream
) -> None:
    await conversation(two_users)
    confirmation = await pause(two_users, upstream)
    upstream.script(Reply.text("Fine, I won't."))
    rejected = await resume(
        two_users, "kitchen", {"confirmation_id": confirmation, "decision": "reject"}
    )
    assert isinstance(rejected, httpx.Response) and rejected.status_code == 200
    body = rejected.json()
    assert body["status"] == "completed"
    assert [(r["role"], r["content"]) for r in body["messages"]] == [
        ("tool", "The user declined: save_note was not run."),
        ("assistant", "Fine, I won't."),
    ]
    assert await notes_of(two_users) == []
    told = upstream.router_requests[-1]["messages"][-1]
    assert (told["role"], told["content"]) == ("tool", "The user declined: save_note was not run.")


async def test_edited_arguments_run_when_they_fit_the_tools_schema(
    two_users: Stack, upstream: ScriptedUpstream
) -> None:
    await conversation(two_users)
    confirmation = await pause(two_users, upstream)
    wrong = await resume(
        two_users,
        "kitchen",
        {"confirmation_id": confirmation, "decision": "approve", "arguments": {"text": 5}},
    )
    assert isinstance(wrong, httpx.Response)
    assert (wrong.status_code, wrong.json()["error"]["param"]) == (400, "arguments.text")
    assert await notes_of(two_users) == [], "a refused edit decides nothing"
    edited = await resume(
        two_users,
        "kitchen",
        {
            "confirmation_id": confirmation,
            "decision": "approve",
            "arguments": {"text": "the door code is 4321"},
        },
    )
    assert isinstance(edited, httpx.Response) and edited.status_code == 200, edited.text
    assert await notes_of(two_users) == ["the door code is 4321"]


async def test_edited_arguments_are_the_ones_the_history_and_the_model_read(
    two_users: Stack, upstream: ScriptedUpstream
) -> None:
    """Approved with edited arguments, the call is stored as it ran (issue 24: shown 40 %,
    ran 80 %): the stored tool-call message, the prompt of the turn that runs it and of the
    next one, and the call record all hold the edited arguments, beside its result."""
    await conversation(two_users)
    confirmation = await pause(two_users, upstream)
    upstream.script(Reply.text("Saved the new code."))
    edited = await resume(
        two_users,
        "kitchen",
        {
            "confirmation_id": confirmation,
            "decision": "approve",
            "arguments": {"text": "the door code is 4321"},
        },
    )
    assert isinstance(edited, httpx.Response) and edited.status_code == 200, edited.text
    ran = '{"text": "the door code is 4321"}'
    answering = upstream.router_requests[-1]["messages"]
    # What the user was asked stays as it was asked; the call says what ran.
    asked = "Shall I remember “the door code is 1234”?"
    assert [(m["role"], m["content"]) for m in answering[-2:]] == [
        ("assistant", asked),
        ("tool", "Saved: the door code is 4321"),
    ]
    assert answering[-2]["tool_calls"][0]["function"]["arguments"] == ran

    rows = (await two_users.client.get("/v1/conversations/kitchen/messages", headers=ALICE)).json()
    assert [(row["role"], row["content"]) for row in rows["data"]] == [
        ("user", "remember the door code"),
        ("assistant", asked),
        ("tool", "Saved: the door code is 4321"),
        ("assistant", "Saved the new code."),
    ]
    call = rows["data"][1]["tool_calls"][0]
    assert (call["function"]["name"], call["function"]["arguments"]) == ("save_note", ran)
    assert rows["data"][2]["tool_call_id"] == call["id"]
    records = await RecordKeeper(two_users.redis, alice(two_users)).calls("kitchen", kind="tool")
    assert [(c["name"], c["arguments"]) for c in records] == [("save_note", ran)]

    upstream.script(Reply.text("It is 4321."))
    answered = await post(two_users, "kitchen", "what is the code?")
    assert isinstance(answered, httpx.Response) and answered.status_code == 200, answered.text
    prompt = upstream.router_requests[-1]["messages"]
    called = [m for m in prompt if m.get("tool_calls")]
    assert [m["tool_calls"][0]["function"]["arguments"] for m in called] == [ran]


async def test_edited_arguments_nested_deeper_than_a_body_may_are_400_naming_them(
    two_users: Stack, upstream: ScriptedUpstream
) -> None:
    """Deeper than the bound, they could not be stored (orjson writes at most 254 levels):
    a 500 that left the decision half made."""
    await conversation(two_users)
    confirmation = await pause(two_users, upstream)
    deep: Any = "leaf"
    for _ in range(300):
        deep = {"a": deep}
    refused = await resume(
        two_users,
        "kitchen",
        {
            "confirmation_id": confirmation,
            "decision": "approve",
            "arguments": {"text": "the door code is 4321", "extra": deep},
        },
    )
    assert isinstance(refused, httpx.Response)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == "arguments"
    assert await notes_of(two_users) == [], "a refused edit decides nothing"
    approved = await resume(
        two_users, "kitchen", {"confirmation_id": confirmation, "decision": "approve"}
    )
    assert isinstance(approved, httpx.Response) and approved.status_code == 200, approved.text
    assert await notes_of(two_users) == ["the door code is 1234"]


async def test_an_expired_proposal_cannot_be_decided_and_is_recorded_as_not_run(
    upstream: ScriptedUpstream,
) -> None:
    settings = make_settings(upstream, api_keys=keys_for_two(), confirmation_ttl_s=1)
    async with run_stack(settings) as stack:
        await conversation(stack)
        confirmation = await pause(stack, upstream)
        await asyncio.sleep(1.2)
        idle = (await stack.client.get("/v1/conversations/kitchen", headers=ALICE)).json()
        late = await resume(
            stack, "kitchen", {"confirmation_id": confirmation, "decision": "approve"}
        )
        assert isinstance(late, httpx.Response)
        assert (late.status_code, late.json()["error"]["code"]) == (409, "confirmation_expired")
        upstream.script(Reply.text("ok"))
        moved_on = await post(stack, "kitchen", "never mind")
        assert isinstance(moved_on, httpx.Response) and moved_on.status_code == 200
        rows = moved_on.json()["messages"]
        assert idle["status"] == "idle"
        assert (rows[0]["role"], rows[0]["content"]) == (
            "tool",
            "Not run: the user did not confirm this in time.",
        )
        assert await notes_of(stack) == []


async def test_a_turn_that_fails_after_its_approved_call_ran_records_that_it_ran(
    two_users: Stack, upstream: ScriptedUpstream
) -> None:
    """The approved call runs, then the model call after it fails: the conversation holds
    the call's real result, not the "not run" answer of a call nobody decided on, and the
    next turn's model reads it right after the call (a valid prompt)."""
    await conversation(two_users)
    confirmation = await pause(two_users, upstream)
    upstream.script_router(Reply.error(500, "the router is down"))
    failed = await resume(
        two_users, "kitchen", {"confirmation_id": confirmation, "decision": "approve"}
    )
    assert isinstance(failed, httpx.Response) and failed.status_code == 502, failed.text
    assert failed.json()["error"]["code"] == "upstream_error"
    assert await notes_of(two_users) == ["the door code is 1234"], "it ran"

    upstream.script(Reply.text("It is saved."))
    answered = await post(two_users, "kitchen", "did you save it?")
    assert isinstance(answered, httpx.Response) and answered.status_code == 200, answered.text
    rows = (await two_users.client.get("/v1/conversations/kitchen/messages", headers=ALICE)).json()
    roles = [(row["role"], row["content"]) for row in rows["data"]]
    call_id = rows["data"][1]["tool_calls"][0]["id"]
    assert roles[:2] == [
        ("user", "remember the door code"),
        ("assistant", "Shall I remember “the door code is 1234”?"),
    ]
    assert roles[2] == ("tool", "Saved: the door code is 1234")
    assert rows["data"][2]["tool_call_id"] == call_id
    assert roles[3:] == [("user", "did you save it?"), ("assistant", "It is saved.")]
    prompt = upstream.router_requests[-1]["messages"]
    called = next(i for i, m in enumerate(prompt) if m.get("tool_calls"))
    assert (prompt[called + 1]["role"], prompt[called + 1]["content"]) == roles[2]
    calls = await RecordKeeper(two_users.redis, alice(two_users)).calls("kitchen", kind="tool")
    assert [(c["name"], c["status"]) for c in calls] == [("save_note", "completed")]


async def test_a_turn_that_fails_after_its_tool_calls_ran_keeps_them_in_the_conversation(
    two_users: Stack, upstream: ScriptedUpstream
) -> None:
    """A read call runs, then the router's next model call fails: the call and its result
    stay in the conversation, for the next turn's model to read, and no call is left
    without its result."""
    await conversation(two_users)
    upstream.script_router(Reply.tool_calls([("calculator", {"expression": "6 * 7"})]))
    upstream.script_router(Reply.error(500, "the router is down"))
    failed = await post(two_users, "kitchen", "what is 6 * 7?")
    assert isinstance(failed, httpx.Response) and failed.status_code == 502, failed.text
    assert failed.json()["error"]["code"] == "upstream_error"

    upstream.script(Reply.text("42."))
    answered = await post(two_users, "kitchen", "so?")
    assert isinstance(answered, httpx.Response) and answered.status_code == 200, answered.text
    rows = (await two_users.client.get("/v1/conversations/kitchen/messages", headers=ALICE)).json()
    roles = [(row["role"], row["content"]) for row in rows["data"]]
    assert roles == [
        ("user", "what is 6 * 7?"),
        ("assistant", ""),
        ("tool", "42"),
        ("user", "so?"),
        ("assistant", "42."),
    ]
    assert rows["data"][1]["tool_calls"][0]["function"]["name"] == "calculator"
    prompt = [m for m in upstream.router_requests[-1]["messages"] if m["role"] != "system"]
    assert [m["role"] for m in prompt] == ["user", "assistant", "tool", "user"]


async def test_an_unknown_confirmation_is_404(two_users: Stack) -> None:
    await conversation(two_users)
    missing = await resume(
        two_users, "kitchen", {"confirmation_id": "conf_nope", "decision": "approve"}
    )
    assert isinstance(missing, httpx.Response)
    assert (missing.status_code, missing.json()["error"]["code"]) == (
        404,
        "confirmation_not_found",
    )


async def test_every_write_of_a_step_waits_and_the_reads_run(
    two_users: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script_router(
        Reply.tool_calls(
            [
                ("calculator", {"expression": "2 + 2"}),
                ("save_note", {"text": "first"}),
                ("save_note", {"text": "second"}),
                ("save_note", {"text": "third"}),
            ]
        )
    )
    await conversation(two_users)
    events = await post(two_users, "kitchen", "do four things", stream=True)
    assert isinstance(events, list)
    proposals = [data for name, data in events if name == "awaiting_confirmation"]
    results = [data for name, data in events if name == "tool_result"]
    assert [r["output"] for r in results] == ["4"], "the read ran at once"
    assert [p["summary"] for p in proposals] == [
        "Remember “first”",
        "Remember “second”",
        "Remember “third”",
    ]

    one = await resume(
        two_users,
        "kitchen",
        {"confirmation_id": proposals[0]["confirmation_id"], "decision": "approve"},
    )
    assert isinstance(one, httpx.Response)
    assert one.json() == {
        "turn_id": None,
        "status": "awaiting_confirmation",
        "messages": [],
        "pending_confirmation": proposals[1],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }
    # Streamed, the same answer reads as a turn that paused reads (no turn ran).
    two = await resume(
        two_users,
        "kitchen",
        {"confirmation_id": proposals[1]["confirmation_id"], "decision": "approve"},
        stream=True,
    )
    assert two == [
        ("awaiting_confirmation", proposals[2]),
        (
            "done",
            {
                "turn_id": None,
                "status": "awaiting_confirmation",
                "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
            },
        ),
    ]
    assert await notes_of(two_users) == [], "nothing runs until every call is decided"
    upstream.script(Reply.text("Done."))
    three = await resume(
        two_users,
        "kitchen",
        {"confirmation_id": proposals[2]["confirmation_id"], "decision": "reject"},
    )
    assert isinstance(three, httpx.Response) and three.json()["status"] == "completed"
    assert await notes_of(two_users) == ["first", "second"]


async def test_paused_turns_hold_no_worker(upstream: ScriptedUpstream) -> None:
    settings = make_settings(upstream, api_keys=keys_for_two(), worker_concurrency=2)
    async with run_stack(settings) as stack:
        for n in range(5):  # more pauses than the worker runs turns at once
            await conversation(stack, f"room-{n}")
            await pause(stack, upstream, f"room-{n}")
        upstream.script(Reply.text("still here"))
        fresh = await stack.client.post(
            "/v1/chat/completions",
            json={"model": "bernard-v1", "messages": [{"role": "user", "content": "hello"}]},
            headers=ALICE,
        )
        assert fresh.status_code == 200
        assert fresh.json()["choices"][0]["message"]["content"] == "still here"


async def test_a_chat_completion_pauses_too_and_resumes_through_its_conversation(
    two_users: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script_router(Reply.tool_calls([NOTE]))
    frames = await collect(
        two_users.client,
        "POST",
        "/v1/chat/completions",
        json={
            "model": "bernard-v1",
            "stream": True,
            "messages": [{"role": "user", "content": "remember the door code"}],
        },
        headers=ALICE,
    )
    pauses = [
        f.bernard for f in frames if f.bernard and f.bernard["type"] == "awaiting_confirmation"
    ]
    finish = [c["finish_reason"] for f in frames if not f.done for c in f.json.get("choices", [])]
    assert len(pauses) == 1 and finish[-1] == "stop"
    turn_id = frames[0].json["id"].removeprefix("chatcmpl-")
    turn = (await two_users.client.get(f"/v1/turns/{turn_id}", headers=ALICE)).json()
    assert turn["status"] == "awaiting_confirmation"
    conversation_id = turn["conversation_id"]
    upstream.script(Reply.text("Saved."))
    resumed = await resume(
        two_users,
        conversation_id,
        {"confirmation_id": pauses[0]["confirmation_id"], "decision": "approve"},
    )
    assert isinstance(resumed, httpx.Response) and resumed.status_code == 200
    assert await notes_of(two_users) == ["the door code is 1234"]


async def test_a_turn_streams_again_from_its_events_in_its_own_encoding(
    two_users: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.text(["one", " two"]))
    await conversation(two_users)
    answered = await post(two_users, "kitchen", "count")
    assert isinstance(answered, httpx.Response)
    turn_id = answered.json()["turn_id"]
    replayed = await named(two_users, "GET", f"/v1/turns/{turn_id}/events")
    assert kinds(replayed) == ["message", "text_delta", "message", "done"]
    assert text(replayed) == "one two"
    await two_users.redis.delete(keys.events(turn_id))
    compacted = await named(two_users, "GET", f"/v1/turns/{turn_id}/events")
    assert [name for name, _ in compacted] == ["done"]
    assert compacted[0][1]["status"] == "completed"


async def test_a_decision_resumes_on_another_api_process_and_worker(
    upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    async with private_redis(tmp_path / "redis") as server:
        settings = make_settings(upstream, redis_url=server.url, api_keys=keys_for_two())
        async with ProcessGroup(tmp_path / "logs") as procs:
            first_worker = await procs.worker(settings, name="first-worker")
            first_api = await procs.api(settings, name="first-api")
            async with httpx.AsyncClient(base_url=first_api.base_url or "", timeout=30) as one:
                await one.post("/v1/conversations", json={"id": "hall"}, headers=ALICE)
                upstream.script_router(Reply.tool_calls([NOTE]))
                paused = await one.post(
                    "/v1/conversations/hall/messages",
                    json={"content": "remember the door code"},
                    headers=ALICE,
                )
            confirmation = paused.json()["pending_confirmation"]["confirmation_id"]
            first_worker.kill()
            first_api.kill()
            await procs.worker(settings, name="second-worker")
            second_api = await procs.api(settings, name="second-api")
            upstream.script(Reply.text("Saved."))
            async with httpx.AsyncClient(base_url=second_api.base_url or "", timeout=30) as two:
                resumed = await two.post(
                    "/v1/conversations/hall/resume",
                    json={"confirmation_id": confirmation, "decision": "approve"},
                    headers=ALICE,
                )
        assert resumed.status_code == 200, resumed.text
        body = resumed.json()
        assert body["status"] == "completed"
        assert [r["role"] for r in body["messages"]] == ["tool", "assistant"]
        assert body["messages"][0]["content"] == "Saved: the door code is 1234"


async def test_a_decision_whose_turn_cannot_start_can_be_made_again(
    upstream: ScriptedUpstream,
) -> None:
    """At the user's limit of running turns the decision's turn is refused (429): the
    decision is taken back, not left `approved` with nothing behind it."""
    settings = make_settings(upstream, api_keys=keys_for_two(), max_active_turns_per_user=1)
    async with run_stack(settings) as two_users:
        await conversation(two_users)
        confirmation = await pause(two_users, upstream)
        gate = upstream.script(Reply.text(["one", " two"], block_after_first=True))
        body = {
            "model": "bernard-v1",
            "stream": True,
            "messages": [{"role": "user", "content": "x"}],
        }
        async with two_users.client.stream(
            "POST", "/v1/chat/completions", json=body, headers=ALICE
        ) as busy:
            await gate.wait_blocked()
            decision = {"confirmation_id": confirmation, "decision": "approve"}
            refused = await resume(two_users, "kitchen", decision)
            assert isinstance(refused, httpx.Response)
            assert refused.status_code == 429, refused.text
            waiting = (
                await two_users.client.get("/v1/conversations/kitchen", headers=ALICE)
            ).json()
            assert waiting["status"] == "awaiting_confirmation"
            gate.release()
            await busy.aread()
        upstream.script(Reply.text("Saved."))
        again = await resume(two_users, "kitchen", decision)
        assert isinstance(again, httpx.Response)
        assert again.status_code == 200, again.text
        assert again.json()["status"] == "completed"
        assert await notes_of(two_users) == ["the door code is 1234"]


async def test_a_waiting_conversation_shows_the_proposal_and_refuses_what_answers_nothing(
    two_users: Stack, upstream: ScriptedUpstream
) -> None:
    """While a tool call waits, the conversation shows the whole proposal, and a message
    with no words to answer it (tests/test_answers_in_words.py has those), whether posted
    to it or sent as a chat completion continuing it, is a 409 that says how to decide."""
    await conversation(two_users)
    upstream.script_router(Reply.tool_calls([NOTE]))
    events = await post(two_users, "kitchen", "remember the door code", stream=True)
    assert isinstance(events, list)
    proposal = next(data for name, data in events if name == "awaiting_confirmation")
    shown = (await two_users.client.get("/v1/conversations/kitchen", headers=ALICE)).json()
    assert shown["pending_confirmation"] == proposal
    listed = (await two_users.client.get("/v1/conversations", headers=ALICE)).json()["data"]
    assert [c["pending_confirmation"] for c in listed if c["id"] == "kitchen"] == [proposal]

    posted = await post(two_users, "kitchen", "   ")
    chat = await two_users.client.post(
        "/v1/chat/completions",
        json={
            "model": "bernard-v1",
            "conversation_id": "kitchen",
            "messages": [{"role": "user", "content": "  "}],
        },
        headers=ALICE,
    )
    for refused in (posted, chat):
        assert isinstance(refused, httpx.Response)
        error = refused.json()["error"]
        assert (refused.status_code, error["code"], error["param"]) == (
            409,
            "conversation_busy",
            "conversation_id",
        )
        assert error["message"] == (
            "the conversation is awaiting confirmation: answer the pending tool call in words "
            "(a message saying yes, no, or what to do instead) or decide it with "
            "POST .../resume"
        )
    assert (await notes_of(two_users)) == []


async def test_a_conversation_whose_turn_no_worker_took_yet_is_running(
    upstream: ScriptedUpstream,
) -> None:
    settings = make_settings(upstream, api_keys=keys_for_two())
    async with run_stack(settings, worker=False) as two_users:
        await conversation(two_users)
        queued = asyncio.create_task(post(two_users, "kitchen", "hello?"))
        meta = keys.conversation(alice(two_users), "kitchen")
        try:
            await wait_for(lambda: two_users.redis.hget(meta, "active_turn"), timeout_s=10)
            shown = (await two_users.client.get("/v1/conversations/kitchen", headers=ALICE)).json()
            assert shown["status"] == "running"
            second = await post(two_users, "kitchen", "anyone?", strategy="reject")
            assert isinstance(second, httpx.Response)
            error = second.json()["error"]
            assert (second.status_code, error["code"]) == (409, "conversation_busy")
            assert "a turn is running on it" in error["message"]
        finally:
            queued.cancel()


async def test_named_events_carry_their_stream_ids_and_resume_from_any_of_them(
    two_users: Stack, upstream: ScriptedUpstream
) -> None:
    upstream.script(Reply.text(["one", " two", " three"]))
    await conversation(two_users)
    url = "/v1/conversations/kitchen/messages"
    async with two_users.client.stream(
        "POST", url, json={"content": "count"}, headers={**ALICE, **SSE}
    ) as response:
        turn_id = response.headers["x-bernard-turn-id"]
        events = [sse async for sse in EventSource(response).aiter_sse()]
    ids = [sse.id for sse in events]
    assert all(ids) and len(set(ids)) == len(ids), ids
    for k in range(len(events)):
        async with two_users.client.stream(
            "GET",
            f"/v1/turns/{turn_id}/events",
            headers={**ALICE, **SSE, "Last-Event-ID": ids[k]},
        ) as rest:
            resumed = [(sse.id, sse.event, sse.data) async for sse in EventSource(rest).aiter_sse()]
        assert resumed == [(sse.id, sse.event, sse.data) for sse in events[k + 1 :]]


async def test_a_conversation_a_chat_completion_starts_is_busy_while_its_turn_runs(
    two_users: Stack, upstream: ScriptedUpstream
) -> None:
    gate = upstream.script(Reply.text(["one", " two"], block_after_first=True))

    def chat(stream: bool) -> dict[str, Any]:
        message = {"role": "user", "content": "hi"}
        return {
            "model": "bernard-v1",
            "conversation_id": "hall",
            "stream": stream,
            "messages": [message],
            "multitask_strategy": "reject",
        }

    async with two_users.client.stream(
        "POST", "/v1/chat/completions", json=chat(True), headers=ALICE
    ) as first:
        await gate.wait_blocked()
        second = await two_users.client.post(
            "/v1/chat/completions", json=chat(False), headers=ALICE
        )
        assert (second.status_code, second.json()["error"]["code"]) == (409, "conversation_busy")
        gate.release()
        await first.aread()


async def test_a_message_sent_again_after_a_cancel_is_stored_again(
    two_users: Stack, upstream: ScriptedUpstream
) -> None:
    await conversation(two_users, "retry")
    held = upstream.script(Reply.text("Never mind.", block_after=0))
    first = asyncio.create_task(post(two_users, "retry", "hello there"))
    await held.wait_blocked()
    running = (await two_users.client.get("/v1/conversations/retry", headers=ALICE)).json()
    cancelled = await two_users.client.post(f"/v1/turns/{running['turn_id']}/cancel", headers=ALICE)
    stopped = await first
    held.release()
    upstream.script(Reply.text("Hello again."))
    again = await post(two_users, "retry", "hello there")
    rows = (await two_users.client.get("/v1/conversations/retry/messages", headers=ALICE)).json()

    assert cancelled.status_code == 200, cancelled.text
    assert isinstance(stopped, httpx.Response), stopped
    assert stopped.status_code == 409 and stopped.json()["error"]["code"] == "turn_cancelled"
    assert isinstance(again, httpx.Response) and again.json()["status"] == "completed"
    assert [(row["role"], row["content"], row.get("stopped")) for row in rows["data"]] == [
        ("user", "hello there", None),
        # Stopped before it said anything: the history says so.
        ("assistant", "", "turn_cancelled"),
        ("user", "hello there", None),
        ("assistant", "Hello again.", None),
    ]
