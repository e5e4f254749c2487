"""`store: false` on the Responses API (api/routes/responses.py) through the official
`openai` SDK: a response runs and answers as a stored one does, then is nowhere: a 404 by
id, for its input items and as a `previous_response_id`, no conversation of its user holds
it, their storage usage is unchanged and its turn is forgotten."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest

from api.encodings.responses import turn_id_of
from shared import budgets, keys
from shared.notes import NoteStore
from tests.support.client_tools import WEATHER
from tests.support.stack import Stack, make_settings, run_stack
from tests.support.upstream import Reply, ScriptedUpstream


@dataclass(frozen=True)
class Own:
    """A stack and a user of the test's own: their conversations and usage are its alone."""

    stack: Stack
    user: str
    key: str

    @property
    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.key}"}

    def openai(self) -> openai.AsyncOpenAI:
        return self.stack.openai(self.key)

    async def conversations(self) -> list[str]:
        listed = await self.stack.client.get("/v1/conversations", headers=self.headers)
        assert listed.status_code == 200, listed.text
        return [conversation["id"] for conversation in listed.json()["data"]]

    async def usage(self) -> budgets.Usage:
        retention_s = self.stack.settings.conversation_retention_s
        return await budgets.read_usage(self.stack.redis, self.user, retention_s=retention_s)


@contextlib.asynccontextmanager
async def own_stack(upstream: ScriptedUpstream, **overrides: Any) -> AsyncIterator[Own]:
    user, key = f"unstored-{uuid.uuid4().hex[:8]}", f"key-{uuid.uuid4().hex[:8]}"
    settings = make_settings(upstream, api_keys=f"{key}:{user}", **overrides)
    async with run_stack(settings) as running:
        yield Own(running, user, key)


@pytest.fixture
async def own(upstream: ScriptedUpstream) -> AsyncIterator[Own]:
    async with own_stack(upstream) as running:
        yield running


async def assert_nothing_kept(own: Own, response_id: str) -> None:
    """The unstored response is a 404 everywhere, and its turn is forgotten."""
    client, stack = own.openai(), own.stack
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(response_id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.input_items.list(response_id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.create(
            model="bernard-v1", input="And?", previous_response_id=response_id
        )
    turn_id = turn_id_of(response_id)
    assert turn_id is not None
    assert await stack.redis.hget(keys.turn(turn_id), "forgotten") == b"1"
    assert await stack.redis.hexists(keys.turn(turn_id), "request") == 0
    assert await stack.redis.zscore(keys.turns(own.user), turn_id) is None


async def test_an_unstored_response_answers_and_is_kept_nowhere(
    own: Own, upstream: ScriptedUpstream
) -> None:
    client = own.openai()
    before = await own.usage()
    upstream.script(Reply.text("Plain answer.", usage=(3, 2)))
    response = await client.responses.create(model="bernard-v1", input="hello", store=False)
    assert response.status == "completed" and response.output_text == "Plain answer."
    assert response.store is False and response.conversation is None
    assert response.usage is not None and response.usage.total_tokens == 5
    assert upstream.requests[-1]["messages"][-1] == {"role": "user", "content": "hello"}
    await assert_nothing_kept(own, response.id)
    assert await own.conversations() == []
    assert await own.usage() == before


async def test_an_unstored_response_streams_and_is_kept_nowhere(
    own: Own, upstream: ScriptedUpstream
) -> None:
    client = own.openai()
    before = await own.usage()
    gate = upstream.script(Reply.text(["Bonjour", " à", " tous"], block_after=1))
    stream = await client.responses.create(
        model="bernard-v1", input="hello", stream=True, store=False
    )
    events = []
    async for event in stream:
        events.append(event)
        if event.type == "response.created":
            await gate.wait_blocked()
            # Not to be found even while it runs (as OpenAI's): nobody may attach to it.
            with pytest.raises(openai.NotFoundError):
                await client.responses.retrieve(event.response.id)
            turn_id = turn_id_of(event.response.id)
            turn = await own.stack.client.get(f"/v1/turns/{turn_id}", headers=own.headers)
            assert turn.status_code == 404, turn.text
            listed = await own.stack.client.get("/v1/turns", headers=own.headers)
            assert turn_id not in [t["id"] for t in listed.json()["data"]]
            gate.release()
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == "Bonjour à tous" and final.store is False
    await assert_nothing_kept(own, final.id)
    assert await own.conversations() == []
    assert await own.usage() == before


async def test_a_function_tool_round_trip_by_resending_the_items(
    own: Own, upstream: ScriptedUpstream
) -> None:
    client = own.openai()
    before = await own.usage()
    upstream.script_router(Reply.tool_calls([("get_weather", {"city": "Oslo"})], ids=["call_u1"]))
    question = {"role": "user", "content": "What is the weather in Oslo?"}
    first = await client.responses.create(
        model="bernard-v1",
        input=[question],  # type: ignore[list-item]
        tools=[WEATHER],  # type: ignore[list-item]
        store=False,
    )
    (call,) = first.output
    assert call.type == "function_call" and call.call_id == "call_u1"
    assert json.loads(call.arguments) == {"city": "Oslo"}

    upstream.script(Reply.text("It is 12 °C and sunny in Oslo."))
    output = {"type": "function_call_output", "call_id": "call_u1", "output": "12 °C, sunny"}
    second = await client.responses.create(
        model="bernard-v1",
        input=[question, call.model_dump(), output],  # type: ignore[list-item]
        tools=[WEATHER],  # type: ignore[list-item]
        store=False,
    )
    assert second.output_text == "It is 12 °C and sunny in Oslo."
    heard = upstream.router_requests[-1]["messages"]
    assert [m["role"] for m in heard[-3:]] == ["user", "assistant", "tool"]
    assert heard[-3]["content"] == "What is the weather in Oslo?"
    assert [c["id"] for c in heard[-2]["tool_calls"]] == ["call_u1"]
    assert heard[-1] == {"role": "tool", "tool_call_id": "call_u1", "content": "12 °C, sunny"}
    for response in (first, second):
        await assert_nothing_kept(own, response.id)
    assert await own.conversations() == []
    assert await own.usage() == before


async def test_an_unstored_response_may_continue_a_stored_one(
    own: Own, upstream: ScriptedUpstream
) -> None:
    client = own.openai()
    upstream.script(Reply.text("Hello Ann."))
    first = await client.responses.create(model="bernard-v1", input="My name is Ann.")
    assert first.conversation is not None
    conversation_id = first.conversation.id
    kept = await own.stack.client.get(f"/v1/conversations/{conversation_id}", headers=own.headers)
    usage = await own.usage()

    upstream.script(Reply.text("You are Ann."))
    second = await client.responses.create(
        model="bernard-v1",
        input="What is my name?",
        previous_response_id=first.id,
        store=False,
    )
    assert second.output_text == "You are Ann."
    assert second.previous_response_id == first.id and second.conversation is None
    sent = [(m["role"], m["content"]) for m in upstream.requests[-1]["messages"]]
    assert sent[-3:] == [
        ("user", "My name is Ann."),
        ("assistant", "Hello Ann."),
        ("user", "What is my name?"),
    ]
    await assert_nothing_kept(own, second.id)
    # The stored conversation is as it was: the first response is still its latest.
    again = await own.stack.client.get(f"/v1/conversations/{conversation_id}", headers=own.headers)
    assert again.json()["message_count"] == kept.json()["message_count"] == 2
    assert await own.conversations() == [conversation_id]
    assert await own.usage() == usage
    upstream.script(Reply.text("Still Ann."))
    third = await client.responses.create(
        model="bernard-v1", input="And now?", previous_response_id=first.id
    )
    assert third.output_text == "Still Ann." and third.store is True


async def test_an_unstored_continuation_holds_none_of_its_history_in_its_turn(
    own: Own, upstream: ScriptedUpstream
) -> None:
    """Its turn's record holds its own input only: the worker reads the history it runs on
    from the conversation of the response it continues, up to that response's end, and
    the prompt still holds all of it."""
    client = own.openai()
    upstream.script(Reply.text("Hello Ann."))
    first = await client.responses.create(model="bernard-v1", input="My name is Ann. " * 500)
    upstream.script(Reply.text("Noted."))
    later = await client.responses.create(
        model="bernard-v1", input="I like tea.", previous_response_id=first.id
    )
    gate = upstream.script(Reply.text(["You", " are Ann."], block_after=1))
    stream = await client.responses.create(
        model="bernard-v1",
        input="What is my name?",
        previous_response_id=first.id,
        store=False,
        stream=True,
    )
    async for event in stream:
        if event.type == "response.created":
            await gate.wait_blocked()
            turn_id = turn_id_of(event.response.id)
            assert turn_id is not None
            held = await own.stack.redis.hget(keys.turn(turn_id), "messages")
            assert held is not None
            assert json.loads(held) == [{"role": "user", "content": "What is my name?"}]
            gate.release()
    sent = [(m["role"], m["content"]) for m in upstream.requests[-1]["messages"]]
    # Up to the response it continues: the later response's rows are left out.
    assert sent[-3:] == [
        ("user", "My name is Ann. " * 500),
        ("assistant", "Hello Ann."),
        ("user", "What is my name?"),
    ]
    assert ("user", "I like tea.") not in sent
    assert later.output_text == "Noted."


async def test_an_unstored_continuation_reads_past_the_latest_rows_while_they_fit(
    upstream: ScriptedUpstream,
) -> None:
    """A history longer than a request may hold (BERNARD_MAX_MESSAGES) is read a chunk at a
    time, as a stored turn's is: the prompt holds every message that fits."""
    async with own_stack(upstream, max_messages=2) as own:
        client = own.openai()
        previous = None
        for n in range(3):
            upstream.script(Reply.text(f"Answer {n}."))
            made = await client.responses.create(
                model="bernard-v1", input=f"Question {n}.", previous_response_id=previous
            )
            previous = made.id
        upstream.script(Reply.text("All of them."))
        await client.responses.create(
            model="bernard-v1", input="Which?", previous_response_id=previous, store=False
        )
        sent = [(m["role"], m["content"]) for m in upstream.requests[-1]["messages"]]
        assert sent[-7:] == [
            ("user", "Question 0."),
            ("assistant", "Answer 0."),
            ("user", "Question 1."),
            ("assistant", "Answer 1."),
            ("user", "Question 2."),
            ("assistant", "Answer 2."),
            ("user", "Which?"),
        ]


async def test_an_unstored_stream_left_stops_its_turn_and_is_forgotten(
    upstream: ScriptedUpstream,
) -> None:
    # However long a stored stream's client may take to come back, nobody can come back
    # to an unstored one: its turn stops at once.
    async with own_stack(upstream, disconnect_grace_s=60.0) as own:
        await left_unstored(own, upstream)


async def left_unstored(own: Own, upstream: ScriptedUpstream) -> None:
    client = own.openai()
    upstream.script(Reply.slow(interval=0.01))
    stream = await client.responses.create(
        model="bernard-v1", input="hello", stream=True, store=False
    )
    turn_id = stream.response.headers["x-bernard-turn-id"]
    async for event in stream:
        if event.type == "response.output_text.delta":
            break
    await stream.close()
    await upstream.wait_disconnect(timeout_s=5)  # the upstream call was closed
    assert await own.stack.redis.hget(keys.turn(turn_id), "forgotten") == b"1"
    assert await own.stack.redis.hexists(keys.turn(turn_id), "request") == 0
    assert await own.stack.redis.zscore(keys.turns(own.user), turn_id) is None
    assert await own.conversations() == []


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"background": True}, "background"),
        ({"conversation": "conv_unstored"}, "store"),
        (
            {
                "previous_response_id": "resp_x",
                "input": [
                    {"type": "mcp_approval_response", "approval_request_id": "a", "approve": True}
                ],
            },
            "store",
        ),
    ],
)
async def test_what_an_unstored_response_cannot_be_is_a_400(
    own: Own, extra: dict[str, Any], param: str
) -> None:
    body = {"model": "bernard-v1", "input": "hello", "store": False, **extra}
    response = await own.stack.client.post("/v1/responses", json=body, headers=own.headers)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert await own.conversations() == []


async def test_a_call_needing_confirmation_is_refused_to_the_model_not_left_waiting(
    own: Own, upstream: ScriptedUpstream
) -> None:
    # A decision continues the response's conversation, and an unstored one has none: the
    # call is answered "not run" to the model, which says so, instead of ending the response
    # on an approval request that no request could ever answer.
    client = own.openai()
    upstream.script_router(Reply.tool_calls([("save_note", {"text": "the door code is 1234"})]))
    upstream.script(Reply.text("I could not save it here."))
    response = await client.responses.create(
        model="bernard-v1", input="remember the door code", store=False
    )
    assert response.status == "completed"
    assert [item.type for item in response.output] == ["mcp_call", "message"]
    call = response.output[0]
    assert call.name == "save_note"
    assert call.output is not None and call.output.startswith(
        "Error: not run: this turn is kept in no conversation (store: false)"
    )
    assert response.output_text == "I could not save it here."
    notes = NoteStore(own.stack.redis, own.user, retention_s=60)
    assert await notes.all() == [], "the note was not saved"
    await assert_nothing_kept(own, response.id)
