"""The household's policy and undo against a real Home Assistant 2025.4, through Bernard's
pipeline (a turn over the conversation API, the scripted upstream making the tool calls),
the house read back through Home Assistant's REST API and every service call it ran read
from its websocket (tests/homeassistant/test_house_tools.py `ServiceCalls`).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.homeassistant.assist import reset_house
from tests.homeassistant.hass import HomeAssistant, HomeAssistantApi
from tests.homeassistant.test_house_tools import (
    ServiceCall,
    ServiceCalls,
    call,
    calls,
    placed,
)
from tests.support.sse import named, of
from tests.support.stack import Stack, make_config
from tests.support.upstream import Reply, ScriptedUpstream

# One Home Assistant per module (conftest.py): its tests on one xdist worker.
pytestmark = pytest.mark.xdist_group("test_house_policy")

__all__ = ["calls"]  # the fixture, as test_house_tools has it

ADULT_KEY, KID_KEY = "policy-adult-key-5d1e", "policy-kid-key-93ab"
ADULT = {"Authorization": f"Bearer {ADULT_KEY}"}
KID = {"Authorization": f"Bearer {KID_KEY}"}
UNLOCK = call("lock.front_door", "unlock")
LIGHTS = {"rule": "lights, switches, fans, players, scenes", "decision": "allow"}
# A household's own file: lights and fans run, the rest as declared (a write asks); the
# child's tablet may not touch a door nor anything in the kitchen.
KIDS = """
[[rules]]
domain = ["light", "fan"]
decision = "allow"

[users.{kid}]
deny = [
  {{ name = "no doors", domain = ["lock", "cover", "alarm_control_panel"] }},
  {{ name = "not the kitchen", area = "kitchen" }},
]
"""


class Home:
    """Bernard on the real Home Assistant, the adult's and the kid's conversation "home"."""

    def __init__(self, stack: Stack, upstream: ScriptedUpstream, ha: HomeAssistantApi) -> None:
        self.stack, self.upstream, self.ha = stack, upstream, ha

    async def post(
        self, route: str, body: dict[str, Any], who: dict[str, str] = ADULT
    ) -> list[tuple[str, Any]]:
        return await named(self.stack.client, f"/v1/conversations/home/{route}", body, who)

    async def say(self, content: str, who: dict[str, str] = ADULT) -> list[tuple[str, Any]]:
        return await self.post("messages", {"content": content}, who)

    async def state(self, entity: str) -> tuple[str, Any]:
        found = await self.ha.state(entity)
        return found["state"], found["attributes"].get("brightness")


@pytest.fixture
async def home(
    ha: HomeAssistantApi,
    home_assistant: HomeAssistant,
    upstream: ScriptedUpstream,
    calls: ServiceCalls,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> AsyncIterator[Home]:
    """The household default, or with `@pytest.mark.parametrize("home", ["kids"],
    indirect=True)` the kids' file."""
    await reset_house(ha)
    run = uuid.uuid4().hex[:8]
    kid = f"kid-{run}"
    policy: str | None = None
    if getattr(request, "param", None) == "kids":
        written = tmp_path / "policy.toml"
        written.write_text(KIDS.format(kid=kid))
        policy = str(written)
    config = make_config(
        upstream,
        api_keys=f"{ADULT_KEY}:adult-{run},{KID_KEY}:{kid}",
        ha_url=home_assistant.url,
        ha_token=home_assistant.token,
        ha_domains="light,fan,climate,lock",
        policy_file=policy,
    )
    async with config.stack() as stack:
        for who in (ADULT, KID):
            made = await stack.client.post("/v1/conversations", json={"id": "home"}, headers=who)
            assert made.status_code == 201, made.text
        await calls.clear()
        yield Home(stack, upstream, ha)


def results(events: list[tuple[str, Any]]) -> list[tuple[bool, str]]:
    return [(r["is_error"], r["output"]) for r in of(events, "tool_result")]


def status(events: list[tuple[str, Any]]) -> str:
    (done,) = of(events, "done")
    return str(done["status"])


async def test_turn_on_the_kitchen_light_runs_with_no_question(
    home: Home, calls: ServiceCalls
) -> None:
    home.upstream.script_router(Reply.tool_calls([call("light.kitchen", "turn_on")]))
    home.upstream.script(Reply.text("The kitchen light is on."))

    events = await home.say("Turn on the kitchen light")

    assert not of(events, "awaiting_confirmation")
    (called,) = of(events, "tool_call")
    assert called["policy"] == LIGHTS
    assert results(events) == [
        (
            False,
            "Done: Turn on light.kitchen.\n"
            "light.kitchen is now on, brightness 100 %.\n"
            "Also changed: input_boolean.kitchen_light is now on.",
        )
    ]
    assert status(events) == "completed"
    assert await home.state("light.kitchen") == ("on", 255)
    assert [c for c in await calls.settled() if c.domain == "light"] == [
        ServiceCall("light", "turn_on", {"entity_id": "light.kitchen"})
    ]


async def test_unlock_the_front_door_asks(home: Home, calls: ServiceCalls) -> None:
    home.upstream.script_router(Reply.tool_calls([UNLOCK]))

    events = await home.say("Unlock the front door")

    (proposal,) = of(events, "awaiting_confirmation")
    assert proposal["summary"] == "Unlock lock.front_door"
    assert status(events) == "awaiting_confirmation"
    assert not of(events, "tool_call")
    assert await calls.settled() == [], "nothing reaches Home Assistant before the answer"
    assert (await home.ha.state("lock.front_door"))["state"] == "locked"


NOT_ALLOWED = "Error: not allowed for this user (policy rule '{}'); it was not run"


@pytest.mark.parametrize("home", ["kids"], indirect=True)
async def test_a_restricted_key_cannot_have_a_lock_call_run_or_asked(
    home: Home, calls: ServiceCalls
) -> None:
    kitchen_on = call("light.kitchen", "turn_on")
    home.upstream.script_router(
        Reply.tool_calls([UNLOCK, kitchen_on, call("light.hall", "turn_on")])
    )
    home.upstream.script(Reply.text("I may only turn on the hall light for you."))

    async with placed(home.ha, "light.kitchen", "kitchen"):
        events = await home.say("Unlock the front door and turn on the lights", KID)

    assert not of(events, "awaiting_confirmation")
    assert [c["policy"] for c in of(events, "tool_call")] == [
        {"rule": "no doors", "decision": "deny"},
        {"rule": "not the kitchen", "decision": "deny"},
        {"rule": "rules[0]", "decision": "allow"},
    ]
    assert results(events) == [
        (True, NOT_ALLOWED.format("no doors")),
        (True, NOT_ALLOWED.format("not the kitchen")),
        (
            False,
            "Done: Turn on light.hall.\n"
            "light.hall is now on.\n"
            "Also changed: input_boolean.hall_light is now on.",
        ),
    ]
    assert status(events) == "completed"
    assert [c for c in await calls.settled() if c.domain in ("lock", "light")] == [
        ServiceCall("light", "turn_on", {"entity_id": "light.hall"})
    ]
    assert (await home.ha.state("lock.front_door"))["state"] == "locked"
    assert await home.state("light.kitchen") == ("off", None)

    # The adult, on the same file: asked (a lock call is a write no rule allows).
    home.upstream.script_router(Reply.tool_calls([UNLOCK]))
    asked = await home.say("Unlock the front door")
    assert [p["summary"] for p in of(asked, "awaiting_confirmation")] == ["Unlock lock.front_door"]


async def test_undo_that_after_a_light_went_off_turns_it_back_on_to_its_brightness(
    home: Home, calls: ServiceCalls
) -> None:
    home.upstream.script_router(
        Reply.tool_calls([call("light.kitchen", "turn_on", brightness_pct=40)])
    )
    home.upstream.script(Reply.text("On at 40 %."))
    await home.say("Kitchen light at 40 %")
    home.upstream.script_router(Reply.tool_calls([call("light.kitchen", "turn_off")]))
    home.upstream.script(Reply.text("Off."))
    off = await home.say("Turn off the kitchen light")
    assert not of(off, "awaiting_confirmation")
    assert await home.state("light.kitchen") == ("off", None)
    # The template light keeps its level while off; a real one may not: forget it, so only
    # the brightness undo sends brings 40 % back.
    await home.ha.call_service(
        "input_number", "set_value", entity_id="input_number.kitchen_light_level", value=255
    )
    await calls.clear()

    home.upstream.script_router(Reply.tool_calls([("undo", {})]))
    home.upstream.script(Reply.text("It is back on."))
    undone = await home.say("Oops, undo that")

    assert not of(undone, "awaiting_confirmation")
    assert [c["name"] for c in of(undone, "tool_call")] == ["undo"]
    assert results(undone) == [
        (
            False,
            "Undone: put light.kitchen back to on, brightness 40 %.\n"
            "light.kitchen is now on, brightness 40 %.\n"
            "Also changed: input_number.kitchen_light_level is now 102.0.\n"
            "Also changed: input_boolean.kitchen_light is now on.",
        )
    ]
    assert await home.state("light.kitchen") == ("on", 102)
    assert [c for c in await calls.settled() if c.domain == "light"] == [
        ServiceCall("light", "turn_on", {"entity_id": "light.kitchen", "brightness": 102})
    ]

    # The button's route: off once more, and back.
    home.upstream.script_router(Reply.tool_calls([call("light.kitchen", "turn_off")]))
    home.upstream.script(Reply.text("Off."))
    await home.say("Off again")
    await home.ha.call_service(
        "input_number", "set_value", entity_id="input_number.kitchen_light_level", value=255
    )
    home.upstream.script(Reply.text("Back on."))
    pressed = await home.post("undo", {})
    assert [ok for ok, _ in results(pressed)] == [False]
    assert await home.state("light.kitchen") == ("on", 102)
