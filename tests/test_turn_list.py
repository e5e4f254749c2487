"""`GET /v1/turns`: the caller's own turns, newest first, paged like the conversations.

Each turn enters its owner's index (shared/keys.py `turns`) in the transaction that creates
it; the index expires on its own and drops the turns that expired as it is read.
"""

from __future__ import annotations

from typing import Any

import pytest

from api.routes.turns import waiting_status
from shared import keys
from tests.support.stack import Stack
from tests.support.upstream import Reply, ScriptedUpstream
from tests.support.users import ALICE, BOB


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


async def test_the_list_holds_only_the_callers_turns_newest_first(two_users: Stack) -> None:
    alices = [await turn(two_users, ALICE, f"question {n}") for n in range(3)]
    bobs = [await turn(two_users, BOB, "bob's question")]

    mine = await listed(two_users, ALICE)
    theirs = await listed(two_users, BOB)

    assert [t["id"] for t in mine["data"]] == alices[::-1]
    assert [t["id"] for t in theirs["data"]] == bobs
    assert mine["data"][0]["object"] == "bernard.turn"
    assert mine["data"][0]["status"] == "completed"
    assert (mine["first_id"], mine["last_id"], mine["has_more"]) == (alices[2], alices[0], False)
    assert (await two_users.client.get("/v1/turns")).status_code == 401


async def test_the_list_pages_with_after(two_users: Stack) -> None:
    made = [await turn(two_users, ALICE, f"question {n}") for n in range(5)]
    first = await listed(two_users, ALICE, "?limit=2")
    rest = await listed(two_users, ALICE, f"?limit=10&after={first['last_id']}")
    assert [t["id"] for t in first["data"]] == made[:2:-1] and first["has_more"]
    assert [t["id"] for t in rest["data"]] == made[2::-1] and not rest["has_more"]
    # Another user's turn id is no cursor into this list.
    bobs = await turn(two_users, BOB, "bob's question")
    assert (await listed(two_users, ALICE, f"?after={bobs}"))["data"] == []


async def test_limits_out_of_range_and_overlong_cursors_are_400(two_users: Stack) -> None:
    await turn(two_users, ALICE, "a question")
    for query in ("?limit=0", "?limit=101", f"?after={'x' * 257}"):
        response = await two_users.client.get(f"/v1/turns{query}", headers=ALICE)
        assert response.status_code == 400, query


async def test_expired_turns_leave_the_index_as_it_is_read_and_the_index_expires(
    two_users: Stack,
) -> None:
    kept, expired = await turn(two_users, ALICE, "kept"), await turn(two_users, ALICE, "expired")
    owner = two_users.settings.api_key_users()["key-alice"]
    index = keys.turns(owner)
    await two_users.redis.delete(keys.turn(expired))  # as its retention would

    assert [t["id"] for t in (await listed(two_users, ALICE))["data"]] == [kept]
    assert [m.decode() for m in await two_users.redis.zrange(index, 0, -1)] == [kept]
    ttl = await two_users.redis.ttl(index)
    assert ttl > two_users.settings.turn_retention_s


async def test_each_turn_says_what_it_was_about(two_users: Stack) -> None:
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "an earlier question"},
        {"role": "assistant", "content": "an earlier answer"},
        {"role": "user", "content": "what is   the\nweather in Lima?"},
    ]
    response = await two_users.client.post(
        "/v1/chat/completions", json={"model": "bernard-v1", "messages": history}, headers=ALICE
    )
    long = await turn(two_users, ALICE, "word " * 40)
    asked = response.headers["x-bernard-turn-id"]

    by_id = {t["id"]: t for t in (await listed(two_users, ALICE))["data"]}
    one = (await two_users.client.get(f"/v1/turns/{asked}", headers=ALICE)).json()

    assert by_id[asked]["preview"] == "what is the weather in Lima?" == one["preview"]
    assert by_id[long]["preview"] == "word " * 15 + "word…"
    assert len(by_id[long]["preview"]) == 80


async def test_a_paused_turn_reads_decided_once_its_tool_call_is_decided(
    upstream: ScriptedUpstream, two_users: Stack
) -> None:
    await two_users.client.post("/v1/conversations", json={"id": "hall"}, headers=ALICE)
    upstream.script_router(Reply.tool_calls([("save_note", {"text": "the door code is 1234"})]))
    paused = await two_users.client.post(
        "/v1/conversations/hall/messages", json={"content": "remember the code"}, headers=ALICE
    )
    assert paused.json()["status"] == "awaiting_confirmation"
    paused_id = paused.json()["turn_id"]
    before = {t["id"]: t for t in (await listed(two_users, ALICE))["data"]}
    proposal = (await two_users.client.get("/v1/conversations/hall", headers=ALICE)).json()[
        "pending_confirmation"
    ]
    resumed = await two_users.client.post(
        "/v1/conversations/hall/resume",
        json={"confirmation_id": proposal["confirmation_id"], "decision": "approve"},
        headers=ALICE,
    )
    resumed_id = resumed.json()["turn_id"]
    after = {t["id"]: t for t in (await listed(two_users, ALICE))["data"]}
    one = (await two_users.client.get(f"/v1/turns/{paused_id}", headers=ALICE)).json()

    assert before[paused_id]["status"] == "awaiting_confirmation"
    assert before[paused_id]["preview"] == "remember the code"
    assert after[paused_id]["status"] == "decided" == one["status"]
    assert (after[resumed_id]["status"], after[resumed_id]["preview"]) == ("completed", None)


@pytest.mark.parametrize(
    ("states", "status"),
    [
        ([("pending", 100.0)], "awaiting_confirmation"),
        ([("pending", 100.0), ("approved", 100.0)], "awaiting_confirmation"),
        ([("approved", 100.0), ("rejected", 100.0)], "decided"),
        ([("pending", 1.0)], "expired"),  # lapsed while pending
        ([("approved", 100.0), ("expired", 1.0)], "expired"),
        ([], "expired"),  # its conversation was deleted
    ],
)
def test_what_a_paused_turns_proposals_say_of_it(
    states: list[tuple[str, float]], status: str
) -> None:
    proposals = [{"state": state, "expires_at": expires} for state, expires in states]
    assert waiting_status(proposals, now=50.0) == status
