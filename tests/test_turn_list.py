"""`GET /v1/turns`: the caller's own turns, newest first, paged like the conversations.

Each turn enters its owner's index (shared/keys.py `turns`) in the transaction that creates
it; the index expires on its own and drops the turns that expired as it is read.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from shared import keys
from tests.conftest import Stack, make_settings, run_stack
from tests.upstream import ScriptedUpstream

ALICE = {"Authorization": "Bearer key-alice"}
BOB = {"Authorization": "Bearer key-bob"}


@pytest.fixture
async def users(upstream: ScriptedUpstream) -> AsyncIterator[Stack]:
    run = uuid.uuid4().hex[:8]
    keys_for_two = f"key-alice:alice-{run},key-bob:bob-{run}"
    async with run_stack(make_settings(upstream, api_keys=keys_for_two)) as stack:
        yield stack


async def turn(stack: Stack, headers: dict[str, str], content: str) -> str:
    response = await stack.client.post(
        "/v1/chat/completions",
        json={"model": "bernard-v1", "messages": [{"role": "user", "content": content}]},
        headers=headers,
    )
    assert response.status_code == 200, response.text
    return response.headers["x-bernard-turn-id"]


async def listed(stack: Stack, headers: dict[str, str], query: str = "") -> dict[str, Any]:
    response = await stack.client.get(f"/v1/turns{query}", headers=headers)
    assert response.status_code == 200, response.text
    return dict(response.json())


async def test_the_list_holds_only_the_callers_turns_newest_first(users: Stack) -> None:
    alices = [await turn(users, ALICE, f"question {n}") for n in range(3)]
    bobs = [await turn(users, BOB, "bob's question")]

    mine = await listed(users, ALICE)
    theirs = await listed(users, BOB)

    assert [t["id"] for t in mine["data"]] == alices[::-1]
    assert [t["id"] for t in theirs["data"]] == bobs
    assert mine["data"][0]["object"] == "bernard.turn"
    assert mine["data"][0]["status"] == "completed"
    assert (mine["first_id"], mine["last_id"], mine["has_more"]) == (alices[2], alices[0], False)
    assert (await users.client.get("/v1/turns")).status_code == 401


async def test_the_list_pages_with_after(users: Stack) -> None:
    made = [await turn(users, ALICE, f"question {n}") for n in range(5)]
    first = await listed(users, ALICE, "?limit=2")
    rest = await listed(users, ALICE, f"?limit=10&after={first['last_id']}")
    assert [t["id"] for t in first["data"]] == made[:2:-1] and first["has_more"]
    assert [t["id"] for t in rest["data"]] == made[2::-1] and not rest["has_more"]
    # Another user's turn id is no cursor into this list.
    bobs = await turn(users, BOB, "bob's question")
    assert (await listed(users, ALICE, f"?after={bobs}"))["data"] == []


async def test_limits_out_of_range_and_overlong_cursors_are_400(users: Stack) -> None:
    await turn(users, ALICE, "a question")
    for query in ("?limit=0", "?limit=101", f"?after={'x' * 257}"):
        response = await users.client.get(f"/v1/turns{query}", headers=ALICE)
        assert response.status_code == 400, query


async def test_expired_turns_leave_the_index_as_it_is_read_and_the_index_expires(
    users: Stack,
) -> None:
    kept, expired = await turn(users, ALICE, "kept"), await turn(users, ALICE, "expired")
    owner = users.settings.api_key_users()["key-alice"]
    index = keys.turns(owner)
    await users.redis.delete(keys.turn(expired))  # as its retention would

    assert [t["id"] for t in (await listed(users, ALICE))["data"]] == [kept]
    assert [m.decode() for m in await users.redis.zrange(index, 0, -1)] == [kept]
    ttl = await users.redis.ttl(index)
    assert ttl > users.settings.turn_retention_s
