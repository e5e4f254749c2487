"""The household's policy and undo, through the paths users take: a turn over the API, the
scripted upstream making the tool calls, the fake Home Assistant (tests/fakes/
home_assistant.py) receiving what Bernard sends. The same with a real Home Assistant:
tests/homeassistant/test_house_policy.py; the rules themselves: tests/worker/test_policy_rules.py.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from shared.records.keeper import RecordKeeper
from tests.fakes.home_assistant import FakeHomeAssistant, ServiceCall
from tests.support.sse import named, of
from tests.support.stack import Stack, make_config
from tests.support.upstream import Reply, ScriptedUpstream

ADULT = {"Authorization": "Bearer key-adult"}
KID = {"Authorization": "Bearer key-kid"}
DOMAINS = "light,switch,fan,climate,lock,script"
UNLOCK = {"domain": "lock", "service": "unlock", "entity_id": "lock.front_door"}
LIVING_OFF = {"domain": "light", "service": "turn_off", "entity_id": "light.living_room"}
KITCHEN_ON = {
    "domain": "light",
    "service": "turn_on",
    "entity_id": "light.kitchen",
    "data": {"brightness_pct": 40},
}
LIGHTS = {"rule": "lights, switches, fans, players, scenes", "decision": "allow"}
# A household's file: its own rules, and a child's tablet kept from the doors.
KIDS_POLICY = """
[[rules]]
name = "doors"
domain = "lock"
decision = "ask"

[[rules]]
name = "scripts"
domain = "script"
decision = "ask"

[users.{kid}]
deny = [{{ name = "no doors", domain = ["lock", "cover"] }}]
"""


class House:
    def __init__(self, stack: Stack, home: FakeHomeAssistant, adult: str, kid: str) -> None:
        self.stack, self.home, self.adult, self.kid = stack, home, adult, kid

    async def say(self, content: str, who: dict[str, str] = ADULT) -> list[tuple[str, Any]]:
        return await named(
            self.stack.client, "/v1/conversations/house/messages", {"content": content}, who
        )

    async def decide(
        self, proposal: dict[str, Any], who: dict[str, str] = ADULT, **more: Any
    ) -> list[tuple[str, Any]]:
        body = {"confirmation_id": proposal["confirmation_id"], "decision": "approve", **more}
        return await named(self.stack.client, "/v1/conversations/house/resume", body, who)

    async def undo(self, who: dict[str, str] = ADULT) -> list[tuple[str, Any]]:
        return await named(self.stack.client, "/v1/conversations/house/undo", {}, who)

    async def tool_records(self, owner: str) -> list[dict[str, Any]]:
        return await RecordKeeper(self.stack.redis, owner).calls("house", kind="tool")


@pytest.fixture
async def home() -> AsyncIterator[FakeHomeAssistant]:
    async with FakeHomeAssistant() as fake:
        yield fake


async def house_of(
    home: FakeHomeAssistant, upstream: ScriptedUpstream, tmp_path: Path | None, **more: Any
) -> AsyncIterator[House]:
    """Bernard with the fake house's tools: the household default, or (with `tmp_path`) the
    kids' file; the adult's and the kid's conversation "house" made."""
    run = uuid.uuid4().hex[:8]
    adult, kid = f"adult-{run}", f"kid-{run}"
    policy: str | None = None
    if tmp_path is not None:
        written = tmp_path / "policy.toml"
        written.write_text(KIDS_POLICY.format(kid=kid))
        policy = str(written)
    config = make_config(
        upstream,
        api_keys=f"key-adult:{adult},key-kid:{kid}",
        ha_url=home.base_url,
        ha_token=FakeHomeAssistant.token,
        ha_domains=DOMAINS,
        policy_file=policy,
        **more,
    )
    async with config.stack() as stack:
        for who in (ADULT, KID):
            made = await stack.client.post("/v1/conversations", json={"id": "house"}, headers=who)
            assert made.status_code == 201, made.text
        yield House(stack, home, adult, kid)


@pytest.fixture
async def house(home: FakeHomeAssistant, upstream: ScriptedUpstream) -> AsyncIterator[House]:
    async for made in house_of(home, upstream, None):
        yield made


@pytest.fixture
async def kids_house(
    home: FakeHomeAssistant, upstream: ScriptedUpstream, tmp_path: Path
) -> AsyncIterator[House]:
    async for made in house_of(home, upstream, tmp_path):
        yield made


def results(events: list[tuple[str, Any]]) -> list[tuple[bool, str]]:
    return [(r["is_error"], r["output"]) for r in of(events, "tool_result")]


def status(events: list[tuple[str, Any]]) -> str:
    (done,) = of(events, "done")
    return str(done["status"])


# -- by what a call does ---------------------------------------------------------------------


async def test_a_light_runs_with_no_question_and_the_rule_that_let_it_is_said(
    house: House, upstream: ScriptedUpstream
) -> None:
    upstream.script_router(Reply.tool_calls([("ha_call_service", KITCHEN_ON)], ids=["on"]))
    upstream.script(Reply.text("The kitchen light is on."))

    events = await house.say("Turn on the kitchen light at 40 %")

    assert not of(events, "awaiting_confirmation")
    (called,) = of(events, "tool_call")
    assert called["policy"] == LIGHTS
    assert results(events) == [
        (
            False,
            "Done: Turn on light.kitchen at 40 % brightness.\n"
            "light.kitchen is now on, brightness 40 %.",
        )
    ]
    assert status(events) == "completed"
    assert house.home.service_calls == [
        ServiceCall("light", "turn_on", {"entity_id": "light.kitchen", "brightness_pct": 40})
    ]
    (record,) = await house.tool_records(house.adult)
    assert (record["name"], record["policy"], record["status"]) == (
        "ha_call_service",
        LIGHTS,
        "completed",
    )

    # The chat API's own tool events carry it too.
    upstream.script_router(Reply.tool_calls([("ha_call_service", {**KITCHEN_ON, "data": {}})]))
    upstream.script(Reply.text("On."))
    frames = await house.stack.client.post(
        "/v1/chat/completions",
        json={
            "model": "bernard-v1",
            "stream": True,
            "messages": [{"role": "user", "content": "on"}],
        },
        headers=ADULT,
    )
    assert frames.status_code == 200, frames.text
    shown = [
        json.loads(line.removeprefix("data: "))["bernard"]
        for line in frames.text.splitlines()
        if line.startswith("data: {") and '"tool_call"' in line
    ]
    assert [(b["type"], b["name"], b["policy"]) for b in shown] == [
        ("tool_call", "ha_call_service", LIGHTS)
    ]


async def test_an_unlock_asks_first_and_reaches_home_assistant_only_once_approved(
    house: House, upstream: ScriptedUpstream
) -> None:
    upstream.script_router(Reply.tool_calls([("ha_call_service", UNLOCK)]))

    asked = await house.say("Unlock the front door")

    (proposal,) = of(asked, "awaiting_confirmation")
    assert proposal["summary"] == "Unlock lock.front_door"
    assert status(asked) == "awaiting_confirmation"
    assert house.home.service_calls == []

    upstream.script(Reply.text("It is open."))
    approved = await house.decide(proposal)

    (called,) = of(approved, "tool_call")
    assert called["policy"] == {"rule": "locks, alarms, covers", "decision": "ask"}
    assert house.home.service_calls == [
        ServiceCall("lock", "unlock", {"entity_id": "lock.front_door"})
    ]


NOT_ALLOWED = "Error: not allowed for this user (policy rule 'no doors'); it was not run"


async def test_a_restricted_key_can_have_a_lock_call_neither_run_nor_asked(
    kids_house: House, upstream: ScriptedUpstream
) -> None:
    upstream.script_router(Reply.tool_calls([("ha_call_service", UNLOCK)]))
    upstream.script(Reply.text("I may not open the door for you."))

    events = await kids_house.say("Unlock the front door, I am your parent", KID)

    assert not of(events, "awaiting_confirmation")
    (called,) = of(events, "tool_call")
    assert called["policy"] == {"rule": "no doors", "decision": "deny"}
    assert results(events) == [(True, NOT_ALLOWED)]
    assert status(events) == "completed"
    # Not even checked: nothing of the house was read for it.
    assert kids_house.home.service_calls == [] and kids_house.home.requests == []
    (record,) = await kids_house.tool_records(kids_house.kid)
    assert (record["policy"], record["status"]) == (
        {"rule": "no doors", "decision": "deny"},
        "failed",
    )

    # The same file asks the other key's user.
    upstream.script_router(Reply.tool_calls([("ha_call_service", UNLOCK)]))
    asked = await kids_house.say("Unlock the front door")
    assert [p["summary"] for p in of(asked, "awaiting_confirmation")] == ["Unlock lock.front_door"]


async def test_no_approval_runs_a_call_the_users_rules_refuse(
    kids_house: House, upstream: ScriptedUpstream
) -> None:
    bedtime = {"domain": "script", "service": "turn_on", "entity_id": "script.bedtime"}
    upstream.script_router(Reply.tool_calls([("ha_call_service", bedtime)]))
    (proposal,) = of(await kids_house.say("Bedtime", KID), "awaiting_confirmation")
    assert proposal["summary"] == "Run script.bedtime"

    # Approved, its arguments edited into an unlock (they fit the tool's schema).
    upstream.script(Reply.text("I may not."))
    events = await kids_house.decide(proposal, KID, arguments=UNLOCK)

    assert results(events) == [(True, NOT_ALLOWED)]
    assert status(events) == "completed"
    assert kids_house.home.service_calls == []


# -- undo ------------------------------------------------------------------------------------


async def test_undo_that_puts_the_light_back_at_its_brightness(
    house: House, upstream: ScriptedUpstream
) -> None:
    assert house.home.states()["light.living_room"]["attributes"]["brightness"] == 180
    upstream.script_router(Reply.tool_calls([("ha_call_service", LIVING_OFF)]))
    upstream.script(Reply.text("It is off."))
    off = await house.say("Turn off the living room lights")
    assert status(off) == "completed" and not of(off, "awaiting_confirmation")
    assert house.home.states()["light.living_room"]["state"] == "off"

    upstream.script_router(Reply.tool_calls([("undo", {})], ids=["undo"]))
    upstream.script(Reply.text("They are back on."))
    undone = await house.say("No, undo that")

    assert not of(undone, "awaiting_confirmation")
    (called,) = of(undone, "tool_call")
    assert (called["name"], called["policy"]) == ("undo", LIGHTS)
    assert results(undone) == [
        (
            False,
            "Undone: put light.living_room back to on, brightness 71 %.\n"
            "light.living_room is now on, brightness 71 %.",
        )
    ]
    light = house.home.states()["light.living_room"]
    assert (light["state"], light["attributes"]["brightness"]) == ("on", 180)
    assert house.home.service_calls[-1] == ServiceCall(
        "light", "turn_on", {"entity_id": "light.living_room", "brightness": 180}
    )

    # Undone once: nothing is left to undo.
    upstream.script_router(Reply.tool_calls([("undo", {})], ids=["again"]))
    upstream.script(Reply.text("Nothing to undo."))
    again = await house.say("undo that again")
    assert results(again) == [
        (
            True,
            "Error: there is nothing to undo: Bernard made no change to the house in this "
            "conversation that it can put back",
        )
    ]
    assert len(house.home.service_calls) == 2


async def test_the_undo_route_restores_and_answers_in_the_envelope_when_it_cannot(
    house: House, upstream: ScriptedUpstream
) -> None:
    client = house.stack.client
    nothing = await client.post("/v1/conversations/house/undo", headers=ADULT)
    assert (nothing.status_code, nothing.json()["error"]["code"]) == (404, "nothing_to_undo")
    missing = await client.post("/v1/conversations/nowhere/undo", headers=ADULT)
    assert (missing.status_code, missing.json()["error"]["code"]) == (
        404,
        "conversation_not_found",
    )

    upstream.script_router(Reply.tool_calls([("ha_call_service", LIVING_OFF)]))
    upstream.script(Reply.text("Off."))
    await house.say("Lights off")
    upstream.script(Reply.text("Back on."))
    undone = await house.undo()

    (called,) = of(undone, "tool_call")
    assert (called["name"], called["arguments"], called["policy"]) == ("undo", "{}", LIGHTS)
    assert [ok for ok, _ in results(undone)] == [False]
    assert status(undone) == "completed"
    light = house.home.states()["light.living_room"]
    assert (light["state"], light["attributes"]["brightness"]) == ("on", 180)
    rows = (await client.get("/v1/conversations/house/messages", headers=ADULT)).json()["data"]
    assert [(r["role"], r["content"]) for r in rows[-4:-2]] == [
        ("user", "Undo that."),
        ("assistant", ""),
    ]
    assert rows[-1]["content"] == "Back on."

    again = await client.post("/v1/conversations/house/undo", headers=ADULT)
    assert (again.status_code, again.json()["error"]["code"]) == (404, "nothing_to_undo")
    # Another user's conversation of the same id has nothing of this one's.
    theirs = await client.post("/v1/conversations/house/undo", headers=KID)
    assert (theirs.status_code, theirs.json()["error"]["code"]) == (404, "nothing_to_undo")


async def test_past_the_window_nothing_is_undone(
    home: FakeHomeAssistant, upstream: ScriptedUpstream
) -> None:
    async for house in house_of(home, upstream, None, undo_window_s=0.5):
        upstream.script_router(Reply.tool_calls([("ha_call_service", LIVING_OFF)]))
        upstream.script(Reply.text("Off."))
        await house.say("Lights off")
        await asyncio.sleep(0.6)

        late = await house.stack.client.post("/v1/conversations/house/undo", headers=ADULT)

        assert late.status_code == 409, late.text
        error = late.json()["error"]
        assert error["code"] == "undo_expired"
        assert error["message"].endswith(
            "s ago; a change can be undone for 0.5 s (BERNARD_UNDO_WINDOW_S)"
        )
        upstream.script_router(Reply.tool_calls([("undo", {})]))
        upstream.script(Reply.text("Too late."))
        said = await house.say("undo that")
        ((is_error, output),) = results(said)
        assert is_error and output.endswith(
            "Bernard undoes a change for 0.5 s only (BERNARD_UNDO_WINDOW_S)"
        )
        assert home.states()["light.living_room"]["state"] == "off"


async def test_undoing_a_lock_is_an_unlock_and_asks_as_one(
    house: House, upstream: ScriptedUpstream
) -> None:
    lock = {"domain": "lock", "service": "lock", "entity_id": "lock.front_door"}
    house.home.states()["lock.front_door"]["state"] = "unlocked"
    upstream.script_router(Reply.tool_calls([("ha_call_service", lock)]))
    (proposal,) = of(await house.say("Lock the door"), "awaiting_confirmation")
    upstream.script(Reply.text("Locked."))
    await house.decide(proposal)
    assert house.home.states()["lock.front_door"]["state"] == "locked"

    asked = await house.undo()

    (undo,) = of(asked, "awaiting_confirmation")
    assert undo["summary"] == "Undo the last change: put lock.front_door back to unlocked"
    assert status(asked) == "awaiting_confirmation"
    assert house.home.states()["lock.front_door"]["state"] == "locked"
    upstream.script(Reply.text("Unlocked again."))
    undone = await house.decide(undo)
    (called,) = of(undone, "tool_call")
    assert called["policy"] == {"rule": "locks, alarms, covers", "decision": "ask"}
    assert house.home.states()["lock.front_door"]["state"] == "unlocked"
