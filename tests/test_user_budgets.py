"""What one user may store and how fast they may ask, through the API as clients use it
(shared/budgets.py, shared/rate_limit.py, api/admission.py, api/store_guard.py).

Each refusal is checked twice: its answer (status, code, the setting it names) and that
nothing was stored for it (no conversation, no turn, no bytes).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import httpx
import pytest
import redis.asyncio as redis_asyncio

from shared import budgets, keys
from shared.rate_limit import Rate, RateLimitedError, RateLimiter
from shared.records.reads import Archivist
from tests.support.chat import body
from tests.support.processes import private_redis, wait_for
from tests.support.session_redis import session_redis_url
from tests.support.sse import collect
from tests.support.stack import Stack, make_settings, run_api, run_stack
from tests.support.upstream import Reply, ScriptedUpstream
from tests.support.users import Owners, as_user
from tests.test_abuse import CHAT, KEYS, error_of
from tests.test_conversations import conversation, named

# The attack as it was found (issue 20): sequential requests of 500 messages of 1,900
# characters, each a new conversation.
FLOOD_MESSAGES = [{"role": "user", "content": f"{n:04} " + "x" * 1895} for n in range(500)]


async def conversations_of(stack: Stack, owner: str) -> list[str]:
    raw = await stack.redis.zrange(keys.conversations(owner), 0, -1)
    return [item.decode() for item in raw]


async def turns_of(stack: Stack, owner: str) -> int:
    return int(await stack.redis.zcard(keys.turns(owner)))


async def usage_of(stack: Stack, owner: str) -> budgets.Usage:
    retention_s = stack.settings.conversation_retention_s
    return await budgets.read_usage(stack.redis, owner, retention_s=retention_s)


# -- storage ---------------------------------------------------------------------------------


async def test_a_flood_of_large_requests_is_refused_once_the_users_bytes_are_spent(
    upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    """The 105 MB flood, against a budget of 8 MiB: refused from the request after the one
    that spent it, with nothing of the refused requests stored; another user goes on."""
    budget = 8 * 2**20
    async with private_redis(tmp_path / "redis") as server:
        # The rate limit would stop the flood sooner: this test is about the bytes.
        settings = make_settings(
            upstream,
            redis_url=server.url,
            api_keys=KEYS,
            max_user_bytes=budget,
            rate_limit_per_minute=0,
        )
        async with run_stack(settings) as stack:
            before = await stack.redis.info("memory")
            keys_before = await stack.redis.dbsize()
            codes = []
            for _ in range(100):
                answer = await stack.client.post(
                    CHAT,
                    json={"model": "bernard-v1", "messages": FLOOD_MESSAGES},
                    headers=as_user("alice"),
                )
                codes.append(answer.status_code)
                if answer.status_code != 200:
                    error = error_of(answer, 429)
                    assert error["code"] == "storage_quota_exceeded"
                    assert "BERNARD_MAX_USER_BYTES" in error["message"]
                    assert answer.headers["x-should-retry"] == "false"
            grown = int((await stack.redis.info("memory"))["used_memory"]) - int(
                before["used_memory"]
            )
            keys_grown = await stack.redis.dbsize() - keys_before
            usage = await usage_of(stack, "alice")
            stored = len(await conversations_of(stack, "alice"))
            turns = await turns_of(stack, "alice")
            bobs = await stack.client.post(CHAT, json=body("hi"), headers=as_user("bob"))

    # Each request stores about 1.0 MB: the ninth takes alice past 8 MiB, the tenth is
    # refused, and so is every one after it.
    assert codes == [200] * 9 + [429] * 91
    assert (stored, turns) == (9, 9)
    assert 9_000_000 < usage.bytes < 9_300_000
    # Redis grew by what the nine stored, not by what a hundred would have (105 MB).
    assert 9_000_000 < grown < 12_000_000, grown
    # Per request stored: its conversation's metadata, messages, calls, summary and set of
    # turns, its turn's record and stream; then alice's (her conversations, turns, usage and
    # background jobs), the deployment's (the queue, its background set, the hub's and the
    # metrics' keys) and the job of a summary still waiting. The 91 refused added none.
    assert keys_grown <= 9 * 7 + 9, keys_grown
    assert bobs.status_code == 200, bobs.text
    print(f"\nflood: 9 of 100 stored, Redis grew {grown / 2**20:.1f} MiB, {keys_grown} keys")


@pytest.mark.parametrize("queue_apart", [False, True], ids=["one-redis", "queue-apart"])
async def test_a_new_conversation_past_the_users_count_is_refused_before_it_exists(
    upstream: ScriptedUpstream, owners: Owners, queue_apart: bool
) -> None:
    # Apart, the budgets are read beside the admission rather than in its pipeline (two
    # databases stand for two servers, as in tests/test_pipeline.py).
    server = session_redis_url().rsplit("/", 1)[0]
    roles = {"queue_redis_url": f"{server}/1"} if queue_apart else {}
    settings = make_settings(
        upstream, api_keys=owners.api_keys, max_conversations_per_user=2, **roles
    )
    async with run_stack(settings) as stack:
        alice = as_user("alice")
        first = await stack.client.post(CHAT, json=body("one"), headers=alice)
        created = await stack.client.post("/v1/conversations", json={"id": "b"}, headers=alice)
        assert (first.status_code, created.status_code) == (200, 201)

        by_chat = await stack.client.post(CHAT, json=body("three"), headers=alice)
        by_id = await stack.client.post(
            CHAT, json=body("three", conversation_id="c"), headers=alice
        )
        by_create = await stack.client.post("/v1/conversations", json={"id": "c"}, headers=alice)
        for refused in (by_chat, by_id, by_create):
            error = error_of(refused, 429)
            assert error["code"] == "too_many_conversations"
            assert "BERNARD_MAX_CONVERSATIONS_PER_USER" in error["message"]
        assert len(await conversations_of(stack, owners.alice)) == 2
        assert await turns_of(stack, owners.alice) == 1

        continued = await stack.client.post(
            CHAT, json=body("more", conversation_id="b"), headers=alice
        )
        bobs = await stack.client.post(CHAT, json=body("hi"), headers=as_user("bob"))
        assert (continued.status_code, bobs.status_code) == (200, 200)
        await stack.client.delete("/v1/conversations/b", headers=alice)
        again = await stack.client.post(CHAT, json=body("room again"), headers=alice)
        assert again.status_code == 200, again.text


# Seven function tools of 15,000-character descriptions: 105,372 bytes as JSON, within
# BERNARD_MAX_TOOLS_BYTES, which a response keeps to show them back.
BIG_TOOLS = [
    {"type": "function", "name": f"tool_{i}", "description": "d" * 15_000} for i in range(7)
]
BIG_TOOLS_BYTES = 105_372


async def test_what_a_response_keeps_of_its_request_counts_against_its_user(
    upstream: ScriptedUpstream, owners: Owners
) -> None:
    """A finished response keeps its instructions and tools to show them back, counted
    against its user's bytes: past them the next request is refused; deleting a response
    gives its bytes back."""
    settings = make_settings(
        upstream, api_keys=owners.api_keys, max_user_bytes=300_000, rate_limit_per_minute=0
    )
    async with run_stack(settings) as stack:
        alice = as_user("alice")
        request = {"model": "bernard-v1", "input": "hi", "instructions": "i" * 1000}
        made = []
        for _ in range(3):
            response = await stack.client.post(
                "/v1/responses", json={**request, "tools": BIG_TOOLS}, headers=alice
            )
            assert response.status_code == 200, response.text
            made.append(response.json()["id"])
        # Each turn's record dropped the tools the worker ran with; its echo still shows them.
        for response_id in made:
            turn_id = response_id.removeprefix("resp_")
            assert await stack.redis.hexists(keys.turn(turn_id), "tools") == 0
            polled = await stack.client.get(f"/v1/responses/{response_id}", headers=alice)
            assert polled.json()["tools"] == BIG_TOOLS
            assert polled.json()["instructions"] == "i" * 1000
        used = await usage_of(stack, owners.alice)
        assert used.bytes > 3 * (BIG_TOOLS_BYTES + 1000), used
        assert used.bytes < 3 * (BIG_TOOLS_BYTES + 1000) + 12_000, used

        refused = await stack.client.post(
            "/v1/responses", json={**request, "tools": BIG_TOOLS}, headers=alice
        )
        error = error_of(refused, 429)
        assert error["code"] == "storage_quota_exceeded"
        assert "BERNARD_MAX_USER_BYTES" in error["message"]
        bobs = await stack.client.post("/v1/responses", json=request, headers=as_user("bob"))
        assert bobs.status_code == 200, bobs.text

        deleted = await stack.client.delete(f"/v1/responses/{made[0]}", headers=alice)
        assert deleted.status_code == 200, deleted.text
        freed = await usage_of(stack, owners.alice)
        assert freed.bytes < used.bytes - BIG_TOOLS_BYTES, (used, freed)
        again = await stack.client.post(
            "/v1/responses", json={**request, "tools": BIG_TOOLS}, headers=alice
        )
        assert again.status_code == 200, again.text


@pytest.mark.parametrize("queue_apart", [False, True], ids=["one-redis", "queue-apart"])
async def test_a_kept_request_counts_as_long_as_its_turn_is_kept(
    upstream: ScriptedUpstream, owners: Owners, queue_apart: bool
) -> None:
    """A chat turn's tools go with its end; what its record keeps of its request counts
    until the record is gone (BERNARD_TURN_RETENTION_S after its end), not longer."""
    server = session_redis_url().rsplit("/", 1)[0]
    roles = {"queue_redis_url": f"{server}/1"} if queue_apart else {}
    settings = make_settings(
        upstream, api_keys=owners.api_keys, turn_retention_s=2, rate_limit_per_minute=0, **roles
    )
    # A kept chat request over the uncounted allowance: four stop sequences of 2,000.
    stop = [f"{n}" * 2000 for n in range(4)]
    tools = [
        {"type": "function", "function": {"name": "f", "description": "d" * 10_000}},
    ]
    async with run_stack(settings) as stack:
        alice = as_user("alice")
        before = await usage_of(stack, owners.alice)
        answered = await stack.client.post(
            CHAT, json=body("hi", tools=tools, stop=stop), headers=alice
        )
        assert answered.status_code == 200, answered.text
        turn_id = answered.headers["x-bernard-turn-id"]
        assert await stack.redis.hexists(keys.turn(turn_id), "tools") == 0
        counted = await usage_of(stack, owners.alice)
        # The four stop sequences, not the tools: those went with the turn's end.
        assert 8000 < counted.bytes - before.bytes < 10_000, (before, counted)
        await asyncio.sleep(3)
        assert await stack.redis.exists(keys.turn(turn_id)) == 0
        lapsed = await usage_of(stack, owners.alice)
        # What is left is the conversation's own: "hi" and the answer.
        assert lapsed.bytes - before.bytes < 2000, (before, lapsed)


async def test_a_conversation_at_its_cap_is_refused_whole_and_stays_as_it_was(
    upstream: ScriptedUpstream, owners: Owners
) -> None:
    """At the API when it can tell (the conversation is full, or a posted message would
    take it over: 413 before any turn); else in the worker, which refuses the request's
    messages whole and ends the turn `conversation_too_large` before any model call."""
    cap = 6_000
    settings = make_settings(upstream, api_keys=owners.api_keys, max_conversation_bytes=cap)
    async with run_stack(settings) as stack:
        alice = as_user("alice")
        archive = Archivist(stack.redis, owners.alice)
        url = "/v1/conversations/kitchen/messages"
        await stack.client.post("/v1/conversations", json={"id": "kitchen"}, headers=alice)
        assert (await stack.client.post(url, json={"content": "hi"}, headers=alice)).is_success
        conversation = await archive.get_conversation("kitchen")
        assert conversation is not None
        held, count, turns = conversation.bytes, conversation.message_count, 1
        answered = len(upstream.requests)
        room = cap - held
        assert 1_000 < room < 5_000, held  # a turn's rows and call records: about 2 KB

        posted = await stack.client.post(url, json={"content": "x" * (room + 1)}, headers=alice)
        error = error_of(posted, 413)
        assert (error["code"], error["param"]) == ("conversation_too_large", "conversation_id")
        assert "BERNARD_MAX_CONVERSATION_BYTES" in error["message"]
        assert await turns_of(stack, owners.alice) == turns

        # Chat completions resend the history: only the worker tells what is new.
        resent = {"conversation_id": "kitchen", "messages": [{"role": "user", "content": "hi"}]}
        new = {"role": "user", "content": "y" * (room - 50)}  # its row is over `room`
        waited = await stack.client.post(
            CHAT,
            json={"model": "bernard-v1", **resent, "messages": [*resent["messages"], new]},
            headers=alice,
        )
        assert error_of(waited, 413)["code"] == "conversation_too_large"
        streamed = await collect(
            stack.client,
            "POST",
            CHAT,
            json={
                "model": "bernard-v1",
                "stream": True,
                **resent,
                "messages": [*resent["messages"], new],
            },
            headers=alice,
        )
        assert streamed[-2].json["error"]["code"] == "conversation_too_large"
        after = await archive.get_conversation("kitchen")
        assert after is not None
        assert (after.bytes, after.message_count) == (held, count)
        assert len(upstream.requests) == answered  # the refused turns reached no model

        # What fits is stored, and so is the turn's answer though it takes the
        # conversation over its cap; the next request is refused at the API.
        upstream.script(Reply.text(["z" * room]))
        fits = await stack.client.post(url, json={"content": "ok"}, headers=alice)
        assert fits.status_code == 200, fits.text
        full = await archive.get_conversation("kitchen")
        assert full is not None and full.bytes > cap and full.message_count == count + 2
        refused = await stack.client.post(url, json={"content": "?"}, headers=alice)
        assert error_of(refused, 413)["code"] == "conversation_too_large"
    assert len(upstream.requests) == answered + 1  # only the turn that fitted was answered


# -- rate ------------------------------------------------------------------------------------


async def test_the_rate_limit_holds_across_api_processes_and_says_when_to_retry(
    upstream: ScriptedUpstream, owners: Owners
) -> None:
    """Two API processes on one Redis share each user's bucket: 10 tokens, a turn costs 4,
    any other request 1, refilled at one token every 2 s."""
    settings = make_settings(
        upstream,
        api_keys=owners.api_keys,
        rate_limit_burst=10,
        rate_limit_per_minute=30,
        rate_limit_turn_cost=4,
    )
    async with (
        run_stack(settings) as stack,
        run_api(settings) as other_url,
        httpx.AsyncClient(base_url=other_url, timeout=30) as other,
    ):
        one, two, alice = stack.client, other, as_user("alice")
        assert (await one.post(CHAT, json=body("a"), headers=alice)).status_code == 200
        assert (await two.post(CHAT, json=body("b"), headers=alice)).status_code == 200
        third = await one.post(CHAT, json=body("c"), headers=alice)  # about 2 left
        error = error_of(third, 429)
        assert error["code"] == "rate_limit_exceeded"
        assert "BERNARD_RATE_LIMIT_PER_MINUTE" in error["message"]
        assert 1 <= int(third.headers["retry-after"]) <= 4
        assert await turns_of(stack, owners.alice) == 2  # the refused turn is not stored

        # Any other request costs one token, on either process, till none is left.
        passed = 0
        while (refused := await (one, two)[passed % 2].get("/v1/models", headers=alice)).is_success:
            passed += 1
            assert passed < 6, "the 2 tokens left, and what a few seconds refilled"
        assert passed >= 2
        assert error_of(refused, 429)["code"] == "rate_limit_exceeded"
        wait_s = int(refused.headers["retry-after"])
        assert 1 <= wait_s <= 2
        bobs = await two.get("/v1/models", headers=as_user("bob"))
        assert bobs.status_code == 200, "bob has a bucket of his own"
        await asyncio.sleep(wait_s)
        assert (await one.get("/v1/models", headers=alice)).status_code == 200


# A busy evening of a household sharing one key, second by second for an hour: four voice
# satellites each asking something every 30 s (and reopening their event stream every
# 5 minutes), someone in the playground sending a message every 10 s (the turn, then the
# list of conversations refreshed), and the CLI a question every 15 s.
HOUSEHOLD = [
    *[(second, "turn") for second in range(0, 3600, 30) for _ in range(4)],
    *[(second, "request") for second in range(0, 3600, 300) for _ in range(4)],
    *[(second, kind) for second in range(0, 3600, 10) for kind in ("turn", "request")],
    *[(second, "turn") for second in range(5, 3600, 15)],
]


@pytest.mark.parametrize(
    ("traffic", "refused_after"),
    [
        (sorted(HOUSEHOLD), None),
        # A script hammering the API, a turn every 100 ms: 30 at once, and one more from
        # what the first 3 s refilled.
        ([(n / 10, "turn") for n in range(600)], 31),
    ],
    ids=["household", "hammering"],
)
async def test_the_default_rate_lets_a_household_be_and_stops_a_script(
    redis: redis_asyncio.Redis, traffic: list[tuple[float, str]], refused_after: int | None
) -> None:
    rate = Rate.of(make_settings())
    assert rate is not None
    limiter, owner = RateLimiter(redis, rate), f"household-{uuid.uuid4().hex[:8]}"
    start = time.time()
    refused: list[int] = []
    try:
        for n, (second, kind) in enumerate(traffic):
            cost = rate.turn_cost if kind == "turn" else 1
            try:
                await limiter.take(owner, cost, now=start + second)
            except RateLimitedError:
                refused.append(n)
    finally:
        await redis.delete(keys.rate(owner))
    assert (refused[0] if refused else None) == refused_after


# -- the memory guard ------------------------------------------------------------------------


async def test_a_nearly_full_redis_refuses_what_would_store_and_readyz_says_why(
    upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    async with private_redis(tmp_path / "redis") as server:
        settings = make_settings(upstream, redis_url=server.url, redis_memory_guard=0.5)
        async with run_stack(settings) as stack:

            async def readyz(status: int) -> bool:
                return (await stack.client.get("/readyz")).status_code == status

            await wait_for(lambda: readyz(200), timeout_s=5)  # the worker is up
            assert (await stack.chat("before")).status_code == 200
            used = int((await stack.redis.info("memory"))["used_memory"])
            await stack.redis.config_set("maxmemory", used * 8 // 5)  # 62 % full

            await wait_for(lambda: readyz(503), timeout_s=5)
            ready = (await stack.client.get("/readyz")).json()
            assert (ready["status"], ready["redis"], ready["workers"]) == ("unavailable", True, 1)
            assert "of its maxmemory" in ready["store_full"]
            turns = await turns_of(stack, "local")
            refused = [
                await stack.chat("while full"),
                await stack.client.post("/v1/conversations", json={}),
            ]
            for answer in refused:
                error = error_of(answer, 503)
                assert error["code"] == "store_full"
                assert "BERNARD_REDIS_MEMORY_GUARD" in error["message"]
                assert answer.headers["retry-after"] == "10"
            assert await turns_of(stack, "local") == turns
            assert (await stack.client.get("/v1/models")).status_code == 200  # reads go on

            # Without maxmemory, the limit is the machine's memory: room again.
            await stack.redis.config_set("maxmemory", 0)
            await wait_for(lambda: readyz(200), timeout_s=5)
            assert (await stack.chat("after")).status_code == 200


# -- tool calls waiting for a decision -------------------------------------------------------


def notes_to_save(*texts: str) -> Reply:
    return Reply.tool_calls([("save_note", {"text": text}) for text in texts])


async def waits_and_refusals(
    stack: Stack, conversation_id: str, upstream: ScriptedUpstream, *texts: str
) -> tuple[list[str], list[str]]:
    """A turn in a new conversation whose router asks to save `texts`: the summaries of the
    calls that wait for a decision, and the outputs of those refused."""
    await conversation(stack, conversation_id)
    upstream.script_router(notes_to_save(*texts))
    url = f"/v1/conversations/{conversation_id}/messages"
    events = await named(stack, "POST", url, json={"content": "remember these"})
    assert events[-1][1]["status"] == "awaiting_confirmation", events[-1]
    waiting = [data["summary"] for name, data in events if name == "awaiting_confirmation"]
    refused = [data["output"] for name, data in events if name == "tool_result"]
    return waiting, refused


async def test_a_step_waits_on_no_more_calls_than_a_conversation_may_hold(
    upstream: ScriptedUpstream, owners: Owners
) -> None:
    settings = make_settings(
        upstream, api_keys=owners.api_keys, max_pending_confirmations_per_conversation=2
    )
    async with run_stack(settings) as stack:
        waiting, refused = await waits_and_refusals(stack, "kitchen", upstream, "a", "b", "c")
        stored = await Archivist(stack.redis, owners.alice).proposals("kitchen")
    assert waiting == ["Remember “a”", "Remember “b”"]
    assert len(refused) == 1 and "not run" in refused[0]
    assert "BERNARD_MAX_PENDING_CONFIRMATIONS_PER_CONVERSATION" in refused[0]
    assert len(stored) == 2


async def test_a_user_holds_no_more_waiting_calls_than_the_budget_across_conversations(
    upstream: ScriptedUpstream, owners: Owners
) -> None:
    settings = make_settings(
        upstream, api_keys=owners.api_keys, max_pending_confirmations_per_user=3
    )
    async with run_stack(settings) as stack:
        first, _ = await waits_and_refusals(stack, "one", upstream, "a", "b")
        second, refused = await waits_and_refusals(stack, "two", upstream, "c", "d")
        assert (len(first), len(second), len(refused)) == (2, 1, 1)
        assert "BERNARD_MAX_PENDING_CONFIRMATIONS_PER_USER" in refused[0]

        # Deciding and deleting free the budget.
        for proposal in await Archivist(stack.redis, owners.alice).proposals("one"):
            decision = {"confirmation_id": proposal["confirmation_id"], "decision": "reject"}
            await stack.client.post(
                "/v1/conversations/one/resume", json=decision, headers=as_user("alice")
            )
        await stack.client.delete("/v1/conversations/two", headers=as_user("alice"))
        third, none_refused = await waits_and_refusals(stack, "three", upstream, "e", "f", "g")
    assert (len(third), none_refused) == (3, [])
