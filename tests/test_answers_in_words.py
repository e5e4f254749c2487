"""Confirmations in words, through real HTTP, Redis, worker and upstream: a turn that pauses
says its question as text in every encoding. The notes tool (`save_note`) is the call that
waits.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from shared.notes import NoteStore
from tests.conftest import Stack, make_settings, run_stack
from tests.sse import named_events
from tests.upstream import Reply, ScriptedUpstream
from tests.users import ALICE, keys_for_two

SSE = {"Accept": "text/event-stream"}
DOOR = ("save_note", {"text": "the door code is 1234"})
ASKED = "Shall I remember “the door code is 1234”?"
TWO = [("save_note", {"text": "first"}), ("save_note", {"text": "second"})]
ASKED_TWO = "Shall I remember “first”? Shall I remember “second”?"


@pytest.fixture
async def users(upstream: ScriptedUpstream) -> AsyncIterator[Stack]:
    async with run_stack(make_settings(upstream, api_keys=keys_for_two())) as stack:
        yield stack


async def notes_of(stack: Stack, key: str = "key-alice") -> list[str]:
    store = NoteStore(stack.redis, stack.settings.api_key_users()[key], retention_s=60)
    return sorted(note.text for note in await store.all())


async def said(
    stack: Stack, conversation_id: str, content: str, headers: dict[str, str] | None = None
) -> list[tuple[str, Any]]:
    """A message posted to a conversation: its turn's named events."""
    url = f"/v1/conversations/{conversation_id}/messages"
    headers = {**ALICE, **SSE, **(headers or {})}
    async with stack.client.stream("POST", url, json={"content": content}, headers=headers) as r:
        assert r.status_code == 200, await r.aread()
        return await named_events(r)


def of(events: list[tuple[str, Any]], name: str) -> list[Any]:
    return [data for event, data in events if event == name]


def text(events: list[tuple[str, Any]]) -> str:
    return "".join(data["text"] for data in of(events, "text_delta"))


async def rows(stack: Stack, conversation_id: str) -> list[tuple[str, Any]]:
    got = await stack.client.get(f"/v1/conversations/{conversation_id}/messages", headers=ALICE)
    return [(row["role"], row["content"]) for row in got.json()["data"]]


async def status(stack: Stack, conversation_id: str) -> str:
    got = await stack.client.get(f"/v1/conversations/{conversation_id}", headers=ALICE)
    return str(got.json()["status"])


async def paused(stack: Stack, upstream: ScriptedUpstream, calls: list[Any]) -> list[Any]:
    """The kitchen conversation, paused on `calls`; their proposals."""
    created = await stack.client.post("/v1/conversations", json={"id": "kitchen"}, headers=ALICE)
    assert created.status_code == 201, created.text
    upstream.script_router(Reply.tool_calls(calls))
    events = await said(stack, "kitchen", "remember these")
    assert of(events, "done")[0]["status"] == "awaiting_confirmation"
    return of(events, "awaiting_confirmation")


# -- the question in words ---------------------------------------------------------------------


async def test_a_pause_says_its_question_one_sentence_a_call_and_the_history_keeps_it(
    users: Stack, upstream: ScriptedUpstream
) -> None:
    created = await users.client.post("/v1/conversations", json={"id": "kitchen"}, headers=ALICE)
    assert created.status_code == 201
    upstream.script_router(Reply.tool_calls(TWO))
    events = await said(users, "kitchen", "remember these")

    assert text(events) == ASKED_TWO
    # The structured events stay as they were, after the words.
    names = [name for name, _ in events]
    assert names.index("text_delta") < names.index("awaiting_confirmation")
    assert [p["summary"] for p in of(events, "awaiting_confirmation")] == [
        "Remember “first”",
        "Remember “second”",
    ]
    assert (await rows(users, "kitchen")) == [
        ("user", "remember these"),
        ("assistant", ASKED_TWO),
    ]


@pytest.mark.parametrize(
    ("accept_language", "question"),
    [
        ("fr-CH, fr;q=0.9, en;q=0.8", "Remember “the door code is 1234” : je le fais ?"),
        ("de", "Remember “the door code is 1234” – soll ich das tun?"),
        ("pl, en;q=0.5", ASKED),
        ("pl", ASKED),
    ],
)
async def test_the_question_is_in_the_users_language_where_bernard_knows_it(
    users: Stack, upstream: ScriptedUpstream, accept_language: str, question: str
) -> None:
    await users.client.post("/v1/conversations", json={"id": "salon"}, headers=ALICE)
    upstream.script_router(Reply.tool_calls([DOOR]))
    events = await said(users, "salon", "note le code", {"Accept-Language": accept_language})
    assert text(events) == question


async def test_a_chat_completion_streams_the_question_as_its_content(
    users: Stack, upstream: ScriptedUpstream
) -> None:
    client = users.openai("key-alice")
    upstream.script_router(Reply.tool_calls([DOOR]))
    stream = await client.chat.completions.create(
        model="bernard-v1",
        messages=[{"role": "user", "content": "remember the door code"}],
        stream=True,
    )
    content = "".join(
        [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
    )
    assert content == ASKED

    upstream.script_router(Reply.tool_calls([DOOR]))
    whole = await client.chat.completions.create(
        model="bernard-v1", messages=[{"role": "user", "content": "remember the door code"}]
    )
    assert whole.choices[0].message.content == ASKED
    pending = whole.model_extra["bernard"]["pending_confirmations"]  # type: ignore[index]
    assert [p["summary"] for p in pending] == ["Remember “the door code is 1234”"]


async def test_a_response_says_the_question_as_output_text_beside_its_approval_request(
    users: Stack, upstream: ScriptedUpstream
) -> None:
    client = users.openai("key-alice")
    upstream.script_router(Reply.tool_calls([DOOR]))
    response = await client.responses.create(model="bernard-v1", input="remember the door code")
    assert response.output_text == ASKED
    assert [item.type for item in response.output] == ["message", "mcp_approval_request"]

    upstream.script_router(Reply.tool_calls([DOOR]))
    stream = await client.responses.create(
        model="bernard-v1", input="remember the door code", stream=True
    )
    deltas = [event.delta async for event in stream if event.type == "response.output_text.delta"]
    assert "".join(deltas) == ASKED
