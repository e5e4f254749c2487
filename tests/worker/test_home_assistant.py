"""The Home Assistant tools against a fake Home Assistant on loopback (tests/fakes/
home_assistant.py), and the demo home `./run` starts (launcher/demo_home.py).

The read tools' success, failures, pipeline turns on both wire modes and live progress run
with the other web tools in tests/worker/test_web_tools.py (its `CASES`); here: what is
particular to Home Assistant (areas, a missing entity, the token, what the model reads), and
the write, `ha_call_service`, which waits for the user's decision and never reaches a domain
outside `BERNARD_HA_DOMAINS`.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio as redis_asyncio
from httpx_sse import EventSource
from langchain_core.tools import BaseTool

from launcher.demo_home import demo_home_app
from shared.records.undo import Restore
from tests.fakes.home_assistant import FakeHomeAssistant, ServiceCall
from tests.fakes.searxng import Seen
from tests.support.serving import serve
from tests.support.sse import named, of
from tests.support.stack import Config, Stack, make_config
from tests.support.upstream import Reply, ScriptedUpstream
from tests.support.users import ALICE
from tests.worker.test_web_tools import call
from worker.tools import enabled_tools
from worker.tools.catalog import catalog
from worker.tools.home_assistant import HomeAssistantSettings, home_assistant_tools
from worker.tools.home_assistant.calls import call_service_tool
from worker.tools.home_assistant.client import area_template
from worker.tools.home_assistant.reads import ha_get_state, ha_list_entities
from worker.tools.home_assistant.rendering import MAX_LISTED, describe_call
from worker.tools.home_assistant.restore import restore_of

KITCHEN_ON = {
    "domain": "light",
    "service": "turn_on",
    "entity_id": "light.kitchen",
    "data": {"brightness_pct": 40},
}
KITCHEN_DONE = (
    "Done: Turn on light.kitchen at 40 % brightness.\nlight.kitchen is now on, brightness 40 %."
)
REFUSED = (
    "Error: Home Assistant refused the request (HTTP {status}); check BERNARD_HA_TOKEN "
    "(a long-lived access token from a Home Assistant profile)"
)


def ha_settings(
    fake: FakeHomeAssistant, upstream: ScriptedUpstream | None = None, **overrides: Any
) -> Config:
    values = {"ha_url": fake.base_url, "ha_token": FakeHomeAssistant.token, **overrides}
    return make_config(upstream, **values)


def service(domain: str, name: str, entity: str, **data: Any) -> dict[str, Any]:
    return {"domain": domain, "service": name, "entity_id": entity, "data": data or None}


def service_tool(config: Config) -> BaseTool:
    home = config.tools.of(HomeAssistantSettings)
    (tool,) = [t for t in home_assistant_tools(home) if t.name == "ha_call_service"]
    return tool


@pytest.fixture
async def home() -> AsyncIterator[FakeHomeAssistant]:
    async with FakeHomeAssistant() as fake:
        yield fake


# -- reading ---------------------------------------------------------------------------------


async def test_listing_reads_every_state_with_the_token_and_shows_them_sorted(
    home: FakeHomeAssistant, redis: redis_asyncio.Redis
) -> None:
    outcome, progress = await call(ha_list_entities, {}, ha_settings(home), redis)
    assert (outcome.status, outcome.content) == (
        "success",
        """\
Home Assistant entities: 10
- climate.hall “Hall Thermostat”: heat, 19.5° now, set to 20°
- fan.bedroom “Bedroom Fan”: off
- light.kitchen “Kitchen Light”: off
- light.living_room “Living Room Lights”: on, brightness 71 %
- lock.front_door “Front Door”: locked
- scene.movie_night “Movie Night”: last activated 2024-05-31T20:14:03.511029+00:00
- script.bedtime “Bedtime”: not running
- sensor.outdoor_temperature “Outdoor Temperature”: 12.4 °C
- sun.sun “Sun”: above_horizon
- switch.coffee_maker “Coffee Maker”: off""",
    )
    assert progress == [
        ("step", "Asking Home Assistant for its entities"),
        ("complete", "Found 10 entities"),
    ]
    assert home.requests == [Seen("/api/states", {})]  # the fake answers 401 without the token


@pytest.mark.parametrize(
    ("area", "rendered"),
    [
        ("kitchen", '{"area": "Kitchen", "entities": ["light.kitchen", "switch.coffee_maker"]}'),
        ("kid's room", '{"area": "Kid\\u0027s room", "entities": []}'),
        ("attic", '{"area": null, "entities": []}'),
    ],
)
async def test_the_fake_renders_the_area_template_as_home_assistant_2025_4_does(
    area: str, rendered: str, home: FakeHomeAssistant
) -> None:
    headers = {"Authorization": f"Bearer {FakeHomeAssistant.token}"}
    async with httpx.AsyncClient(base_url=home.base_url, headers=headers) as ha:
        reply = await ha.post("/api/template", json={"template": area_template(area)})
    assert (reply.status_code, reply.text) == (200, rendered)


def test_the_area_template_asks_for_the_areas_name_and_its_entities() -> None:
    assert area_template("Living Room") == (
        '{{ {"area": area_name("Living Room") or area_name(area_id("Living Room") or ""), '
        '"entities": area_entities("Living Room")} | tojson }}'
    )


async def test_an_area_is_resolved_by_home_assistant_and_named_as_it_names_it(
    home: FakeHomeAssistant, redis: redis_asyncio.Redis
) -> None:
    outcome, progress = await call(
        ha_list_entities, {"area": " kitchen "}, ha_settings(home), redis
    )
    assert outcome.content == (
        "Home Assistant entities in the area “Kitchen”: 2\n"
        "- light.kitchen “Kitchen Light”: off\n"
        "- switch.coffee_maker “Coffee Maker”: off"
    )
    assert home.templates == [area_template("kitchen")]
    assert progress == [
        ("step", "Asking Home Assistant for its entities"),
        ("step", "Finding the entities in “kitchen”"),
        ("complete", "Found 2 entities"),
    ]
    light, _ = await call(
        ha_list_entities, {"area": "kitchen", "domain": "light"}, ha_settings(home), redis
    )
    assert light.content.splitlines()[1:] == ["- light.kitchen “Kitchen Light”: off"]


async def test_an_area_home_assistant_does_not_know_falls_back_to_the_entities_names(
    home: FakeHomeAssistant, redis: redis_asyncio.Redis
) -> None:
    outcome, _ = await call(ha_list_entities, {"area": "Living Room"}, ha_settings(home), redis)
    assert outcome.content == (
        "Home Assistant entities whose name mentions “Living Room” (Home Assistant has no area "
        "“Living Room”): 1\n"
        "- light.living_room “Living Room Lights”: on, brightness 71 %"
    )


@pytest.mark.parametrize(
    ("mode", "args", "answer"),
    [
        ("empty", {}, "Home Assistant has no entities."),
        ("empty", {"domain": "Light"}, "Home Assistant has no light entities."),
        ("ok", {"domain": "cover"}, "Home Assistant has no cover entities."),
        ("ok", {"area": "garage"}, "Home Assistant has no entities in the area “Garage”."),
        ("ok", {"area": "kid's room"}, "Home Assistant has no entities in the area “Kid's room”."),
        (
            "ok",
            {"area": "Bedroom", "domain": "light"},
            "Home Assistant has no light entities in the area “Bedroom”.",
        ),
        (
            "ok",
            {"area": "attic"},
            "Home Assistant has no area “attic”, and no entity's name mentions it.",
        ),
        (
            "ok",
            {"area": "attic", "domain": "light"},
            "Home Assistant has no area “attic”, and no light entity's name mentions it.",
        ),
    ],
)
async def test_listing_with_nothing_to_show_says_so(
    mode: str,
    args: dict[str, str],
    answer: str,
    home: FakeHomeAssistant,
    redis: redis_asyncio.Redis,
) -> None:
    home.mode = mode
    outcome, progress = await call(ha_list_entities, args, ha_settings(home), redis)
    assert (outcome.status, outcome.content) == ("success", answer)
    assert progress[-1] == ("complete", "Found 0 entities")


async def test_a_long_list_is_cut_for_the_model_with_a_hint_to_narrow_it(
    home: FakeHomeAssistant, redis: redis_asyncio.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    many = [{"entity_id": f"sensor.s{n:03}", "state": str(n), "attributes": {}} for n in range(100)]
    monkeypatch.setattr(home, "_all", lambda mode: many)
    outcome, _ = await call(ha_list_entities, {}, ha_settings(home), redis)
    lines = outcome.content.splitlines()
    assert lines[0] == "Home Assistant entities: 100"
    assert len(lines) == 1 + MAX_LISTED + 1
    assert lines[-1] == f"… and {100 - MAX_LISTED} more; ask again with a domain or an area"


async def test_reading_a_state_normalises_the_id_and_shows_the_attributes(
    home: FakeHomeAssistant, redis: redis_asyncio.Redis
) -> None:
    outcome, progress = await call(
        ha_get_state, {"entity_id": " Climate.Hall "}, ha_settings(home), redis
    )
    assert outcome.content.splitlines()[:3] == [
        "climate.hall “Hall Thermostat” is heat, 19.5° now, set to 20°.",
        "Last changed: 2024-06-01T05:00:00.000000+00:00",
        "Attributes:",
    ]
    assert '- hvac_modes: ["off", "heat"]' in outcome.content
    assert "friendly_name" not in outcome.content
    assert [r.path for r in home.requests] == ["/api/states/climate.hall"]
    assert progress == [
        ("step", "Reading the state of climate.hall"),
        ("complete", "climate.hall is heat"),
    ]


async def test_a_long_attribute_is_cut_for_the_model(
    home: FakeHomeAssistant, redis: redis_asyncio.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = {"entity_id": "sensor.big", "state": "1", "attributes": {"blob": "word " * 500}}
    monkeypatch.setattr(home, "_all", lambda mode: [state])
    outcome, _ = await call(ha_get_state, {"entity_id": "sensor.big"}, ha_settings(home), redis)
    blob = next(line for line in outcome.content.splitlines() if line.startswith("- blob: "))
    assert len(blob.removeprefix("- blob: ")) <= 200 and blob.endswith("…")


@pytest.mark.parametrize("mode", ["ok", "empty"])
async def test_a_missing_entity_is_an_error_that_says_how_to_find_the_ids(
    mode: str, home: FakeHomeAssistant, redis: redis_asyncio.Redis
) -> None:
    home.mode = mode
    outcome, _ = await call(ha_get_state, {"entity_id": "light.attic"}, ha_settings(home), redis)
    assert (outcome.status, outcome.content) == (
        "error",
        "Error: Home Assistant has no entity light.attic; call ha_list_entities for the ids",
    )


@pytest.mark.parametrize(
    "entity_id", ["kitchen light", "light.", "light/kitchen", "../api/config", "light.a/../b", "x"]
)
async def test_what_is_not_an_entity_id_is_refused_before_any_request(
    entity_id: str, home: FakeHomeAssistant, redis: redis_asyncio.Redis
) -> None:
    outcome, _ = await call(ha_get_state, {"entity_id": entity_id}, ha_settings(home), redis)
    assert outcome.status == "error" and "is not one" in outcome.content
    assert home.requests == []


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        ({"area": 'kitchen") }}{{ states("lock.front_door'}, "is not an area name"),
        ({"area": "{{ 7 * 7 }}"}, "is not an area name"),
        ({"area": "back\\slash"}, "is not an area name"),
        ({"domain": "light.kitchen"}, "is not a domain name"),
    ],
)
async def test_what_could_break_out_of_the_template_is_refused_before_any_request(
    args: dict[str, str], problem: str, home: FakeHomeAssistant, redis: redis_asyncio.Redis
) -> None:
    outcome, _ = await call(ha_list_entities, args, ha_settings(home), redis)
    assert outcome.status == "error" and problem in outcome.content
    assert home.requests == []


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        (ha_list_entities, {}),
        (ha_get_state, {"entity_id": "light.kitchen"}),
        (None, KITCHEN_ON),
    ],
)
async def test_a_token_home_assistant_refuses_says_to_check_the_token(
    tool: BaseTool | None, args: dict[str, Any], home: FakeHomeAssistant, redis: redis_asyncio.Redis
) -> None:
    settings = ha_settings(home, ha_token="expired")
    outcome, _ = await call(tool or service_tool(settings), args, settings, redis)
    assert (outcome.status, outcome.content) == ("error", REFUSED.format(status=401))
    home.mode = "forbidden"
    settings = ha_settings(home)
    outcome, _ = await call(tool or service_tool(settings), args, settings, redis)
    assert (outcome.status, outcome.content) == ("error", REFUSED.format(status=403))


async def test_an_area_needs_an_administrators_token_and_the_error_says_so(
    home: FakeHomeAssistant, redis: redis_asyncio.Redis
) -> None:
    home.mode, home.only = "unauthorized", "/api/template"  # as for a non-admin user's token
    outcome, _ = await call(ha_list_entities, {"area": "kitchen"}, ha_settings(home), redis)
    assert outcome.content == (
        "Error: Home Assistant refused the request (HTTP 401); listing by area renders a "
        "template, which Home Assistant allows only with an administrator's token: use an "
        "administrator's token in BERNARD_HA_TOKEN, or list by domain instead"
    )


async def test_a_bad_token_while_listing_by_area_is_blamed_on_the_token_not_on_admin_rights(
    home: FakeHomeAssistant, redis: redis_asyncio.Redis
) -> None:
    # Home Assistant answers both with the same "401: Unauthorized": the states go first.
    settings = ha_settings(home, ha_token="expired")
    outcome, _ = await call(ha_list_entities, {"area": "kitchen"}, settings, redis)
    assert (outcome.status, outcome.content) == ("error", REFUSED.format(status=401))
    assert home.requests == [Seen("/api/states", {})] and home.templates == []


@pytest.mark.parametrize(
    ("overrides", "offered"),
    [
        ({}, []),
        ({"ha_url": "http://ha.local:8123"}, []),
        ({"ha_token": "t"}, []),
        (
            {"ha_url": "http://ha.local:8123", "ha_token": "t"},
            ["ha_list_entities", "ha_get_state", "ha_call_service"],
        ),
        (
            {"ha_url": "http://ha.local:8123", "ha_token": "t", "ha_domains": " , "},
            ["ha_list_entities", "ha_get_state"],
        ),
    ],
)
def test_the_tools_are_offered_only_when_home_assistant_is_configured(
    overrides: dict[str, str], offered: list[str]
) -> None:
    names = [t.name for t in enabled_tools(make_config(**overrides).tools)]
    assert [n for n in names if n.startswith("ha_")] == offered


# -- calling a service: the tool ---------------------------------------------------------------


def test_the_service_tool_lists_only_the_allowed_domains_and_waits_for_confirmation() -> None:
    config = make_config(ha_url="http://ha.local", ha_token="t", ha_domains="switch, light,light")
    (listed,) = [
        t
        for t in catalog(enabled_tools(config.tools), config.settings)
        if t["name"] == "ha_call_service"
    ]
    assert listed["requires_confirmation"] is True
    assert listed["parameters"]["properties"]["domain"]["enum"] == ["light", "switch"]
    assert listed["parameters"]["required"] == ["domain", "service", "entity_id"]
    with pytest.raises(ValueError, match="at least one domain"):
        call_service_tool([])


async def test_a_service_call_sends_the_entity_and_its_data_and_reports_the_new_state(
    home: FakeHomeAssistant, redis: redis_asyncio.Redis
) -> None:
    settings = ha_settings(home)
    outcome, progress = await call(service_tool(settings), KITCHEN_ON, settings, redis)
    assert (outcome.status, outcome.content) == (
        "success",
        KITCHEN_DONE,
    )
    assert home.service_calls == [
        ServiceCall("light", "turn_on", {"entity_id": "light.kitchen", "brightness_pct": 40})
    ]
    assert [r.path for r in home.requests] == [
        "/api/states/light.kitchen",
        "/api/services",
        "/api/services/light/turn_on",
    ]
    assert progress == [
        ("step", "Calling light.turn_on for light.kitchen"),
        ("complete", "Home Assistant ran light.turn_on"),
    ]


async def test_a_call_that_changes_nothing_says_so(
    home: FakeHomeAssistant, redis: redis_asyncio.Redis
) -> None:
    settings = ha_settings(home)
    args = {"domain": "switch", "service": "turn_off", "entity_id": "switch.coffee_maker"}
    outcome, _ = await call(service_tool(settings), args, settings, redis)
    assert outcome.content == (
        "Done: Turn off switch.coffee_maker.\n"
        "Home Assistant reported no change of switch.coffee_maker's state."
    )


async def test_a_call_home_assistant_rejects_tells_the_model_what_to_check(
    home: FakeHomeAssistant, redis: redis_asyncio.Redis
) -> None:
    # Home Assistant does not describe its services here: its own plain 400 is explained.
    home.services_listed = False
    settings = ha_settings(home)
    args = {"domain": "light", "service": "turn_onn", "entity_id": "light.kitchen"}
    outcome, progress = await call(service_tool(settings), args, settings, redis)
    assert (outcome.status, outcome.content) == (
        "error",
        "Error: Home Assistant failed (HTTP 400): light.turn_onn may not exist, or its data is "
        "not valid for light.kitchen; nothing was changed; check the entity with ha_get_state",
    )
    assert progress[-1] == ("error", outcome.content.removeprefix("Error: "))
    assert [c.service for c in home.service_calls] == ["turn_onn"]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (
            {"domain": "lock", "service": "unlock", "entity_id": "lock.front_door"},
            "Error: Bernard may not call lock services; the domains it may call are light "
            "(BERNARD_HA_DOMAINS)",
        ),
        (
            {"domain": "light", "service": "turn_on", "entity_id": "lock.front_door"},
            "Error: lock.front_door is not a light entity; call light services on light.* entities",
        ),
        (
            {**KITCHEN_ON, "data": {"area_id": "kitchen"}},
            "Error: data may not hold area_id: a call acts on its one entity_id",
        ),
        (
            {**KITCHEN_ON, "data": {"entity_id": "light.hall", "device_id": "x"}},
            "Error: data may not hold entity_id, device_id: a call acts on its one entity_id",
        ),
        (
            {**KITCHEN_ON, "data": {"effect": "x" * 3000}},
            "Error: data is longer than 2000 characters",
        ),
        (
            {**KITCHEN_ON, "service": "turn on"},
            "Error: the service 'turn on' is not a service name",
        ),
    ],
)
async def test_a_call_bernard_may_not_make_never_reaches_home_assistant(
    args: dict[str, Any], error: str, home: FakeHomeAssistant, redis: redis_asyncio.Redis
) -> None:
    # The tool is built for more domains than the settings allow: it checks them itself.
    settings = ha_settings(home, ha_domains="light")
    outcome, progress = await call(call_service_tool(["light", "lock"]), args, settings, redis)
    assert (outcome.status, outcome.content) == ("error", error)
    assert [phase for phase, _ in progress] == ["error"]
    assert home.requests == [] and home.service_calls == []


# -- calling a service: what a real Home Assistant answers, and what the tool makes of it ----


BAD = "400: Bad Request"


@pytest.mark.parametrize(
    ("path", "body", "status", "answer"),
    [
        # An entity it does not have, or of another domain: logged, skipped, `200 []`.
        ("light/turn_on", {"entity_id": "light.attic"}, 200, "[]"),
        ("light/turn_on", {"entity_id": "lock.front_door"}, 200, "[]"),
        # A value or a mode the entity refuses, a feature it lacks: a bare 500.
        ("climate/set_temperature", {"entity_id": "climate.hall", "temperature": 40}, 500, None),
        ("climate/set_hvac_mode", {"entity_id": "climate.hall", "hvac_mode": "warm"}, 400, BAD),
        ("lock/open", {"entity_id": "lock.front_door"}, 500, None),
        ("fan/set_preset_mode", {"entity_id": "fan.bedroom", "preset_mode": "turbo"}, 500, None),
        # No such service, an option the service does not take: a plain 400.
        ("light/turn_onn", {"entity_id": "light.kitchen"}, 400, BAD),
        ("light/turn_on", {"entity_id": "light.kitchen", "flash2": "x"}, 400, BAD),
        ("light/turn_on", {"entity_id": "light.kitchen", "brightness_pct": "150"}, 400, BAD),
        ("climate/set_temperature", {"entity_id": "climate.hall", "temperature": "hot"}, 400, BAD),
        ("climate/set_temperature", {"entity_id": "climate.hall", "temperature": "40"}, 500, None),
    ],
)
async def test_the_fake_answers_service_calls_as_home_assistant_2025_4_does(
    path: str, body: dict[str, Any], status: int, answer: str | None, home: FakeHomeAssistant
) -> None:
    headers = {"Authorization": f"Bearer {FakeHomeAssistant.token}"}
    async with httpx.AsyncClient(base_url=home.base_url, headers=headers) as ha:
        before = (await ha.get("/api/states")).json()
        reply = await ha.post(f"/api/services/{path}", json=body)
        after = (await ha.get("/api/states")).json()
    server_error = "500 Internal Server Error\n\nServer got itself in trouble"
    assert (reply.status_code, reply.text) == (status, answer or server_error)
    assert after == before, "nothing changed in the house"


async def test_the_fake_takes_an_hvac_mode_the_thermostat_does_not_list_as_2025_4_does(
    home: FakeHomeAssistant,
) -> None:
    headers = {"Authorization": f"Bearer {FakeHomeAssistant.token}"}
    body = {"entity_id": "climate.hall", "hvac_mode": "cool"}  # its modes: off, heat
    async with httpx.AsyncClient(base_url=home.base_url, headers=headers) as ha:
        reply = await ha.post("/api/services/climate/set_hvac_mode", json=body)
        after = (await ha.get("/api/states/climate.hall")).json()
    assert reply.status_code == 200
    assert [(s["entity_id"], s["state"]) for s in reply.json()] == [("climate.hall", "cool")]
    assert after["state"] == "cool"


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (
            service("light", "turn_on", "light.attic"),
            "Error: Home Assistant has no entity light.attic, so light.turn_on would do "
            "nothing; call ha_list_entities for the ids",
        ),
        (
            service("climate", "set_temperature", "climate.hall", temperature=40),
            "Error: climate.hall accepts a temperature from 7° to 30°, not 40°; nothing was "
            "sent to Home Assistant",
        ),
        (
            service(
                "climate",
                "set_temperature",
                "climate.hall",
                target_temp_low=18,
                target_temp_high=22,
            ),
            "Error: climate.hall keeps one temperature: set temperature; nothing was sent to "
            "Home Assistant",
        ),
        (
            service("climate", "set_hvac_mode", "climate.hall", hvac_mode="cool"),
            'Error: climate.hall has no hvac_mode "cool"; its hvac_modes are off, heat; nothing '
            "was sent to Home Assistant",
        ),
        (
            service("fan", "set_preset_mode", "fan.bedroom", preset_mode="turbo"),
            'Error: fan.bedroom has no preset_mode "turbo"; its preset_modes are auto, sleep; '
            "nothing was sent to Home Assistant",
        ),
        (
            service("light", "turn_on", "light.kitchen", effect="rainbow"),
            'Error: light.kitchen has no effect "rainbow": it has no effect_list; nothing was '
            "sent to Home Assistant",
        ),
        (
            service("lock", "open", "lock.front_door"),
            "Error: lock.front_door does not support lock.open; nothing was sent to Home Assistant",
        ),
        (
            service("light", "turn_onn", "light.kitchen"),
            "Error: Home Assistant has no service light.turn_onn; nothing was sent to Home "
            "Assistant",
        ),
        (
            service("light", "turn_on", "light.kitchen", brightness_pct=150),
            "Error: brightness_pct must be from 0 to 100, not 150; nothing was sent to Home "
            "Assistant",
        ),
        # Home Assistant's schemas read a number written as text as the number.
        (
            service("light", "turn_on", "light.kitchen", brightness_pct="150"),
            "Error: brightness_pct must be from 0 to 100, not 150; nothing was sent to Home "
            "Assistant",
        ),
        (
            service("climate", "set_temperature", "climate.hall", temperature="40"),
            "Error: climate.hall accepts a temperature from 7° to 30°, not 40°; nothing was "
            "sent to Home Assistant",
        ),
        (
            service("climate", "set_temperature", "climate.hall", temperature="hot"),
            'Error: temperature must be a number, not "hot"; nothing was sent to Home Assistant',
        ),
        (
            service("climate", "set_temperature", "climate.hall", temperature="nan"),
            'Error: temperature must be a number, not "nan"; nothing was sent to Home Assistant',
        ),
        (
            service("switch", "turn_on", "switch.coffee_maker", brightness_pct=50),
            "Error: switch.turn_on takes no brightness_pct; the options it takes are none; "
            "nothing was sent to Home Assistant",
        ),
    ],
)
async def test_a_call_home_assistant_would_refuse_without_a_reason_is_refused_before_sending(
    args: dict[str, Any], error: str, home: FakeHomeAssistant, redis: redis_asyncio.Redis
) -> None:
    settings = ha_settings(home, ha_domains="light,switch,fan,climate,lock")
    outcome, progress = await call(service_tool(settings), args, settings, redis)
    assert (outcome.status, outcome.content) == ("error", error)
    assert [phase for phase, _ in progress] == ["error"]
    assert home.service_calls == []


@pytest.mark.parametrize(
    ("mode", "error"),
    [
        ("slow", "Error: Home Assistant did not answer within 0.3s"),
        ("drop", "Error: could not reach Home Assistant: "),
    ],
)
async def test_a_call_whose_answer_never_came_may_have_run_and_is_not_sent_again(
    mode: str, error: str, redis: redis_asyncio.Redis
) -> None:
    async with FakeHomeAssistant(mode, only="/api/services/light/") as home:
        settings = ha_settings(home, tool_http_timeout_s=0.3)
        outcome, progress = await call(service_tool(settings), KITCHEN_ON, settings, redis)
        light = home.states()["light.kitchen"]
    assert outcome.status == "error"
    assert outcome.content.startswith(error), outcome.content
    assert outcome.content.endswith(
        "; the call may have run all the same: check with ha_get_state before trying again"
    )
    assert progress[-1] == ("error", outcome.content.removeprefix("Error: "))
    assert len(home.service_calls) == 1, "a call that may have run is never sent again"
    assert (light["state"], light["attributes"]["brightness"]) == ("on", 102)  # it did run


async def test_activating_a_scene_reports_it_and_what_it_changed(
    home: FakeHomeAssistant, redis: redis_asyncio.Redis
) -> None:
    settings = ha_settings(home)
    args = service("scene", "turn_on", "scene.movie_night")
    outcome, _ = await call(service_tool(settings), args, settings, redis)
    assert (outcome.status, outcome.content) == (
        "success",
        "Done: Activate scene.movie_night.\n"
        "scene.movie_night was activated at 2024-06-01T19:30:00.000000+00:00.\n"
        "Also changed: light.living_room is now on, brightness 20 %.",
    )


@pytest.mark.parametrize(
    ("name", "done"),
    [
        # The script's own service runs it to its end: the answer holds it on, then off.
        (
            "bedtime",
            "Done: Run script.bedtime.\n"
            "script.bedtime is not running.\n"
            "Also changed: light.living_room is now off.",
        ),
        # script.turn_on answers once it has started.
        (
            "turn_on",
            "Done: Run script.bedtime.\n"
            "script.bedtime is running.\n"
            "Also changed: light.living_room is now off.",
        ),
    ],
)
async def test_an_entity_the_call_changed_twice_reads_as_it_ended(
    name: str, done: str, home: FakeHomeAssistant, redis: redis_asyncio.Redis
) -> None:
    settings = ha_settings(home)
    args = service("script", name, "script.bedtime")
    outcome, _ = await call(service_tool(settings), args, settings, redis)
    assert (outcome.status, outcome.content) == ("success", done)


async def test_a_fan_can_be_called_with_the_default_domains(
    home: FakeHomeAssistant, redis: redis_asyncio.Redis
) -> None:
    settings = ha_settings(home)
    (listed,) = [
        t
        for t in catalog(enabled_tools(settings.tools), settings.settings)
        if t["name"] == "ha_call_service"
    ]
    assert listed["parameters"]["properties"]["domain"]["enum"] == [
        "climate",
        "cover",
        "fan",
        "light",
        "media_player",
        "scene",
        "script",
        "switch",
    ]
    args = service("fan", "set_percentage", "fan.bedroom", percentage=50)
    outcome, _ = await call(service_tool(settings), args, settings, redis)
    assert outcome.content == (
        "Done: Call fan.set_percentage on fan.bedroom with percentage=50.\n"
        "fan.bedroom is now on, speed 50 %."
    )


# -- calling a service: what the user confirms -------------------------------------------------


@pytest.mark.parametrize(
    ("args", "summary"),
    [
        (KITCHEN_ON, "Turn on light.kitchen at 40 % brightness"),
        (service("light", "turn_on", "light.kitchen"), "Turn on light.kitchen"),
        (
            service("light", "turn_on", "light.hall", brightness=255),
            "Turn on light.hall at 100 % brightness",
        ),
        (
            service("light", "turn_on", "light.hall", color_name="red", transition=2),
            "Turn on light.hall in red over 2 s",
        ),
        (
            service("light", "turn_on", "light.hall", color_temp_kelvin=2700, flash="short"),
            'Turn on light.hall at 2700 K with flash="short"',
        ),
        (service("light", "turn_off", "light.living_room"), "Turn off light.living_room"),
        (service("switch", "toggle", "switch.fan"), "Toggle switch.fan"),
        (
            service("climate", "set_temperature", "climate.living_room", temperature=21),
            "Set climate.living_room to 21°",
        ),
        (
            service(
                "climate", "set_temperature", "climate.hall", temperature=20.5, hvac_mode="heat"
            ),
            "Set climate.hall to 20.5° in heat mode",
        ),
        (
            service(
                "climate",
                "set_temperature",
                "climate.hall",
                target_temp_low=19,
                target_temp_high=23,
            ),
            "Keep climate.hall between 19° and 23°",
        ),
        (
            service("climate", "set_hvac_mode", "climate.hall", hvac_mode="off"),
            "Switch climate.hall to off mode",
        ),
        (
            service("cover", "set_cover_position", "cover.garage", position=50),
            "Open cover.garage to 50 %",
        ),
        (service("cover", "close_cover", "cover.garage"), "Close cover.garage"),
        (service("lock", "unlock", "lock.front_door"), "Unlock lock.front_door"),
        (service("lock", "lock", "lock.back_door"), "Lock lock.back_door"),
        (
            service("media_player", "volume_set", "media_player.tv", volume_level=0.3),
            "Set the volume of media_player.tv to 30 %",
        ),
        (service("media_player", "media_pause", "media_player.tv"), "Pause media_player.tv"),
        (service("scene", "turn_on", "scene.movie_night"), "Activate scene.movie_night"),
        (service("script", "turn_on", "script.good_night"), "Run script.good_night"),
        (service("script", "good_night", "script.good_night"), "Run script.good_night"),
        (
            service("vacuum", "start", "vacuum.downstairs", fan_speed="max", repeats=2),
            'Call vacuum.start on vacuum.downstairs with fan_speed="max", repeats=2',
        ),
    ],
)
def test_the_summary_says_in_plain_words_what_will_change(
    args: dict[str, Any], summary: str
) -> None:
    assert describe_call(args) == summary


@pytest.mark.parametrize(
    ("domain", "name", "data"),
    [
        ("light", "turn_on", {"brightness_pct": 40, "rgb_color": [255, 0, 0], "effect": "loop"}),
        ("climate", "set_temperature", {"temperature": 21, "preset_mode": "eco"}),
        ("climate", "set_temperature", {"hvac_mode": "heat", "target_temp_high": 24}),
        ("cover", "set_cover_position", {"position": 30, "tilt_position": 80}),
        ("media_player", "volume_set", {"volume_level": "loud", "is_volume_muted": True}),
    ],
)
def test_the_summary_hides_no_option_of_the_call(
    domain: str, name: str, data: dict[str, Any]
) -> None:
    summary = describe_call(service(domain, name, f"{domain}.x", **data))
    for key, value in data.items():
        number = isinstance(value, int | float) and not isinstance(value, bool)
        assert (f"{value:g}" if number else json.dumps(value)) in summary or (
            isinstance(value, str) and value in summary
        ), key


# -- calling a service: through the pipeline, confirmed by the user -----------------------------

SSE = {"Accept": "text/event-stream"}


def alices_settings(
    fake: FakeHomeAssistant, upstream: ScriptedUpstream | None, **more: Any
) -> Config:
    return ha_settings(fake, upstream, api_keys=f"key-alice:alice-{uuid.uuid4().hex[:8]}", **more)


async def start(stack: Stack, conversation_id: str = "kitchen") -> None:
    created = await stack.client.post(
        "/v1/conversations", json={"id": conversation_id}, headers=ALICE
    )
    assert created.status_code == 201, created.text


@pytest.fixture
async def kitchen(home: FakeHomeAssistant, upstream: ScriptedUpstream) -> AsyncIterator[Stack]:
    """Alice's stack with the fake Home Assistant's tools, her conversation "kitchen" made."""
    async with alices_settings(home, upstream).stack() as stack:
        await start(stack)
        yield stack


async def test_a_service_call_waits_for_approval_and_then_runs_once(
    home: FakeHomeAssistant, upstream: ScriptedUpstream, kitchen: Stack
) -> None:
    upstream.script_router(Reply.tool_calls([("ha_call_service", KITCHEN_ON)]))
    asked = await named(
        kitchen.client,
        "/v1/conversations/kitchen/messages",
        {"content": "kitchen light at 40%"},
        ALICE,
    )
    (proposal,) = of(asked, "awaiting_confirmation")
    assert proposal["summary"] == "Turn on light.kitchen at 40 % brightness"
    assert json.loads(proposal["tool_call"]["arguments"]) == KITCHEN_ON
    assert of(asked, "done")[0]["status"] == "awaiting_confirmation"
    assert home.service_calls == [], "nothing reaches Home Assistant before the decision"

    upstream.script(Reply.text("The kitchen light is on."))
    home.hold("/api/services/light/")
    async with kitchen.client.stream(
        "POST",
        "/v1/conversations/kitchen/resume",
        json={"confirmation_id": proposal["confirmation_id"], "decision": "approve"},
        headers={**ALICE, **SSE},
    ) as response:
        events = EventSource(response).aiter_sse()
        seen: list[tuple[str, Any]] = []
        while not of(seen, "tool_progress"):
            sse = await anext(events)
            seen.append((sse.event, json.loads(sse.data)))
        # The step reaches the client while Home Assistant holds its answer.
        await home.wait_held()
        assert of(seen, "tool_progress")[0]["message"] == "Calling light.turn_on for light.kitchen"
        assert not of(seen, "tool_result")
        home.release()
        seen += [(sse.event, json.loads(sse.data)) async for sse in events]

    (result,) = of(seen, "tool_result")
    assert (result["is_error"], result["output"]) == (
        False,
        KITCHEN_DONE,
    )
    assert of(seen, "done")[0]["status"] == "completed"
    assert home.service_calls == [
        ServiceCall("light", "turn_on", {"entity_id": "light.kitchen", "brightness_pct": 40})
    ]


async def test_a_rejected_service_call_never_reaches_home_assistant(
    home: FakeHomeAssistant, upstream: ScriptedUpstream, kitchen: Stack
) -> None:
    upstream.script_router(Reply.tool_calls([("ha_call_service", KITCHEN_ON)]))
    asked = await kitchen.client.post(
        "/v1/conversations/kitchen/messages", json={"content": "light"}, headers=ALICE
    )
    confirmation = asked.json()["pending_confirmation"]["confirmation_id"]
    upstream.script(Reply.text("Fine, it stays off."))
    rejected = await kitchen.client.post(
        "/v1/conversations/kitchen/resume",
        json={"confirmation_id": confirmation, "decision": "reject"},
        headers=ALICE,
    )
    assert rejected.json()["status"] == "completed"
    assert rejected.json()["messages"][0]["content"] == (
        "The user declined: ha_call_service was not run."
    )
    # Before asking, the call was checked (reads only); the decision sent nothing.
    assert home.requests == [Seen("/api/states/light.kitchen", {}), Seen("/api/services", {})]
    assert home.service_calls == []


@pytest.mark.parametrize(
    ("allowed", "args"),
    [
        (None, {"domain": "lock", "service": "unlock", "entity_id": "lock.front_door"}),
        ("light", {"domain": "switch", "service": "turn_on", "entity_id": "switch.coffee_maker"}),
    ],
)
async def test_a_domain_outside_the_allow_list_is_never_proposed_nor_called(
    allowed: str | None,
    args: dict[str, Any],
    home: FakeHomeAssistant,
    upstream: ScriptedUpstream,
) -> None:
    upstream.script_router(Reply.tool_calls([("ha_call_service", args)]))
    upstream.script(Reply.text("I may not do that."))
    more = {"ha_domains": allowed} if allowed else {}
    async with alices_settings(home, upstream, **more).stack() as stack:
        await start(stack)
        events = await named(
            stack.client, "/v1/conversations/kitchen/messages", {"content": "do it"}, ALICE
        )
    assert not of(events, "awaiting_confirmation")
    (result,) = of(events, "tool_result")
    assert result["is_error"] is True
    assert result["output"].startswith(
        "Error: invalid arguments for tool 'ha_call_service': domain"
    )
    assert of(events, "done")[0]["status"] == "completed"
    assert home.requests == [] and home.service_calls == []


async def test_an_approval_cannot_move_the_call_to_another_domain(
    home: FakeHomeAssistant, upstream: ScriptedUpstream, kitchen: Stack
) -> None:
    upstream.script_router(Reply.tool_calls([("ha_call_service", KITCHEN_ON)]))
    asked = await kitchen.client.post(
        "/v1/conversations/kitchen/messages", json={"content": "light"}, headers=ALICE
    )
    confirmation = asked.json()["pending_confirmation"]["confirmation_id"]
    edited = await kitchen.client.post(
        "/v1/conversations/kitchen/resume",
        json={
            "confirmation_id": confirmation,
            "decision": "approve",
            "arguments": {
                "domain": "lock",
                "service": "unlock",
                "entity_id": "lock.front_door",
            },
        },
        headers=ALICE,
    )
    assert (edited.status_code, edited.json()["error"]["param"]) == (400, "arguments.domain")
    assert home.service_calls == []


async def test_a_call_that_cannot_run_is_never_proposed_and_the_model_hears_why(
    home: FakeHomeAssistant, upstream: ScriptedUpstream, kitchen: Stack
) -> None:
    too_hot = service("climate", "set_temperature", "climate.hall", temperature=40)
    upstream.script_router(Reply.tool_calls([("ha_call_service", too_hot)]))
    upstream.script(Reply.text("The hall thermostat only goes up to 30°."))
    events = await named(
        kitchen.client, "/v1/conversations/kitchen/messages", {"content": "40°!"}, ALICE
    )
    assert not of(events, "awaiting_confirmation")
    (result,) = of(events, "tool_result")
    assert (result["is_error"], result["output"]) == (
        True,
        "Error: climate.hall accepts a temperature from 7° to 30°, not 40°; nothing was sent "
        "to Home Assistant",
    )
    assert of(events, "done")[0]["status"] == "completed"
    assert home.service_calls == []


# -- the demo home, driven by the offline demo model -------------------------------------------


@contextlib.asynccontextmanager
async def demo_home_stack() -> AsyncIterator[tuple[Stack, httpx.AsyncClient]]:
    """Alice's stack on the offline demo model with the demo home `./run` starts, her
    conversation "kitchen" made; and a client of the demo home."""
    token = "demo-token"
    async with serve(demo_home_app(token)) as port:
        base = f"http://127.0.0.1:{port}"
        config = make_config(
            None,  # no upstream: the offline demo model
            openai_base_url=None,
            openai_api_key=None,
            api_keys=f"key-alice:alice-{uuid.uuid4().hex[:8]}",
            ha_url=base,
            ha_token=token,
        )
        assert config.settings.demo_mode
        async with (
            httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {token}"}) as ha,
            config.stack() as stack,  # the tools the settings enable
        ):
            await start(stack)
            yield stack, ha


# Words a tool's result says to the model, never to the person.
TOOL_ADVICE = ("ha_list_entities", "ha_get_state", "ha_call_service", "call ")


async def test_the_demo_model_looks_the_kitchen_light_up_then_turns_it_on_once_approved() -> None:
    async with demo_home_stack() as (stack, ha):
        asked = await named(
            stack.client,
            "/v1/conversations/kitchen/messages",
            {"content": "Turn on the kitchen light"},
            ALICE,
        )
        # The id is Home Assistant's, from its list: "kitchen light" is light.kitchen_light.
        (looked_up,) = of(asked, "tool_call")
        assert (looked_up["name"], looked_up["arguments"]) == (
            "ha_list_entities",
            '{"domain": "light"}',
        )
        (listed,) = of(asked, "tool_result")
        assert listed["output"] == (
            "Home Assistant light entities: 3\n"
            "- light.bedroom_lamp “Bedroom Lamp”: off\n"
            "- light.kitchen_light “Kitchen Light”: off\n"
            "- light.living_room_lights “Living Room Lights”: on, brightness 71 %"
        )
        (proposal,) = of(asked, "awaiting_confirmation")
        assert (proposal["tool_call"]["name"], json.loads(proposal["tool_call"]["arguments"])) == (
            "ha_call_service",
            {"domain": "light", "service": "turn_on", "entity_id": "light.kitchen_light"},
        )
        assert proposal["summary"] == "Turn on light.kitchen_light"
        assert (await ha.get("/api/states/light.kitchen_light")).json()["state"] == "off"

        approved = await named(
            stack.client,
            "/v1/conversations/kitchen/resume",
            {"confirmation_id": proposal["confirmation_id"], "decision": "approve"},
            ALICE,
        )
        light = (await ha.get("/api/states/light.kitchen_light")).json()

    progress = [p["message"] for p in of(approved, "tool_progress")]
    assert progress == [
        "Calling light.turn_on for light.kitchen_light",
        "Home Assistant ran light.turn_on",
    ]
    (result,) = of(approved, "tool_result")
    assert result["output"] == (
        "Done: Turn on light.kitchen_light.\nlight.kitchen_light is now on, brightness 100 %."
    )
    assert (light["state"], light["attributes"]["brightness"]) == ("on", 255)
    answer = "".join(data["text"] for data in of(approved, "text_delta"))
    assert answer.startswith(
        'You said: "Turn on the kitchen light". Done: Turn on light.kitchen_light. '
        "light.kitchen_light is now on, brightness 100 %. "
    )
    assert not [words for words in TOOL_ADVICE if words in answer]


async def test_the_demo_model_names_what_the_house_has_when_no_entity_fits_the_words() -> None:
    async with demo_home_stack() as (stack, ha):
        said = await named(
            stack.client,
            "/v1/conversations/kitchen/messages",
            {"content": "Turn on the garage light"},
            ALICE,
        )
        states = (await ha.get("/api/states")).json()
    assert [call["name"] for call in of(said, "tool_call")] == ["ha_list_entities"]
    assert not of(said, "awaiting_confirmation")
    assert of(said, "done")[0]["status"] == "completed"
    answer = "".join(data["text"] for data in of(said, "text_delta"))
    assert answer.startswith(
        'You said: "Turn on the garage light". I could not tell which one you mean by '
        "“garage light”; Home Assistant has Bedroom Lamp (light.bedroom_lamp), Kitchen Light "
        "(light.kitchen_light), Living Room Lights (light.living_room_lights). "
    )
    assert not [words for words in TOOL_ADVICE if words in answer]
    assert [s["state"] for s in states if s["entity_id"].startswith("light.")] == [
        "off",
        "on",
        "off",
    ]


# -- what undo puts back -----------------------------------------------------------------------


def state(entity: str, value: str, **attributes: Any) -> dict[str, Any]:
    return {"entity_id": entity, "state": value, "attributes": attributes}


def put(service_: str, entity: str, **data: Any) -> dict[str, Any]:
    return {"domain": entity.split(".")[0], "service": service_, "entity_id": entity, "data": data}


# (case, the state before the call, the calls that put it back, in words; None: none can)
RESTORES: list[tuple[str, dict[str, Any], list[dict[str, Any]] | None, str]] = [
    (
        "a dimmed light",
        state("light.k", "on", brightness=102, color_mode="brightness"),
        [put("turn_on", "light.k", brightness=102)],
        "light.k back to on, brightness 40 %",
    ),
    (
        "a warm light",
        state("light.k", "on", brightness=255, color_mode="color_temp", color_temp_kelvin=2700),
        [put("turn_on", "light.k", brightness=255, color_temp_kelvin=2700)],
        "light.k back to on, brightness 100 %",
    ),
    (
        "a coloured light",
        state("light.k", "on", brightness=10, color_mode="hs", hs_color=[30, 80]),
        [put("turn_on", "light.k", brightness=10, hs_color=[30, 80])],
        "light.k back to on, brightness 4 %",
    ),
    (
        "an on/off light",
        state("light.k", "on", color_mode="onoff"),
        [put("turn_on", "light.k")],
        "light.k back to on",
    ),
    ("a light off", state("light.k", "off"), [put("turn_off", "light.k")], "light.k back to off"),
    ("a switch", state("switch.s", "on"), [put("turn_on", "switch.s")], "switch.s back to on"),
    (
        "a fan's speed",
        state("fan.f", "on", percentage=33),
        [put("turn_on", "fan.f", percentage=33)],
        "fan.f back to on, speed 33 %",
    ),
    ("a fan off", state("fan.f", "off"), [put("turn_off", "fan.f")], "fan.f back to off"),
    ("a lock", state("lock.d", "locked"), [put("lock", "lock.d")], "lock.d back to locked"),
    (
        "an unlock",
        state("lock.d", "unlocked"),
        [put("unlock", "lock.d")],
        "lock.d back to unlocked",
    ),
    ("a jammed lock", state("lock.d", "jammed"), None, ""),
    (
        "a cover's position",
        state("cover.g", "open", current_position=30),
        [put("set_cover_position", "cover.g", position=30)],
        "cover.g back to open, 30 % open",
    ),
    (
        "a closed door",
        state("cover.g", "closed"),
        [put("close_cover", "cover.g")],
        "cover.g back to closed",
    ),
    (
        "a thermostat",
        state("climate.h", "heat", hvac_modes=["off", "heat"], temperature=20),
        [put("set_temperature", "climate.h", temperature=20, hvac_mode="heat")],
        "climate.h back to heat, set to 20°",
    ),
    (
        "a thermostat's range",
        state(
            "climate.h",
            "heat_cool",
            hvac_modes=["heat_cool"],
            target_temp_low=18,
            target_temp_high=22,
        ),
        [
            put(
                "set_temperature",
                "climate.h",
                target_temp_low=18,
                target_temp_high=22,
                hvac_mode="heat_cool",
            )
        ],
        "climate.h back to heat_cool",
    ),
    (
        "a mode alone",
        state("climate.h", "off", hvac_modes=["off", "heat"]),
        [put("set_hvac_mode", "climate.h", hvac_mode="off")],
        "climate.h back to off",
    ),
    ("a mode it does not list", state("climate.h", "cool", hvac_modes=["heat"]), None, ""),
    (
        "a paused film",
        state("media_player.tv", "paused"),
        [put("media_pause", "media_player.tv")],
        "media_player.tv back to paused",
    ),
    (
        "a player on",
        state("media_player.tv", "idle"),
        [put("turn_on", "media_player.tv")],
        "media_player.tv back to idle",
    ),
    ("a scene: what it set is not known", state("scene.m", "2024-05-31T20:14:03"), None, ""),
    ("a script", state("script.s", "off"), None, ""),
    ("unavailable", state("light.k", "unavailable"), None, ""),
]


@pytest.mark.parametrize(
    ("before", "calls", "said"), [case[1:] for case in RESTORES], ids=[case[0] for case in RESTORES]
)
def test_undo_puts_an_entity_back_with_the_service_of_its_domain(
    before: dict[str, Any], calls: list[dict[str, Any]] | None, said: str
) -> None:
    restore = restore_of(before)
    if calls is None:
        assert restore is None
    else:
        assert restore == Restore(tuple(calls), said)
