"""Two requests on one conversation at the same moment, through real HTTP, Redis, worker and
upstream: every interleaving ends in a state that matches the conversation's history.

- Approving a waiting tool call while a new message arrives: whichever comes first decides
  (the message answers the call in words); the decision after a message that answered is
  refused, a message while the decision's turn runs too; the call runs at most once, and
  the history answers it exactly once with what happened.
- Deleting a conversation while its turn runs, and creating the same id again: the old
  turn ends with a clear `conversation_deleted`, and nothing it does lands in the new one.
- A deleted conversation's turns are gone from every read route at once.

The write tool here is the test's own (`flip_switch`, confirmation required), counting
each run by its argument, so a call that ran twice, or ran unapproved, is seen.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis.asyncio as redis_asyncio
from langchain_core.tools import BaseTool, tool

from shared import keys
from shared.conversation_state import ConversationMachine, Outcome
from shared.lifecycle import STRANDED_AFTER_S
from shared.records.decisions import DECIDED_NOT_CARRIED_OUT
from shared.records.keeper import RecordKeeper
from tests.support.processes import wait_for
from tests.support.sse import named_events
from tests.support.stack import Stack, make_settings, run_stack, run_worker
from tests.support.upstream import Body, Reply, ScriptedUpstream, last_user_text
from tests.support.users import ALICE, keys_for_two
from tests.test_conversations import SSE, alice

FLIP = "flip "  # a message starting so makes the router propose flip_switch(<the rest>)


@dataclass
class Switches:
    """The test's write tool and what it did: one entry per run, its `switch` argument."""

    runs: list[str] = field(default_factory=list)

    def tool(self) -> BaseTool:
        @tool
        async def flip_switch(switch: str) -> str:
            """Flip the switch named `switch`."""
            self.runs.append(switch)
            return f"Flipped {switch}"

        flip_switch.metadata = {"requires_confirmation": True}
        return flip_switch


def route(body: Body) -> Reply:
    """The router: a user message `flip <name>` proposes flipping <name>; anything else (the
    results of a call, another message) is answered."""
    last = (body.get("messages") or [{}])[-1]
    text = last_user_text(body)
    if last.get("role") == "user" and text.startswith(FLIP):
        return Reply.tool_calls([("flip_switch", {"switch": text.removeprefix(FLIP)})])
    return Reply.respond()


@pytest.fixture
async def switched(upstream: ScriptedUpstream) -> AsyncIterator[tuple[Stack, Switches]]:
    upstream.router_responder = route
    switches = Switches()
    # Hundreds of races as one user, ten at a time: as fast as a script hammering the API,
    # which the rate would stop (shared/rate_limit.py); these tests are about the races.
    settings = make_settings(
        upstream,
        api_keys=keys_for_two(),
        worker_concurrency=40,
        max_active_turns_per_user=100,
        rate_limit_per_minute=0,
    )
    async with run_stack(settings, tools=[switches.tool()]) as stack:
        yield stack, switches


def openai_problems(messages: list[dict[str, Any]]) -> list[str]:
    """What an OpenAI-style upstream rejects in `messages`: a tool message that answers no
    call of the assistant message just before its run of tool messages (or one answered
    twice), and an assistant message with tool calls not all answered before the next
    message of another role."""
    problems: list[str] = []
    open_calls: set[str] = set()
    answered: set[str] = set()
    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            call = message.get("tool_call_id")
            if call not in open_calls or call in answered:
                problems.append(f"#{index}: tool message for {call!r} answers no open call")
            answered.add(str(call))
            continue
        if open_calls - answered:
            problems.append(f"#{index}: calls {sorted(open_calls - answered)} never answered")
        open_calls = {c["id"] for c in message.get("tool_calls") or []}
        answered = set()
    if open_calls - answered and messages and messages[-1].get("role") == "tool":
        problems.append(f"end: calls {sorted(open_calls - answered)} never answered")
    return problems


async def history(stack: Stack, conversation_id: str) -> list[dict[str, Any]]:
    page = await stack.client.get(
        f"/v1/conversations/{conversation_id}/messages?limit=1000", headers=ALICE
    )
    assert page.status_code == 200, page.text
    return list(page.json()["data"])


async def paused(stack: Stack, name: str) -> str:
    """A conversation `name` whose turn proposed flipping switch `name` and waits; the
    confirmation id."""
    created = await stack.client.post("/v1/conversations", json={"id": name}, headers=ALICE)
    assert created.status_code == 201, created.text
    answered = await stack.client.post(
        f"/v1/conversations/{name}/messages", json={"content": FLIP + name}, headers=ALICE
    )
    assert answered.status_code == 200, answered.text
    assert answered.json()["status"] == "awaiting_confirmation"
    return str(answered.json()["pending_confirmation"]["confirmation_id"])


async def approve_while_a_message_arrives(stack: Stack, switches: Switches, name: str) -> None:
    """One run: approve and post a message at the same moment, then check the end state
    against the history."""
    confirmation = await paused(stack, name)
    approve = {"confirmation_id": confirmation, "decision": "approve"}
    resumed, posted = await asyncio.gather(
        stack.client.post(f"/v1/conversations/{name}/resume", json=approve, headers=ALICE),
        stack.client.post(
            f"/v1/conversations/{name}/messages",
            # Refused while the decision's turn runs: what is raced here is the claim.
            json={"content": "and now?", "multitask_strategy": "reject"},
            headers=ALICE,
        ),
    )
    rows = await history(stack, name)
    shown = (await stack.client.get(f"/v1/conversations/{name}", headers=ALICE)).json()
    told = [row["content"] for row in rows if row["role"] == "tool"]
    where = f"{name}: resume {resumed.status_code}, message {posted.status_code}, {told}"

    assert openai_problems(rows) == [], where
    assert (shown["status"], shown["pending_confirmation"]) == ("idle", None), where
    if resumed.status_code == 409:
        # The message came first: it answered the call in words (the router approved
        # nothing), and the decision found the call no longer waiting.
        assert resumed.json()["error"]["code"] == "confirmation_expired", where
        assert (posted.status_code, posted.json()["status"]) == (200, "completed"), where
        assert switches.runs.count(name) == 0, where
        assert told == ["The user declined: flip_switch was not run."], where
        roles = [row["role"] for row in rows]
        assert roles == ["user", "assistant", "tool", "user", "assistant"], where
        return
    # The decision was made while the call waited: it stands, and its turn ran the call.
    assert resumed.status_code == 200, where + resumed.text
    assert resumed.json()["status"] == "completed", where
    # The message is refused while the decision's turn runs; only one that came after that
    # turn ended runs.
    if posted.status_code == 409:
        assert posted.json()["error"]["code"] == "conversation_busy", where
    else:
        assert posted.status_code == 200, where + posted.text
    assert switches.runs.count(name) == 1, where
    assert told == [f"Flipped {name}"], where
    assert [row["role"] for row in rows][:4] == ["user", "assistant", "tool", "assistant"], where
    assert len(rows) == (6 if posted.status_code == 200 else 4), where

    again = await stack.client.post(f"/v1/conversations/{name}/resume", json=approve, headers=ALICE)
    assert again.status_code == 409, where
    assert again.json()["error"]["code"] == "confirmation_already_decided", where
    assert switches.runs.count(name) == 1, where


async def test_approve_races_a_new_message(
    switched: tuple[Stack, Switches], upstream: ScriptedUpstream
) -> None:
    """200 runs, 10 at a time, each on its own conversation (on main, the first ten had
    a decision refused and its call answered "not run")."""
    stack, switches = switched
    for batch in range(20):
        await asyncio.gather(
            *(
                approve_while_a_message_arrives(stack, switches, f"race-{batch}-{n}")
                for n in range(10)
            )
        )
    every = [*upstream.router_requests, *upstream.requests]
    assert [openai_problems(body["messages"]) for body in every] == [[]] * len(every)


async def test_a_decision_whose_turn_was_never_created_holds_the_conversation_30_s_at_most(
    switched: tuple[Stack, Switches],
) -> None:
    """The API claims the conversation for the turn carrying the decision out (`DECIDE`) and
    dies before it creates that turn: the conversation is busy while the turn may yet be
    created, then free again (`STRANDED_AFTER_S` after the claim), and a new message runs."""
    stack, switches = switched
    confirmation = await paused(stack, "hall")
    owner = alice(stack)
    machine = ConversationMachine(stack.redis, owner, retention_s=600)
    decided = await machine.decide("hall", confirmation, "approve", turn_id="never-created")
    assert decided.outcome is Outcome.RESUMED
    shown = (await stack.client.get("/v1/conversations/hall", headers=ALICE)).json()
    assert shown["status"] == "running"
    claimed = time.time() - STRANDED_AFTER_S - 1  # as if the API died that long ago
    await stack.redis.hset(keys.conversation(owner, "hall"), "active_since", repr(claimed))
    shown = (await stack.client.get("/v1/conversations/hall", headers=ALICE)).json()
    assert (shown["status"], shown["turn_id"]) == ("idle", None)
    posted = await stack.client.post(
        "/v1/conversations/hall/messages", json={"content": "and now?"}, headers=ALICE
    )
    assert (posted.status_code, posted.json()["status"]) == (200, "completed"), posted.text
    rows = await history(stack, "hall")
    assert openai_problems(rows) == []
    assert switches.runs == [], "its call never ran"
    # Answered as decided: the user approved it (not "did not confirm this in time").
    assert [row["content"] for row in rows if row["role"] == "tool"] == [DECIDED_NOT_CARRIED_OUT]


# -- deleting while a turn runs ----------------------------------------------------------------


def turn_keys(turn_id: str) -> str:
    return f"{keys.PREFIX}:{{{turn_id}}}:*"


async def test_a_conversation_deleted_and_created_again_never_gets_the_old_turns_answer(
    upstream: ScriptedUpstream, redis: redis_asyncio.Redis
) -> None:
    """Its old turn, streaming its answer when the conversation goes, ends at once with
    `conversation_deleted`; the conversation created again under the same id holds exactly
    what its own requests made, even once the old turn's upstream answers in full."""
    settings = make_settings(upstream, api_keys=keys_for_two())
    gate = upstream.script(Reply.text(["the old", " answer"], block_after_first=True))
    upstream.script(Reply.text("The new answer."))
    async with run_stack(settings) as stack:
        url = "/v1/conversations/den"
        await stack.client.post("/v1/conversations", json={"id": "den"}, headers=ALICE)
        async with stack.client.stream(
            "POST", f"{url}/messages", json={"content": "old question"}, headers={**ALICE, **SSE}
        ) as old:
            old_turn = old.headers["x-bernard-turn-id"]
            await gate.wait_blocked()
            deleted = await stack.client.delete(url, headers=ALICE)
            assert deleted.status_code == 200
            created = await stack.client.post(
                "/v1/conversations", json={"id": "den"}, headers=ALICE
            )
            assert created.status_code == 201, created.text
            new = await stack.client.post(
                f"{url}/messages", json={"content": "new question"}, headers=ALICE
            )
            assert new.status_code == 200, new.text
            gate.release()  # the old turn's upstream sends the rest of its answer
            old_events = await named_events(old)
        assert old_events[-1] == (
            "done",
            {
                "turn_id": old_turn,
                "status": "cancelled",
                "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
                "error": {
                    "code": "conversation_deleted",
                    "message": "the turn's conversation was deleted while it ran",
                },
            },
        )
        owner = alice(stack)
    # The stack is down: its worker has finished everything it had.
    rows = await RecordKeeper(redis, owner).messages("den")
    assert rows == [
        {"role": "user", "content": "new question"},
        {"role": "assistant", "content": "The new answer."},
    ]
    left = [key async for key in redis.scan_iter(match=turn_keys(old_turn))]
    assert [(key, await redis.ttl(key)) for key in left if await redis.ttl(key) < 0] == []


async def test_a_turn_whose_conversation_went_before_it_began_never_runs(
    upstream: ScriptedUpstream, redis: redis_asyncio.Redis
) -> None:
    """Its conversation is deleted, and created again, between the turn's claim and its
    start (here: no worker until then): the turn ends `conversation_deleted` without
    running, writes nothing into the new conversation, and is forgotten."""
    settings = make_settings(upstream, api_keys=keys_for_two())
    async with run_stack(settings, worker=False) as stack:
        owner = alice(stack)
        await stack.client.post("/v1/conversations", json={"id": "den"}, headers=ALICE)
        waiting = asyncio.create_task(
            stack.client.post(
                "/v1/conversations/den/messages", json={"content": "old"}, headers=ALICE
            )
        )
        meta = keys.conversation(owner, "den")
        await wait_for(lambda: stack.redis.hget(meta, "active_turn"), 10)
        turn_id = (await stack.redis.hget(meta, "active_turn")).decode()
        # What a deletion between the API's claim and the turn's creation leaves: the
        # conversation gone (and created again), the turn not ended.
        machine = ConversationMachine(stack.redis, owner, retention_s=60)
        assert (await machine.delete("den")).outcome is Outcome.DELETED
        assert await machine.create("den") is Outcome.CREATED
        async with run_worker(settings):
            answered = await waiting
        assert (answered.status_code, answered.json()["error"]["code"]) == (
            409,
            "conversation_deleted",
        )
        turn = await stack.client.get(f"/v1/turns/{turn_id}", headers=ALICE)
        assert turn.status_code == 404
    assert await RecordKeeper(redis, owner).messages("den") == []
    assert upstream.requests == upstream.router_requests == []


async def test_a_deleted_conversations_turns_are_404_on_every_read_route_at_once(
    upstream: ScriptedUpstream, redis: redis_asyncio.Redis
) -> None:
    """The turns that ran on it, the one running included: `GET /v1/turns/{id}`, its
    events and the list of turns find none of them the moment the deletion answers; what
    their keys held of the conversation is gone with it, and a worker still running one
    cannot create its keys again."""
    settings = make_settings(upstream, api_keys=keys_for_two())
    upstream.script(Reply.text("An answer about the secret."))
    gate = upstream.script(Reply.text(["still", " going"], block_after_first=True))
    async with run_stack(settings) as stack:
        await stack.client.post("/v1/conversations", json={"id": "den"}, headers=ALICE)
        first = await stack.client.post(
            "/v1/conversations/den/messages", json={"content": "my secret"}, headers=ALICE
        )
        ended = first.json()["turn_id"]
        async with stack.client.stream(
            "POST",
            "/v1/conversations/den/messages",
            json={"content": "my other secret"},
            headers={**ALICE, **SSE},
        ) as second:
            running = second.headers["x-bernard-turn-id"]
            await gate.wait_blocked()
            listed = (await stack.client.get("/v1/turns", headers=ALICE)).json()["data"]
            assert {turn["id"] for turn in listed} == {ended, running}
            assert (await stack.client.delete("/v1/conversations/den", headers=ALICE)).is_success
            for turn_id in (ended, running):
                for route in (f"/v1/turns/{turn_id}", f"/v1/turns/{turn_id}/events"):
                    gone = await stack.client.get(route, headers=ALICE)
                    assert (gone.status_code, gone.json()["error"]["code"]) == (
                        404,
                        "turn_not_found",
                    ), route
            assert (await stack.client.get("/v1/turns", headers=ALICE)).json()["data"] == []
            for turn_id in (ended, running):
                for key in [k async for k in redis.scan_iter(match=turn_keys(turn_id))]:
                    value = await redis.dump(key)
                    assert value is None or b"secret" not in value, key
            events = await named_events(second)
        assert events[-1][1]["error"]["code"] == "conversation_deleted"
        gate.release()
    for turn_id in (ended, running):
        for key in [k async for k in redis.scan_iter(match=turn_keys(turn_id))]:
            assert 0 < await redis.ttl(key) <= 60, key
