"""Confirmations in words, through real HTTP, Redis, worker and upstream: a turn that pauses
says its question as text in every encoding, and the next user message in that
conversation, from any API, answers it. A plain "yes" or "no" decides at once (no model
call reads it); other words are read by the router with the waiting calls in front of it. A
client that sends no conversation id is known by the history it resends; another history,
or another user's, approves nothing. The notes tool (`save_note`) is the call that waits.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from shared.notes import NoteStore
from tests.support.sse import named_events
from tests.support.stack import Stack, make_settings, run_stack
from tests.support.upstream import Reply, ScriptedUpstream, tool_names
from tests.support.users import ALICE, BOB, keys_for_two

SSE = {"Accept": "text/event-stream"}
DOOR = ("save_note", {"text": "the door code is 1234"})
ASKED = "Shall I remember “the door code is 1234”?"
TWO = [("save_note", {"text": "first"}), ("save_note", {"text": "second"})]
ASKED_TWO = "Shall I remember “first”? Shall I remember “second”?"


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
    two_users: Stack, upstream: ScriptedUpstream
) -> None:
    created = await two_users.client.post(
        "/v1/conversations", json={"id": "kitchen"}, headers=ALICE
    )
    assert created.status_code == 201
    upstream.script_router(Reply.tool_calls(TWO))
    events = await said(two_users, "kitchen", "remember these")

    assert text(events) == ASKED_TWO
    # The structured events stay as they were, after the words.
    names = [name for name, _ in events]
    assert names.index("text_delta") < names.index("awaiting_confirmation")
    assert [p["summary"] for p in of(events, "awaiting_confirmation")] == [
        "Remember “first”",
        "Remember “second”",
    ]
    assert (await rows(two_users, "kitchen")) == [
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
    two_users: Stack, upstream: ScriptedUpstream, accept_language: str, question: str
) -> None:
    await two_users.client.post("/v1/conversations", json={"id": "salon"}, headers=ALICE)
    upstream.script_router(Reply.tool_calls([DOOR]))
    events = await said(two_users, "salon", "note le code", {"Accept-Language": accept_language})
    assert text(events) == question


async def test_a_chat_completion_streams_the_question_as_its_content(
    two_users: Stack, upstream: ScriptedUpstream
) -> None:
    client = two_users.openai("key-alice")
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
    two_users: Stack, upstream: ScriptedUpstream
) -> None:
    client = two_users.openai("key-alice")
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


# -- the answer in words -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "saved", "told"),
    [
        ("yes", ["first", "second"], ["Saved: first", "Saved: second"]),
        ("Yes, please!", ["first", "second"], ["Saved: first", "Saved: second"]),
        ("D’accord !", ["first", "second"], ["Saved: first", "Saved: second"]),
        (
            "No thanks.",
            [],
            [
                "The user declined: save_note was not run.",
                "The user declined: save_note was not run.",
            ],
        ),
    ],
)
async def test_a_plain_answer_decides_every_waiting_call_before_any_model_reads_it(
    two_users: Stack, upstream: ScriptedUpstream, answer: str, saved: list[str], told: list[str]
) -> None:
    await paused(two_users, upstream, TWO)
    asked = len(upstream.router_requests)
    upstream.script(Reply.text("Done as you said."))

    events = await said(two_users, "kitchen", answer)

    assert of(events, "done")[0]["status"] == "completed"
    assert text(events) == "Done as you said."
    assert await notes_of(two_users) == saved
    # The first model call after the answer already reads what was decided, then the words.
    (router,) = upstream.router_requests[asked:]
    assert [(m["role"], m["content"]) for m in router["messages"][-3:]] == [
        ("tool", told[0]),
        ("tool", told[1]),
        ("user", answer),
    ]
    assert "approve_pending" not in tool_names(router)
    assert (await rows(two_users, "kitchen"))[1:] == [
        ("assistant", ASKED_TWO),
        ("tool", told[0]),
        ("tool", told[1]),
        ("user", answer),
        ("assistant", "Done as you said."),
    ]
    again = await two_users.client.get("/v1/conversations/kitchen", headers=ALICE)
    assert (again.json()["status"], again.json()["pending_confirmation"]) == ("idle", None)


async def test_other_words_go_to_the_router_with_the_waiting_calls_and_it_approves_some(
    two_users: Stack, upstream: ScriptedUpstream
) -> None:
    first, second = await paused(two_users, upstream, TWO)
    asked = len(upstream.router_requests)
    upstream.script_router(
        Reply.tool_calls([("approve_pending", {"confirmation_ids": [first["confirmation_id"]]})])
    )
    upstream.script(Reply.text("Saved the first one only."))

    events = await said(two_users, "kitchen", "only the first one")

    assert text(events) == "Saved the first one only."
    assert await notes_of(two_users) == ["first"]
    # One router call reads and decides; the answer is then written on what was decided.
    (reading,) = upstream.router_requests[asked:]
    answering = upstream.requests[-1]
    assert {"approve_pending", "reject_pending"} <= set(tool_names(reading))
    notes = reading["messages"][-3:-1]
    assert [m["role"] for m in notes] == ["tool", "tool"]
    assert first["confirmation_id"] in notes[0]["content"]
    assert "Remember “second”" in notes[1]["content"]
    assert reading["messages"][-1] == {"role": "user", "content": "only the first one"}
    # Once decided, the calls are answered as they were decided, and nothing is offered.
    assert tool_names(answering) == []
    assert [(m["role"], m["content"]) for m in answering["messages"][-3:]] == [
        ("tool", "Saved: first"),
        ("tool", "The user declined: save_note was not run."),
        ("user", "only the first one"),
    ]
    results = [(r["tool_call_id"], r["output"]) for r in of(events, "tool_result")]
    assert results == [
        (first["tool_call"]["id"], "Saved: first"),
        (second["tool_call"]["id"], "The user declined: save_note was not run."),
    ]


async def test_words_that_reject_and_ask_for_something_else_are_asked_about_again(
    two_users: Stack, upstream: ScriptedUpstream
) -> None:
    (door,) = await paused(two_users, upstream, [DOOR])
    upstream.script_router(
        Reply.tool_calls(
            [
                ("reject_pending", {"confirmation_ids": [door["confirmation_id"]]}),
                ("save_note", {"text": "the door code is 9999"}),
            ]
        )
    )

    events = await said(two_users, "kitchen", "no, it is 9999")

    assert of(events, "done")[0]["status"] == "awaiting_confirmation"
    assert text(events) == "Shall I remember “the door code is 9999”?"
    (again,) = of(events, "awaiting_confirmation")
    assert await notes_of(two_users) == []

    upstream.script(Reply.text("Saved 9999."))
    done = await said(two_users, "kitchen", "yes")
    assert text(done) == "Saved 9999."
    assert await notes_of(two_users) == ["the door code is 9999"]
    assert (await rows(two_users, "kitchen"))[1:] == [
        ("assistant", ASKED),
        ("tool", "The user declined: save_note was not run."),
        ("user", "no, it is 9999"),
        ("assistant", "Shall I remember “the door code is 9999”?"),
        ("tool", "Saved: the door code is 9999"),
        ("user", "yes"),
        ("assistant", "Saved 9999."),
    ]
    assert again["tool_call"]["name"] == "save_note"


async def test_words_the_router_decides_nothing_on_run_nothing(
    two_users: Stack, upstream: ScriptedUpstream
) -> None:
    await paused(two_users, upstream, [DOOR])
    upstream.script(Reply.text("It is sunny."))
    events = await said(two_users, "kitchen", "what is the weather like?")
    assert text(events) == "It is sunny."
    assert await notes_of(two_users) == []
    assert (await rows(two_users, "kitchen"))[2:] == [
        ("tool", "The user declined: save_note was not run."),
        ("user", "what is the weather like?"),
        ("assistant", "It is sunny."),
    ]


# -- a client that resends its history, without a conversation id -------------------------------


def chat_history(*turns: str) -> list[dict[str, str]]:
    """user, assistant, user, ... as a chat client resends them."""
    roles = ["user", "assistant"]
    return [{"role": roles[i % 2], "content": said} for i, said in enumerate(turns)]


async def test_a_plain_sdk_that_resends_its_history_answers_yes_and_it_runs(
    two_users: Stack, upstream: ScriptedUpstream
) -> None:
    client = two_users.openai("key-alice")
    upstream.script_router(Reply.tool_calls([DOOR]))
    first = await client.chat.completions.create(
        model="bernard-v1", messages=chat_history("remember the door code")
    )
    asked = first.choices[0].message.content
    assert asked == ASKED
    conversation = first.model_extra["bernard"]["conversation_id"]  # type: ignore[index]

    upstream.script(Reply.text("Saved."))
    stream = await client.chat.completions.create(
        model="bernard-v1",
        messages=chat_history("remember the door code", asked, "yes"),
        stream=True,
    )
    content = "".join(
        [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
    )

    assert content == "Saved."
    assert await notes_of(two_users) == ["the door code is 1234"]
    assert (await rows(two_users, conversation)) == [
        ("user", "remember the door code"),
        ("assistant", ASKED),
        ("tool", "Saved: the door code is 1234"),
        ("user", "yes"),
        ("assistant", "Saved."),
    ]


async def test_a_history_that_differs_or_another_users_approves_nothing(
    two_users: Stack, upstream: ScriptedUpstream
) -> None:
    alice = two_users.openai("key-alice")
    upstream.script_router(Reply.tool_calls([DOOR]))
    first = await alice.chat.completions.create(
        model="bernard-v1", messages=chat_history("remember the door code")
    )
    conversation = first.model_extra["bernard"]["conversation_id"]  # type: ignore[index]

    others = [
        (alice, chat_history("remember the door code", "Shall I remember it?", "yes")),
        (alice, chat_history("remember the gate code", ASKED, "yes")),
        (
            alice,
            [
                {"role": "system", "content": "Be brief."},
                *chat_history("remember the door code", ASKED, "yes"),
            ],
        ),
        (two_users.openai("key-bob"), chat_history("remember the door code", ASKED, "yes")),
    ]
    for client, history in others:
        upstream.script(Reply.text("Yes to what?"))
        answer = await client.chat.completions.create(model="bernard-v1", messages=history)
        assert answer.choices[0].message.content == "Yes to what?"
        elsewhere = answer.model_extra["bernard"]["conversation_id"]  # type: ignore[index]
        assert elsewhere != conversation
    assert await notes_of(two_users) == []
    assert await notes_of(two_users, "key-bob") == []
    assert await status(two_users, conversation) == "awaiting_confirmation"

    # The history as it was asked still finds it.
    upstream.script(Reply.text("Saved."))
    answer = await alice.chat.completions.create(
        model="bernard-v1", messages=chat_history("remember the door code", ASKED, "yes")
    )
    assert answer.model_extra["bernard"]["conversation_id"] == conversation  # type: ignore[index]
    assert await notes_of(two_users) == ["the door code is 1234"]


async def test_a_chat_completion_naming_its_conversation_answers_in_words_too(
    two_users: Stack, upstream: ScriptedUpstream
) -> None:
    await paused(two_users, upstream, [DOOR])
    upstream.script(Reply.text("Left it."))
    answer = await two_users.client.post(
        "/v1/chat/completions",
        json={"model": "bernard-v1", "messages": [{"role": "user", "content": "nope"}]},
        headers={**ALICE, "X-Bernard-Conversation-Id": "kitchen"},
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == "Left it."
    assert await notes_of(two_users) == []
    assert (await rows(two_users, "kitchen"))[2:4] == [
        ("tool", "The user declined: save_note was not run."),
        ("user", "nope"),
    ]


# -- the Responses API ------------------------------------------------------------------------


async def test_a_response_continuing_one_that_waits_answers_it_in_words(
    two_users: Stack, upstream: ScriptedUpstream
) -> None:
    client = two_users.openai("key-alice")
    upstream.script_router(Reply.tool_calls([DOOR]))
    asked = await client.responses.create(model="bernard-v1", input="remember the door code")
    (request,) = [item for item in asked.output if item.type == "mcp_approval_request"]

    upstream.script(Reply.text("Saved."))
    answered = await client.responses.create(
        model="bernard-v1", input="Yes.", previous_response_id=asked.id
    )

    assert answered.output_text == "Saved."
    assert await notes_of(two_users) == ["the door code is 1234"]
    (ran,) = [item for item in answered.output if item.type == "mcp_call"]
    assert (ran.output, ran.approval_request_id) == ("Saved: the door code is 1234", request.id)
    items = await client.responses.input_items.list(answered.id)
    assert [item.content[0].text for item in items.data] == ["Yes."]  # type: ignore[union-attr]


async def test_two_answers_at_once_decide_once(
    two_users: Stack, upstream: ScriptedUpstream
) -> None:
    """A "yes" and a "no" sent together: one answers, the other finds nothing waiting and is
    a message like any (or 409 while the first's turn runs); the call runs at most once."""
    await paused(two_users, upstream, [DOOR])
    upstream.responder = lambda body: Reply.text("Understood.")
    url = "/v1/conversations/kitchen/messages"
    replies = await asyncio.gather(
        two_users.client.post(url, json={"content": "yes"}, headers=ALICE),
        two_users.client.post(url, json={"content": "no"}, headers=ALICE),
    )
    codes = sorted(r.status_code for r in replies)
    assert codes in ([200, 200], [200, 409]), [r.text for r in replies]
    notes = await notes_of(two_users)
    told = [content for role, content in await rows(two_users, "kitchen") if role == "tool"]
    assert len(told) == 1
    assert notes == (["the door code is 1234"] if told[0].startswith("Saved") else [])


async def test_an_answer_to_nothing_is_a_message_like_any(
    two_users: Stack, upstream: ScriptedUpstream
) -> None:
    created = await two_users.client.post(
        "/v1/conversations", json={"id": "kitchen"}, headers=ALICE
    )
    assert created.status_code == 201
    upstream.script(Reply.text("Yes to what?"))
    events = await said(two_users, "kitchen", "yes")
    assert text(events) == "Yes to what?"
    assert await notes_of(two_users) == []


async def test_a_waiting_call_is_answered_only_in_its_owners_conversation(
    two_users: Stack, upstream: ScriptedUpstream
) -> None:
    await paused(two_users, upstream, [DOOR])
    upstream.script(Reply.text("Hello Bob."))
    bobs = await two_users.client.post(
        "/v1/conversations/kitchen/messages", json={"content": "yes"}, headers=BOB
    )
    assert isinstance(bobs, httpx.Response) and bobs.status_code == 404
    assert await notes_of(two_users) == []
    assert await status(two_users, "kitchen") == "awaiting_confirmation"


# -- one model for both roles ---------------------------------------------------------------------


@pytest.fixture
async def one_model(upstream: ScriptedUpstream) -> AsyncIterator[Stack]:
    settings = make_settings(
        upstream, api_keys=keys_for_two(), router_model="one-model", response_model="one-model"
    )
    async with run_stack(settings) as stack:
        yield stack


async def test_with_one_model_the_question_follows_what_the_model_said(
    one_model: Stack, upstream: ScriptedUpstream
) -> None:
    await one_model.client.post("/v1/conversations", json={"id": "kitchen"}, headers=ALICE)
    upstream.script(Reply.tool_calls([DOOR], content="I can note that."))
    events = await said(one_model, "kitchen", "remember the door code")
    assert text(events) == f"I can note that.\n\n{ASKED}"
    assert (await rows(one_model, "kitchen"))[1] == ("assistant", f"I can note that.\n\n{ASKED}")

    # The one model reads the words with the waiting call in front of it, and approves.
    (door,) = of(events, "awaiting_confirmation")
    upstream.script(
        Reply.tool_calls([("approve_pending", {"confirmation_ids": [door["confirmation_id"]]})])
    )
    upstream.script(Reply.text("Noted."))
    answered = await said(one_model, "kitchen", "yes but quickly")
    assert text(answered) == "Noted."
    assert await notes_of(one_model) == ["the door code is 1234"]
    reading, answering = upstream.requests[-2:]
    assert "approve_pending" in tool_names(reading)
    assert reading["messages"][-1] == {"role": "user", "content": "yes but quickly"}
    assert [(m["role"], m["content"]) for m in answering["messages"][-2:]] == [
        ("tool", "Saved: the door code is 1234"),
        ("user", "yes but quickly"),
    ]
