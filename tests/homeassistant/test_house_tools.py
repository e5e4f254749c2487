"""Bernard's own Home Assistant tools (worker/tools/home_assistant/) against a real Home
Assistant 2025.4, through Bernard's pipeline: a turn over the API, the scripted upstream
making the tool calls, the user's decision over the API, and the house read back through Home
Assistant's REST API. Every service call Home Assistant runs meanwhile is read from its
websocket (`call_service` events: `ServiceCalls`), so "never reached Home Assistant" is seen
where it would show, not inferred from Bernard's side.

Where the scripted Home Assistant (tests/fakes/home_assistant.py) claims an answer of the
real one (`200 []` for an entity it does not have, a bare 500 for a value it refuses), the
test asks the real one first, so the claim and the tool are held to the same house.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from httpx_sse import EventSource

from tests.homeassistant.assist import reset_house
from tests.homeassistant.hass import HomeAssistant, HomeAssistantApi
from tests.support.processes import wait_for
from tests.support.stack import Config, Stack, make_config
from tests.support.upstream import Reply, ScriptedUpstream
from worker.tools.home_assistant.client import area_template

# One Home Assistant per module (conftest.py): its tests on one xdist worker.
pytestmark = pytest.mark.xdist_group("test_house_tools")

KEY = "house-tools-key-7b21"
HEADERS = {"Authorization": f"Bearer {KEY}"}
SSE = {"Accept": "text/event-stream"}
CONVERSATION = "house"
MARK = "bernard_test_mark"
SERVER_ERROR = "500 Internal Server Error\n\nServer got itself in trouble"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "home_assistant"


@dataclass
class ServiceCall:
    domain: str
    service: str
    data: dict[str, Any]


@dataclass
class ServiceCalls:
    """The service calls Home Assistant runs while a test runs, from its `call_service`
    events. `settled()` fires an event of its own and waits for it: a websocket sends events
    in the order Home Assistant fired them, so every call made before is in by then."""

    ha: HomeAssistantApi
    seen: list[ServiceCall] = field(default_factory=list)
    marks: dict[str, asyncio.Event] = field(default_factory=dict)

    async def listen(self, ready: asyncio.Event) -> None:
        async with self.ha.websocket() as ws:
            for n, event_type in enumerate(["call_service", MARK], start=1):
                await ws.send(
                    json.dumps({"id": n, "type": "subscribe_events", "event_type": event_type})
                )
                assert json.loads(await ws.recv())["success"] is True
            ready.set()
            async for raw in ws:
                event = json.loads(raw)["event"]
                if event["event_type"] == MARK:
                    self.marks[event["data"]["mark"]].set()
                else:
                    data = event["data"]
                    self.seen.append(
                        ServiceCall(data["domain"], data["service"], data["service_data"])
                    )

    async def settled(self) -> list[ServiceCall]:
        mark = uuid.uuid4().hex
        arrived = self.marks[mark] = asyncio.Event()
        response = await self.ha.http.post(f"/api/events/{MARK}", json={"mark": mark})
        response.raise_for_status()
        async with asyncio.timeout(30):
            await arrived.wait()
        return list(self.seen)

    async def clear(self) -> None:
        await self.settled()
        self.seen.clear()


@dataclass
class House:
    """A Bernard whose Home Assistant tools reach the real Home Assistant (the default
    BERNARD_HA_DOMAINS: light, switch, fan, climate, cover, media_player, scene, script;
    no lock), and that Home Assistant's service calls."""

    stack: Stack
    upstream: ScriptedUpstream
    ha: HomeAssistantApi
    calls: ServiceCalls

    async def turn(self, content: str) -> list[tuple[str, Any]]:
        return await turn(self.stack, content)

    async def decide(self, proposal: dict[str, Any], decision: str) -> list[tuple[str, Any]]:
        body = {"confirmation_id": proposal["confirmation_id"], "decision": decision}
        return await named(self.stack, f"/v1/conversations/{CONVERSATION}/resume", body)


async def turn(stack: Stack, content: str) -> list[tuple[str, Any]]:
    """A user message's turn: its named events, to `done`."""
    return await named(stack, f"/v1/conversations/{CONVERSATION}/messages", {"content": content})


async def named(stack: Stack, url: str, body: dict[str, Any]) -> list[tuple[str, Any]]:
    async with stack.client.stream("POST", url, json=body, headers={**HEADERS, **SSE}) as response:
        assert response.status_code == 200, await response.aread()
        return [
            (sse.event, json.loads(sse.data)) async for sse in EventSource(response).aiter_sse()
        ]


def of(events: list[tuple[str, Any]], name: str) -> list[Any]:
    return [data for event, data in events if event == name]


def results(events: list[tuple[str, Any]]) -> dict[str, tuple[bool, str]]:
    """Each tool result by its call's id: (is_error, what the model reads)."""
    return {r["tool_call_id"]: (r["is_error"], r["output"]) for r in of(events, "tool_result")}


def status(events: list[tuple[str, Any]]) -> str:
    (done,) = of(events, "done")
    return str(done["status"])


def settings_for(
    upstream: ScriptedUpstream, home: HomeAssistant, token: str | None = None, **more: Any
) -> Config:
    user = f"house-{uuid.uuid4().hex[:8]}"
    return make_config(
        upstream, api_keys=f"{KEY}:{user}", ha_url=home.url, ha_token=token or home.token, **more
    )


@contextlib.asynccontextmanager
async def bernard(config: Config) -> AsyncIterator[Stack]:
    async with config.stack() as stack:
        made = await stack.client.post(
            "/v1/conversations", json={"id": CONVERSATION}, headers=HEADERS
        )
        assert made.status_code == 201, made.text
        yield stack


@pytest.fixture
async def calls(ha: HomeAssistantApi) -> AsyncIterator[ServiceCalls]:
    recorder = ServiceCalls(ha)
    ready = asyncio.Event()
    task = asyncio.create_task(recorder.listen(ready))
    try:
        async with asyncio.timeout(30):
            await ready.wait()
        yield recorder
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.fixture
async def house(
    ha: HomeAssistantApi,
    home_assistant: HomeAssistant,
    upstream: ScriptedUpstream,
    calls: ServiceCalls,
) -> AsyncIterator[House]:
    await reset_house(ha)
    async with bernard(settings_for(upstream, home_assistant)) as stack:
        await calls.clear()
        yield House(stack, upstream, ha, calls)


def call(entity: str, service: str, **data: Any) -> tuple[str, dict[str, Any]]:
    """An `ha_call_service` tool call on `entity`, in its own domain unless `domain=` says."""
    domain = data.pop("domain", entity.split(".", 1)[0])
    args: dict[str, Any] = {"domain": domain, "service": service, "entity_id": entity}
    if data:
        args["data"] = data
    return ("ha_call_service", args)


# -- reading ---------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def placed(ha: HomeAssistantApi, entity_id: str, area_id: str) -> AsyncIterator[None]:
    """The entity in that area (one of those Home Assistant's onboarding makes: Living Room,
    Kitchen, Bedroom), then in none again; and an empty area whose name needs escaping in
    JSON written for HTML, as Jinja's `tojson` writes it."""
    await ha.command("config/entity_registry/update", entity_id=entity_id, area_id=area_id)
    kids = await ha.command("config/area_registry/create", name="Kid's room")
    try:
        yield
    finally:
        await ha.command("config/area_registry/delete", area_id=kids["area_id"])
        await ha.command("config/entity_registry/update", entity_id=entity_id, area_id=None)


async def test_the_tools_list_the_house_by_domain_and_by_area_and_read_a_state(
    house: House,
) -> None:
    house.upstream.script_router(
        Reply.tool_calls(
            [
                ("ha_list_entities", {"domain": "light"}),
                ("ha_list_entities", {"area": "kitchen"}),
                ("ha_list_entities", {"area": "bedroom"}),
                ("ha_list_entities", {"area": "kid's room"}),
                ("ha_list_entities", {"area": "hall", "domain": "light"}),
                ("ha_list_entities", {"area": "attic"}),
                ("ha_get_state", {"entity_id": "climate.living_room"}),
            ],
            ids=["lights", "kitchen", "bedroom", "kids", "hall", "attic", "thermostat"],
        )
    )
    house.upstream.script(Reply.text("Here is your house."))
    async with placed(house.ha, "light.kitchen", "kitchen"):
        events = await house.turn("What is in the house?")
        # What the tools read, as the fake Home Assistant renders it too.
        rendered = {
            area: await house.ha.http.post("/api/template", json={"template": area_template(area)})
            for area in ("kitchen", "kid's room", "attic")
        }

    assert {area: (r.status_code, r.text) for area, r in rendered.items()} == {
        "kitchen": (200, '{"area": "Kitchen", "entities": ["light.kitchen"]}'),
        "kid's room": (200, '{"area": "Kid\\u0027s room", "entities": []}'),
        "attic": (200, '{"area": null, "entities": []}'),
    }

    thermostat = await house.ha.state("climate.living_room")
    assert results(events) == {
        "lights": (
            False,
            "Home Assistant light entities: 2\n"
            "- light.hall “Hall light”: off\n"
            "- light.kitchen “Kitchen light”: off",
        ),
        "kitchen": (
            False,
            "Home Assistant entities in the area “Kitchen”: 1\n"
            "- light.kitchen “Kitchen light”: off",
        ),
        "bedroom": (False, "Home Assistant has no entities in the area “Bedroom”."),
        "kids": (False, "Home Assistant has no entities in the area “Kid's room”."),
        "hall": (
            False,
            "Home Assistant light entities whose name mentions “hall” (Home Assistant has no "
            "area “hall”): 1\n"
            "- light.hall “Hall light”: off",
        ),
        "attic": (False, "Home Assistant has no area “attic”, and no entity's name mentions it."),
        "thermostat": (
            False,
            "climate.living_room “Living room” is off, 19.5° now, set to 20°.\n"
            f"Last changed: {thermostat['last_changed']}\n"
            "Attributes:\n"
            '- hvac_modes: ["heat", "off"]\n'
            "- min_temp: 7.0\n"
            "- max_temp: 30.0\n"
            "- target_temp_step: 0.1\n"
            "- current_temperature: 19.5\n"
            "- temperature: 20.0\n"
            "- hvac_action: off\n"
            "- supported_features: 385",
        ),
    }
    assert status(events) == "completed"
    assert await house.calls.settled() == []


# -- changing the house, once approved -------------------------------------------------------


@pytest.mark.parametrize(
    ("asked", "summary", "done", "sent", "entity", "now"),
    [
        (
            call("light.kitchen", "turn_on", brightness_pct=40),
            "Turn on light.kitchen at 40 % brightness",
            "Done: Turn on light.kitchen at 40 % brightness.\n"
            "light.kitchen is now on, brightness 40 %.\n"
            "Also changed: input_number.kitchen_light_level is now 102.0.\n"
            "Also changed: input_boolean.kitchen_light is now on.",
            ServiceCall("light", "turn_on", {"entity_id": "light.kitchen", "brightness_pct": 40}),
            "light.kitchen",
            ("on", "brightness", 102),
        ),
        (
            call("climate.living_room", "set_temperature", temperature=22.5),
            "Set climate.living_room to 22.5°",
            "Done: Set climate.living_room to 22.5°.\n"
            "climate.living_room is now off, 19.5° now, set to 22.5°.",
            ServiceCall(
                "climate",
                "set_temperature",
                {"entity_id": "climate.living_room", "temperature": 22.5},
            ),
            "climate.living_room",
            ("off", "temperature", 22.5),
        ),
        # fan is among the default domains (the demo home models its fan as a switch).
        (
            call("fan.ceiling", "turn_on"),
            "Turn on fan.ceiling",
            "Done: Turn on fan.ceiling.\n"
            "fan.ceiling is now on.\n"
            "Also changed: input_boolean.ceiling_fan is now on.",
            ServiceCall("fan", "turn_on", {"entity_id": "fan.ceiling"}),
            "fan.ceiling",
            ("on", "friendly_name", "Ceiling fan"),
        ),
    ],
    ids=["light", "thermostat", "fan"],
)
async def test_an_approved_call_changes_the_real_house_once(
    house: House,
    asked: tuple[str, dict[str, Any]],
    summary: str,
    done: str,
    sent: ServiceCall,
    entity: str,
    now: tuple[str, str, Any],
) -> None:
    house.upstream.script_router(Reply.tool_calls([asked], ids=["change"]))
    proposed = await house.turn("Please change it")
    (proposal,) = of(proposed, "awaiting_confirmation")
    assert proposal["summary"] == summary
    assert status(proposed) == "awaiting_confirmation"
    assert await house.calls.settled() == [], "nothing reaches Home Assistant before approval"

    house.upstream.script(Reply.text("Done."))
    approved = await house.decide(proposal, "approve")

    assert results(approved) == {"change": (False, done)}
    assert status(approved) == "completed"
    state = await house.ha.state(entity)
    assert (state["state"], now[1], state["attributes"][now[1]]) == now
    # Bernard's one call, then what the template entity's own actions called.
    assert [c for c in await house.calls.settled() if c.domain == sent.domain] == [sent]


# -- what never reaches Home Assistant ---------------------------------------------------------

UNLOCK = call("lock.front_door", "unlock")


async def test_a_domain_outside_bernard_ha_domains_never_reaches_home_assistant(
    house: House,
) -> None:
    house.upstream.script_router(Reply.tool_calls([UNLOCK], ids=["unlock"]))
    house.upstream.script(Reply.text("I may not unlock doors."))

    events = await house.turn("Unlock the front door")

    assert not of(events, "awaiting_confirmation")
    ((is_error, output),) = results(events).values()
    assert is_error is True
    assert output.startswith("Error: invalid arguments for tool 'ha_call_service': domain")
    assert status(events) == "completed"
    assert await house.calls.settled() == []
    assert (await house.ha.state("lock.front_door"))["state"] == "locked"


async def test_an_edited_approval_never_reaches_home_assistant_with_what_it_may_not_do(
    house: House,
) -> None:
    house.upstream.script_router(Reply.tool_calls([call("climate.living_room", "turn_on")]))
    (proposal,) = of(await house.turn("Heating on, please"), "awaiting_confirmation")

    async def approve_as(args: dict[str, Any]) -> httpx.Response:
        return await house.stack.client.post(
            f"/v1/conversations/{CONVERSATION}/resume",
            json={
                "confirmation_id": proposal["confirmation_id"],
                "decision": "approve",
                "arguments": args,
            },
            headers={**HEADERS, **SSE},
        )

    # Another domain: refused by the API, the call still waiting.
    unlocked = await approve_as(UNLOCK[1])
    assert unlocked.status_code == 400, unlocked.text
    assert unlocked.json()["error"]["param"] == "arguments.domain"
    # A value the thermostat refuses: checked again before anything is sent.
    house.upstream.script(Reply.text("It only goes up to 30°."))
    too_hot = await approve_as(call("climate.living_room", "set_temperature", temperature=40)[1])
    assert too_hot.status_code == 200, too_hot.text
    events = [(sse.event, json.loads(sse.data)) for sse in EventSource(too_hot).iter_sse()]

    assert [(r["is_error"], r["output"]) for r in of(events, "tool_result")] == [
        (
            True,
            "Error: climate.living_room accepts a temperature from 7° to 30°, not 40°; nothing "
            "was sent to Home Assistant",
        )
    ]
    assert status(events) == "completed"
    assert await house.calls.settled() == []
    assert (await house.ha.state("lock.front_door"))["state"] == "locked"
    thermostat = await house.ha.state("climate.living_room")
    assert (thermostat["state"], thermostat["attributes"]["temperature"]) == ("off", 20)


async def test_a_call_on_an_entity_home_assistant_does_not_have_is_never_done(
    house: House,
) -> None:
    # What Home Assistant answers such a call: success, having done nothing.
    direct = await house.ha.http.post(
        "/api/services/light/turn_on", json={"entity_id": "light.attic"}
    )
    assert (direct.status_code, direct.json()) == (200, [])
    await house.calls.clear()
    house.upstream.script_router(Reply.tool_calls([call("light.attic", "turn_on")], ids=["attic"]))
    house.upstream.script(Reply.text("There is no attic light."))

    events = await house.turn("Turn on the attic light")

    assert not of(events, "awaiting_confirmation")
    assert results(events) == {
        "attic": (
            True,
            "Error: Home Assistant has no entity light.attic, so light.turn_on would do "
            "nothing; call ha_list_entities for the ids",
        )
    }
    assert status(events) == "completed"
    assert await house.calls.settled() == []


async def test_a_temperature_above_the_thermostats_maximum_is_refused_before_anyone_is_asked(
    house: House, home_assistant: HomeAssistant
) -> None:
    # What Home Assistant's REST API answers it: a bare 500, the reason only in its log.
    mark = home_assistant.log_mark()
    direct = await house.ha.http.post(
        "/api/services/climate/set_temperature",
        json={"entity_id": "climate.living_room", "temperature": 40},
    )
    assert (direct.status_code, direct.text) == (500, SERVER_ERROR)
    said = "Provided temperature 40.0 is not valid. Accepted range is 7.0 to 30.0"
    assert said in await home_assistant.logged_since(mark, said)
    await house.calls.clear()
    too_hot = call("climate.living_room", "set_temperature", temperature=40)
    house.upstream.script_router(Reply.tool_calls([too_hot], ids=["heat"]))
    house.upstream.script(Reply.text("The thermostat only goes up to 30°."))

    events = await house.turn("Heat the living room to 40")

    assert not of(events, "awaiting_confirmation")
    assert results(events) == {
        "heat": (
            True,
            "Error: climate.living_room accepts a temperature from 7° to 30°, not 40°; nothing "
            "was sent to Home Assistant",
        )
    }
    assert status(events) == "completed"
    assert await house.calls.settled() == []
    assert (await house.ha.state("climate.living_room"))["attributes"]["temperature"] == 20


NOT_SENT = "; nothing was sent to Home Assistant"
BAD_REQUEST = "400: Bad Request"
# Calls that can never do what they say, each with what Home Assistant's REST API answers
# it (status, body; None: a body not compared) and what the model reads instead.
CANNOT_RUN: dict[str, tuple[tuple[str, dict[str, Any]], int, str | None, str]] = {
    # A light service on the lock: Home Assistant does nothing and says it succeeded.
    "lock": (
        call("lock.front_door", "turn_on", domain="light"),
        200,
        "[]",
        "Error: lock.front_door is not a light entity; call light services on light.* entities",
    ),
    # A second target in data: Home Assistant acts on it (here instead of the kitchen).
    "widened": (
        call("light.kitchen", "turn_on", entity_id="light.hall"),
        200,
        None,
        "Error: data may not hold entity_id: a call acts on its one entity_id",
    ),
    # An option the service does not take, a number outside its range or not a number at
    # all, a service the domain does not have: a plain 400.
    "option": (
        call("light.kitchen", "turn_on", speed=3),
        400,
        BAD_REQUEST,
        "Error: light.turn_on takes no speed; the options it takes are brightness, "
        "brightness_pct, brightness_step, brightness_step_pct, color_name, color_temp, "
        "color_temp_kelvin, effect, flash, hs_color, profile, rgb_color, rgbw_color, "
        f"rgbww_color, transition, white, xy_color{NOT_SENT}",
    ),
    "bright": (
        call("light.kitchen", "turn_on", brightness_pct=150),
        400,
        BAD_REQUEST,
        f"Error: brightness_pct must be from 0 to 100, not 150{NOT_SENT}",
    ),
    "text": (
        call("climate.living_room", "set_temperature", temperature="hot"),
        400,
        BAD_REQUEST,
        f'Error: temperature must be a number, not "hot"{NOT_SENT}',
    ),
    # A number written as text is read as the number: out of range as the number is.
    "bright text": (
        call("light.kitchen", "turn_on", brightness_pct="150"),
        400,
        BAD_REQUEST,
        f"Error: brightness_pct must be from 0 to 100, not 150{NOT_SENT}",
    ),
    "hot text": (
        call("climate.living_room", "set_temperature", temperature="40"),
        500,
        SERVER_ERROR,
        f"Error: climate.living_room accepts a temperature from 7° to 30°, not 40°{NOT_SENT}",
    ),
    "service": (
        call("light.kitchen", "open_cover"),
        400,
        BAD_REQUEST,
        f"Error: Home Assistant has no service light.open_cover{NOT_SENT}",
    ),
    # A feature the entity lacks (the fan's speed, the thermostat's range): a bare 500.
    "feature": (
        call("fan.ceiling", "set_percentage", percentage=30),
        500,
        SERVER_ERROR,
        f"Error: fan.ceiling does not support fan.set_percentage{NOT_SENT}",
    ),
    "range": (
        call("climate.living_room", "set_temperature", target_temp_low=18, target_temp_high=22),
        500,
        SERVER_ERROR,
        f"Error: climate.living_room keeps one temperature: set temperature{NOT_SENT}",
    ),
    # A preset on a fan that has none: a bare 500.
    "preset": (
        call("fan.ceiling", "turn_on", preset_mode="auto"),
        500,
        SERVER_ERROR,
        f'Error: fan.ceiling has no preset_mode "auto": it has no preset_modes{NOT_SENT}',
    ),
    # An effect on a light that has none: the light comes on, the effect is dropped.
    "effect": (
        call("light.kitchen", "turn_on", effect="rainbow"),
        200,
        None,
        f'Error: light.kitchen has no effect "rainbow": it has no effect_list{NOT_SENT}',
    ),
    # A mode the thermostat does not list: Home Assistant 2025.4 only logs a warning, and
    # the generic thermostat takes "cool" and turns its heater on.
    "mode": (
        call("climate.living_room", "set_hvac_mode", hvac_mode="cool"),
        200,
        None,
        'Error: climate.living_room has no hvac_mode "cool"; its hvac_modes are heat, '
        f"off{NOT_SENT}",
    ),
}


async def test_calls_that_can_never_run_are_refused_before_they_are_proposed(
    house: House,
) -> None:
    for name, ((_, args), status_code, body, _) in CANNOT_RUN.items():
        direct = await house.ha.http.post(
            f"/api/services/{args['domain']}/{args['service']}",
            json={"entity_id": args["entity_id"], **args.get("data", {})},
        )
        said = direct.text if body is not None else None
        assert (direct.status_code, said) == (status_code, body), name
    assert (await house.ha.state("light.hall"))["state"] == "on", "widened reached the hall"
    kitchen = await house.ha.state("light.kitchen")
    assert (kitchen["state"], kitchen["attributes"].get("effect")) == ("on", None)
    assert (await house.ha.state("climate.living_room"))["state"] == "cool"
    assert (await house.ha.state("input_boolean.boiler"))["state"] == "on"
    await reset_house(house.ha)
    await house.calls.clear()
    house.upstream.script_router(
        Reply.tool_calls([c for c, *_ in CANNOT_RUN.values()], ids=list(CANNOT_RUN))
    )
    house.upstream.script(Reply.text("None of that can be done."))

    events = await house.turn("Do all of it")

    assert not of(events, "awaiting_confirmation")
    assert results(events) == {name: (True, error) for name, (*_, error) in CANNOT_RUN.items()}
    assert status(events) == "completed"
    assert await house.calls.settled() == []


# -- scenes and scripts ------------------------------------------------------------------------


async def approve(house: House, asked: tuple[str, dict[str, Any]], summary: str) -> str:
    """Propose the call, approve it, and return what the model read of it."""
    house.upstream.script_router(Reply.tool_calls([asked], ids=["run"]))
    (proposal,) = of(await house.turn("Go on"), "awaiting_confirmation")
    assert proposal["summary"] == summary
    house.upstream.script(Reply.text("Done."))
    approved = await house.decide(proposal, "approve")
    assert status(approved) == "completed"
    ((is_error, output),) = results(approved).values()
    assert is_error is False, output
    return output


async def test_a_scene_reads_as_activated_not_as_a_state_that_is_a_timestamp(
    house: House,
) -> None:
    output = await approve(
        house, call("scene.movie_night", "turn_on"), "Activate scene.movie_night"
    )

    scene = await house.ha.state("scene.movie_night")
    # A scene's state is when it was last activated.
    assert scene["state"].startswith(scene["last_changed"][:10])
    assert output == (
        "Done: Activate scene.movie_night.\n"
        f"scene.movie_night was activated at {scene['state']}.\n"
        "Also changed: input_boolean.hall_light is now on.\n"
        "Also changed: light.hall is now on."
    )
    assert (await house.ha.state("light.hall"))["state"] == "on"
    assert (await house.ha.state("light.kitchen"))["state"] == "off"


# -- the token ---------------------------------------------------------------------------------


async def user_token(ha: HomeAssistantApi, username: str, password: str) -> str:
    """A new person who is not an administrator, logged in as Home Assistant's login page
    does it; their access token."""
    user = await ha.command("config/auth/create", name=username, group_ids=["system-users"])
    await ha.command(
        "config/auth_provider/homeassistant/create",
        user_id=user["user"]["id"],
        username=username,
        password=password,
    )
    client_id = f"{ha.home.url}/"
    async with httpx.AsyncClient(base_url=ha.home.url, timeout=30.0) as http:
        flow = await http.post(
            "/auth/login_flow",
            json={
                "client_id": client_id,
                "handler": ["homeassistant", None],
                "redirect_uri": f"{ha.home.url}/?auth_callback=1",
            },
        )
        flow.raise_for_status()
        logged_in = await http.post(
            f"/auth/login_flow/{flow.json()['flow_id']}",
            json={"client_id": client_id, "username": username, "password": password},
        )
        logged_in.raise_for_status()
        assert logged_in.json()["type"] == "create_entry", logged_in.json()
        tokens = await http.post(
            "/auth/token",
            data={
                "grant_type": "authorization_code",
                "code": logged_in.json()["result"],
                "client_id": client_id,
            },
        )
        tokens.raise_for_status()
    return str(tokens.json()["access_token"])


async def list_kitchen(upstream: ScriptedUpstream, settings: Config) -> tuple[bool, str]:
    """What the model reads of listing the kitchen's entities with these settings."""
    upstream.script_router(Reply.tool_calls([("ha_list_entities", {"area": "Kitchen"})]))
    upstream.script(Reply.text("I could not read the house."))
    async with bernard(settings) as stack:
        events = await turn(stack, "What is in the kitchen?")
    assert status(events) == "completed"
    ((is_error, output),) = results(events).values()
    return is_error, output


async def test_a_bad_token_is_reported_as_the_token_and_a_non_administrators_as_its_rights(
    ha: HomeAssistantApi, home_assistant: HomeAssistant, upstream: ScriptedUpstream
) -> None:
    # Home Assistant answers both with the same 401: the states are read first to tell them.
    bad = await list_kitchen(upstream, settings_for(upstream, home_assistant, "nope"))
    visitor = await user_token(ha, f"visitor{uuid.uuid4().hex[:6]}", "a-long-passphrase-81")
    not_admin = await list_kitchen(upstream, settings_for(upstream, home_assistant, visitor))

    assert bad == (
        True,
        "Error: Home Assistant refused the request (HTTP 401); check BERNARD_HA_TOKEN (a "
        "long-lived access token from a Home Assistant profile)",
    )
    assert not_admin == (
        True,
        "Error: Home Assistant refused the request (HTTP 401); listing by area renders a "
        "template, which Home Assistant allows only with an administrator's token: use an "
        "administrator's token in BERNARD_HA_TOKEN, or list by domain instead",
    )


async def test_a_script_runs_and_reads_as_it_ended(house: House) -> None:
    hall = {"entity_id": "input_boolean.hall_light"}
    await house.ha.call_service("input_boolean", "turn_on", **hall)

    started = await approve(house, call("script.good_night", "turn_on"), "Run script.good_night")

    # script.turn_on answers once the run has started; it may end before or after that.
    assert started.startswith("Done: Run script.good_night.\nscript.good_night is ")

    async def hall_off() -> bool:
        return (await house.ha.state("light.hall"))["state"] == "off"

    await wait_for(hall_off, 30)
    await house.ha.call_service("input_boolean", "turn_on", **hall)

    # The script's own service answers once it has ended: the script twice, on then off.
    ran = await approve(house, call("script.good_night", "good_night"), "Run script.good_night")

    assert ran == (
        "Done: Run script.good_night.\n"
        "script.good_night is not running.\n"
        "Also changed: input_boolean.hall_light is now off.\n"
        "Also changed: light.hall is now off."
    )
    assert (await house.ha.state("light.hall"))["state"] == "off"
    assert [c for c in await house.calls.settled() if c.domain == "script"] == [
        ServiceCall("script", "turn_on", {"entity_id": "script.good_night"}),
        ServiceCall("script", "good_night", {"entity_id": "script.good_night"}),
    ]


async def test_a_call_whose_answer_never_came_may_have_run_and_is_not_sent_again(
    ha: HomeAssistantApi,
    home_assistant: HomeAssistant,
    upstream: ScriptedUpstream,
    calls: ServiceCalls,
) -> None:
    await reset_house(ha)
    # Bernard waits 2.5 s for each request (the reads before the call too); the script takes
    # 5 s, and Home Assistant runs a call to its end whatever happens to its request.
    settings = settings_for(upstream, home_assistant, tool_http_timeout_s=2.5)
    async with bernard(settings) as stack:
        await calls.clear()
        house = House(stack, upstream, ha, calls)
        slowly = call("script.hall_light_slowly", "hall_light_slowly")
        house.upstream.script_router(Reply.tool_calls([slowly], ids=["slowly"]))
        (proposal,) = of(await house.turn("Hall light, slowly"), "awaiting_confirmation")
        house.upstream.script(Reply.text("It may be on."))
        approved = await house.decide(proposal, "approve")

    assert results(approved) == {
        "slowly": (
            True,
            "Error: Home Assistant did not answer within 2.5s; the call may have run all the "
            "same: check with ha_get_state before trying again",
        )
    }
    assert status(approved) == "completed"

    async def hall_on() -> bool:
        return (await ha.state("light.hall"))["state"] == "on"

    await wait_for(hall_on, 30)  # it did run
    assert [c for c in await calls.settled() if c.domain == "script"] == [
        ServiceCall("script", "hall_light_slowly", {"entity_id": "script.hall_light_slowly"})
    ], "a call that may have run is never sent again"


# -- confirmations in words ---------------------------------------------------------------------


@pytest.fixture
async def doors(
    ha: HomeAssistantApi,
    home_assistant: HomeAssistant,
    upstream: ScriptedUpstream,
    calls: ServiceCalls,
) -> AsyncIterator[House]:
    """`house`, with the locks among the domains Bernard may call."""
    await reset_house(ha)
    settings = settings_for(upstream, home_assistant, ha_domains="light,lock")
    async with bernard(settings) as stack:
        await calls.clear()
        yield House(stack, upstream, ha, calls)


def sdk(house: House) -> openai.AsyncOpenAI:
    """The plain `openai` SDK on this Bernard, as any chat client is."""
    return openai.AsyncOpenAI(base_url=f"{house.stack.base_url}/v1", api_key=KEY, max_retries=0)


async def test_unlock_asks_in_words_and_a_plain_sdk_resending_the_history_says_yes(
    doors: House,
) -> None:
    client = sdk(doors)
    doors.upstream.script_router(Reply.tool_calls([UNLOCK]))
    asked = await client.chat.completions.create(
        model="bernard-v1", messages=[{"role": "user", "content": "unlock the front door"}]
    )
    question = asked.choices[0].message.content
    assert question == "Shall I unlock lock.front_door?"
    assert (await doors.ha.state("lock.front_door"))["state"] == "locked"
    assert await doors.calls.settled() == []

    # No conversation id: Bernard knows the conversation by the history resent with "yes".
    doors.upstream.script(Reply.text("The front door is unlocked."))
    stream = await client.chat.completions.create(
        model="bernard-v1",
        messages=[
            {"role": "user", "content": "unlock the front door"},
            {"role": "assistant", "content": question},
            {"role": "user", "content": "yes"},
        ],
        stream=True,
    )
    said = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    assert said == "The front door is unlocked."
    assert (await doors.ha.state("lock.front_door"))["state"] == "unlocked"
    sent = [c for c in await doors.calls.settled() if c.domain == "lock"]
    assert sent == [ServiceCall("lock", "unlock", {"entity_id": "lock.front_door"})]


async def test_no_lock_the_back_door_instead_rejects_and_asks_about_the_new_call(
    doors: House,
) -> None:
    client = sdk(doors)
    doors.upstream.script_router(Reply.tool_calls([UNLOCK]))
    asked = await client.responses.create(model="bernard-v1", input="unlock the front door")
    assert asked.output_text == "Shall I unlock lock.front_door?"
    (request,) = [item for item in asked.output if item.type == "mcp_approval_request"]

    # The router reads the words with the waiting call in front of it: it rejects the call
    # and makes the one asked for instead, which waits in turn.
    doors.upstream.script_router(
        Reply.tool_calls(
            [
                ("reject_pending", {"confirmation_ids": [request.id]}),
                call("lock.back_door", "lock"),
            ]
        )
    )
    other = await client.responses.create(
        model="bernard-v1", input="no, lock the back door instead", previous_response_id=asked.id
    )

    assert other.output_text == "Shall I lock lock.back_door?"
    (proposed,) = [item for item in other.output if item.type == "mcp_approval_request"]
    assert (proposed.name, json.loads(proposed.arguments)) == (
        "ha_call_service",
        {"domain": "lock", "service": "lock", "entity_id": "lock.back_door"},
    )
    assert [item.type for item in other.output] == ["message", "mcp_approval_request"]
    assert await doors.calls.settled() == []
    assert (await doors.ha.state("lock.front_door"))["state"] == "locked"
    assert (await doors.ha.state("lock.back_door"))["state"] == "unlocked"

    doors.upstream.script(Reply.text("The back door is locked."))
    done = await client.responses.create(
        model="bernard-v1", input="Yes please.", previous_response_id=other.id
    )
    assert done.output_text == "The back door is locked."
    assert (await doors.ha.state("lock.back_door"))["state"] == "locked"
    assert (await doors.ha.state("lock.front_door"))["state"] == "locked"
    sent = [c for c in await doors.calls.settled() if c.domain == "lock"]
    assert sent == [ServiceCall("lock", "lock", {"entity_id": "lock.back_door"})]


# -- the scripted Home Assistant ---------------------------------------------------------------


async def test_the_fakes_service_descriptions_are_the_real_ones(ha: HomeAssistantApi) -> None:
    """tests/fakes/home_assistant.py answers `GET /api/services` with its fixture; each
    service it describes is described as this Home Assistant describes it (the script's own
    service, named for the fake's script, as this house's is)."""
    fixture = json.loads((FIXTURES / "services.json").read_text())["body"]
    response = await ha.http.get("/api/services")
    response.raise_for_status()
    real = {entry["domain"]: entry["services"] for entry in response.json()}
    real["script"]["bedtime"] = real["script"]["good_night"] | {"name": "Bedtime"}

    for entry in fixture:
        for name, description in entry["services"].items():
            assert description == real[entry["domain"]][name], f"{entry['domain']}.{name}"
