"""The Home Assistant tools: read what the house's entities are doing, and call a service on
one of them once the user has confirmed it.

They speak Home Assistant's REST API (https://developers.home-assistant.io/docs/api/rest/),
every request carrying `Authorization: Bearer <BERNARD_HA_TOKEN>`, a long-lived access token
made on the user's profile page in Home Assistant, to `BERNARD_HA_URL`:

- `ha_list_entities(domain?, area?)`: `GET /api/states` answers every entity's state object
  (`entity_id`, `state`, `attributes`, `last_changed`, ...). A state object has no area, so an
  area is resolved by rendering a template (`area_template`): `POST /api/template` answers
  the area's name (none when Home Assistant has no such area) and its entities
  (`area_entities` takes an area's name or id and also counts the entities placed there
  through their device). Home Assistant renders templates only for an administrator's token
  and answers 401 otherwise, the same 401 as for a bad token: the states are read first, so
  a 401 on the template can only be the token's rights. When Home Assistant has no area of
  that name, the tool lists the entities whose friendly name or id mention it instead, and
  says so; an area that exists but holds nothing is said to be empty.
- `ha_get_state(entity_id)`: `GET /api/states/<entity_id>` (404 when there is none).
- `ha_call_service(domain, service, entity_id, data?)`: `POST /api/services/<domain>/<service>`
  with `{"entity_id": ..., **data}`, answered with the states that changed. It changes the
  house: the household's policy (worker/tools/policy.py) reads its domain, service, entity,
  options and, when a rule names one, the entity's area (`call_subjects`: a template,
  `entity_area_template`) and lets it run, refuses it or has it wait for the user's
  confirmation, with a summary in plain words ("Turn on light.kitchen at 40 % brightness").
  Only the domains of `BERNARD_HA_DOMAINS` can be called: the tool is built for them
  (`call_service_tool`), its schema lists them, so a call for another domain fails its schema
  and is never proposed. The entity's state, read just before the call is sent, gives the
  calls that would put it back (`restore_of`), the result's artifact, kept with the call's
  record (shared/records/undo.py).
- `undo()`: puts back the entity of the conversation's last such call, within
  `BERNARD_UNDO_WINDOW_S`, with the service of its domain (a light on at its brightness and
  colour, a lock locked, a thermostat at its mode and temperature; a scene or a script
  cannot be taken back). Home Assistant's `scene.create` with `snapshot_entities` would
  restore as much, but as a scene call: the policy would read `scene.turn_on`, not the lock
  it opens, and the house would keep the scenes. The policy reads the calls undo would make
  (`_undo_subjects`): undoing a lock is an unlock, asked or refused as one.

Home Assistant's REST API does not say what it refuses: a service call on an entity that
does not exist answers `200 []`, and a value the entity refuses (a thermostat set above its
maximum) or a feature it lacks is a bare HTTP 500, the reason only in Home Assistant's log.
So everything that can be checked is checked before the user is asked (`check_call`, the
tool's `confirmation_check`), and again before the call is sent: the domain and the entity
(it exists, `GET /api/states/<id>`), the service and its options (Home Assistant's own
description of them, `GET /api/services`: the service exists, takes these keys, its numbers
are numbers within their bounds, read as its schemas read them ("40" is 40), and it needs
features the entity has) and the values against the entity's attributes (temperatures within
`min_temp`..`max_temp`, a mode among the entity's modes, none when it lists none; an hvac_mode
it does not list is not even refused by Home Assistant 2025.4, the entity takes it).
tests/homeassistant/test_tools.py sends each of these calls to a real Home Assistant to show
what it would do, and holds the tool to refusing them. Home Assistant's websocket API does
return its reasons, but only once the call is made, that is after the user approved it; the
checks here tell the model before anyone is asked, and what still fails with a 500 is said to
be logged by Home Assistant. A call whose answer never came (a timeout, a connection that
broke) may have run: Home Assistant runs a call to its end whatever happens to the
connection (components/api/__init__.py shields it), so the model is told so, and the call is
never sent again.

Requests go through the worker's shared HTTP client (worker/tools/runtime.py), each limited by
`BERNARD_TOOL_HTTP_TIMEOUT_S`.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, TypeGuard

import httpx
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool, ToolException, tool
from pydantic import BaseModel, Field, SecretStr, create_model

from shared.records.reads import Archivist
from shared.records.undo import LOOKBACK, Restore, TooLate, Undoable, Undone, find_undo
from worker.tools.http import ServiceError, request_json, trim
from worker.tools.policy import Subject
from worker.tools.progress import get_reporter
from worker.tools.runtime import get_runtime
from worker.tools.settings import SourceSettings

__all__ = [
    "MAX_ATTRIBUTES",
    "MAX_LISTED",
    "HomeAssistantSettings",
    "area_template",
    "call_service_tool",
    "call_subjects",
    "check_call",
    "describe_call",
    "entity_area_template",
    "ha_get_state",
    "ha_list_entities",
    "home_assistant_tools",
    "restore_of",
    "undo_tool",
]


class HomeAssistantSettings(SourceSettings):
    """Where Home Assistant is, the token that lets Bernard in, and the domains (comma-
    separated) whose services Bernard may call. Both the URL and the token set: the tools
    are offered."""

    ha_url: str | None = Field(None, alias="BERNARD_HA_URL")
    ha_token: SecretStr | None = Field(None, alias="BERNARD_HA_TOKEN")
    ha_domains: str = Field(
        "light,switch,fan,climate,cover,media_player,scene,script", alias="BERNARD_HA_DOMAINS"
    )

    def ha_domain_names(self) -> frozenset[str]:
        return frozenset(name.strip() for name in self.ha_domains.split(",") if name.strip())


SERVICE = "Home Assistant"
MAX_LISTED = 40  # entities in one list; the model narrows by domain or area for the rest
MAX_ATTRIBUTES = 25
ATTRIBUTE_CHARS = 200
MAX_AREA_CHARS = 100
MAX_DATA_CHARS = 2000
REFUSED = "; check BERNARD_HA_TOKEN (a long-lived access token from a Home Assistant profile)"
REFUSED_TEMPLATE = (
    "; listing by area renders a template, which Home Assistant allows only with an "
    "administrator's token: use an administrator's token in BERNARD_HA_TOKEN, or list by "
    "domain instead"
)
MAY_HAVE_RUN = "; the call may have run all the same: check with ha_get_state before trying again"
# Home Assistant's own rule for ids (homeassistant/core.py `valid_entity_id`), in short.
_NAME = re.compile(r"[a-z0-9]+(?:_[a-z0-9]+)*")
_ENTITY_ID = re.compile(r"[a-z0-9]+(?:_[a-z0-9]+)*\.[a-z0-9]+(?:_[a-z0-9]+)*")
# An area name goes into a template, so only what area names are made of gets in.
_AREA = re.compile(r"[\w' .-]+")
# Keys that would widen the call beyond the confirmed entity.
_TARGETS = ("entity_id", "device_id", "area_id", "floor_id", "label_id")
# Domains whose state is when the entity was last activated, not a condition it is in.
_ACTIVATED = frozenset({"scene", "button", "input_button"})
# A script is on while it runs (homeassistant/components/script/__init__.py).
_SCRIPT_STATES = {"on": "running", "off": "not running"}
# An option naming a mode, and the attribute listing the entity's modes: Home Assistant
# refuses a mode outside the list (climate's and fan's `_valid_..._mode_or_raise`), except
# an hvac_mode, which 2025.4 only warns about and the entity takes (a generic thermostat
# asked for "cool" is set to cool and turns its heater on): refused here all the same.
_MODES = (
    ("hvac_mode", "hvac_modes"),
    ("preset_mode", "preset_modes"),
    ("fan_mode", "fan_modes"),
    ("swing_mode", "swing_modes"),
    ("effect", "effect_list"),
)
# Numbers an entity bounds with its own attributes (climate's temperature and humidity).
_BOUNDS = (
    ("temperature", "min_temp", "max_temp", "°"),
    ("target_temp_low", "min_temp", "max_temp", "°"),
    ("target_temp_high", "min_temp", "max_temp", "°"),
    ("humidity", "min_humidity", "max_humidity", " %"),
)
# The errors of a request that was never sent: nothing can have run.
_UNSENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)


# -- reading ---------------------------------------------------------------------------------


@tool
async def ha_list_entities(
    config: RunnableConfig, domain: str | None = None, area: str | None = None
) -> str:
    """List Home Assistant entities (lights, switches, thermostats, sensors...) and their state.

    `domain` keeps one kind of entity ("light", "switch", "climate", "sensor", ...). `area` keeps
    the entities of one area of the house ("kitchen", "living room"). Use the entity ids it
    gives with ha_get_state and ha_call_service.
    """
    reporter = get_reporter(config)
    with reporter.reporting_errors():
        kind = _domain(domain) if domain is not None and domain.strip() else None
        where = _area(area) if area is not None and area.strip() else None
        base, headers = _service(get_runtime(config).tool_settings.of(HomeAssistantSettings))
        # The states first: a bad token fails here, so a 401 on the template that follows
        # can only mean the token is not an administrator's.
        reporter.step(f"Asking Home Assistant for its {f'{kind} ' if kind else ''}entities")
        states = _states(
            await request_json(
                config,
                "GET",
                f"{base}/api/states",
                service=SERVICE,
                headers=headers,
                refused=REFUSED,
                reason_of=_reason,
            )
        )
        found = [s for s in states if kind is None or s["entity_id"].startswith(f"{kind}.")]
        place: _Area | None = None
        if where is not None:
            reporter.step(f"Finding the entities in “{where}”")
            place = await _area_entities(config, base, headers, where)
            if place.name is not None:
                found = [s for s in found if s["entity_id"] in place.entities]
            else:  # no such area: the names may still say where a thing is
                found = [s for s in found if _mentions(s, where)]
    reporter.complete(f"Found {len(found)} entit{'y' if len(found) == 1 else 'ies'}")
    return _render_list(found, kind, where, place)


@tool
async def ha_get_state(entity_id: str, config: RunnableConfig) -> str:
    """Get the current state and attributes of one Home Assistant entity, such as
    "light.kitchen" or "climate.hall" (ha_list_entities gives the ids)."""
    reporter = get_reporter(config)
    with reporter.reporting_errors():
        entity = _entity_id(entity_id)
        base, headers = _service(get_runtime(config).tool_settings.of(HomeAssistantSettings))
        reporter.step(f"Reading the state of {entity}")
        state = await _state_of(config, base, headers, entity)
        if state is None:
            raise ToolException(
                f"Error: Home Assistant has no entity {entity}; call ha_list_entities for the ids"
            )
    reporter.complete(f"{entity} is {state['state']}")
    return _render_state(state)


# -- calling a service -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Call:
    """A service call as it will be sent, checked against the house as it is."""

    domain: str
    service: str
    entity: str
    data: dict[str, Any]
    state: dict[str, Any]

    def args(self) -> dict[str, Any]:
        return {
            "domain": self.domain,
            "service": self.service,
            "entity_id": self.entity,
            "data": self.data,
        }


async def check_call(args: dict[str, Any], config: RunnableConfig) -> str:
    """The summary of a service call that can run, or a `ToolException` saying why it
    cannot (the tool's `confirmation_check`: worker/tools/confirmation.py)."""
    call = await _checked(
        config,
        str(args.get("domain", "")),
        str(args.get("service", "")),
        str(args.get("entity_id", "")),
        args.get("data"),
    )
    return describe_call(call.args())


async def _checked(
    config: RunnableConfig, domain: str, service: str, entity_id: str, data: Any
) -> _Call:
    """The call once everything Home Assistant would refuse without saying why is ruled out;
    reads the entity's state and the service's description, changes nothing."""
    settings = get_runtime(config).tool_settings.of(HomeAssistantSettings)
    allowed = settings.ha_domain_names()
    domain, service = _domain(domain), _service_name(service)
    if domain not in allowed:
        raise ToolException(
            f"Error: Bernard may not call {domain} services; the domains it may call are "
            f"{', '.join(sorted(allowed)) or 'none'} (BERNARD_HA_DOMAINS)"
        )
    entity = _entity_id(entity_id)
    if entity.split(".", 1)[0] != domain:
        raise ToolException(
            f"Error: {entity} is not a {domain} entity; call {domain} services on "
            f"{domain}.* entities"
        )
    options = _data(data)
    base, headers = _service(settings)
    state = await _state_of(config, base, headers, entity)
    if state is None:  # Home Assistant would answer `200 []` and do nothing
        raise ToolException(
            f"Error: Home Assistant has no entity {entity}, so {domain}.{service} would do "
            "nothing; call ha_list_entities for the ids"
        )
    description = await _description(config, base, headers, domain, service)
    problem = _refusal(domain, service, entity, options, state, description)
    if problem is not None:
        raise ToolException(f"Error: {problem}; nothing was sent to Home Assistant")
    return _Call(domain, service, entity, options, state)


async def _call_service(
    domain: str,
    service: str,
    entity_id: str,
    config: RunnableConfig,
    data: dict[str, Any] | None = None,
) -> tuple[str, Restore | None]:
    """Call a Home Assistant service on one entity; the result's artifact is what would put
    the entity back as it was just before (`restore_of`, for `undo`)."""
    reporter = get_reporter(config)
    with reporter.reporting_errors():
        call = await _checked(config, domain, service, entity_id, data)
        # The state `_checked` read, just before the call is sent, is what undo puts back.
        restore = _restore_or_none(call.state)
        latest = await _send(config, call)
    reporter.complete(f"Home Assistant ran {call.domain}.{call.service}")
    lines = [f"Done: {describe_call(call.args())}.", *_changes(call.entity, latest)]
    return "\n".join(lines), restore


async def _send(config: RunnableConfig, call: _Call) -> dict[str, dict[str, Any]]:
    """Send a checked call; the states it changed, the last of each entity."""
    base, headers = _service(get_runtime(config).tool_settings.of(HomeAssistantSettings))
    what = f"{call.domain}.{call.service}"
    get_reporter(config).step(f"Calling {what} for {call.entity}")
    try:
        changed = await request_json(
            config,
            "POST",
            f"{base}/api/services/{call.domain}/{call.service}",
            service=SERVICE,
            json={"entity_id": call.entity, **call.data},
            headers=headers,
            refused=REFUSED,
            reason_of=_reason,
        )
    except ServiceError as exc:
        raise ToolException(_service_failure(exc, what, call.entity)) from exc
    except ToolException as exc:
        if isinstance(exc.__cause__, _UNSENT):  # never sent: nothing ran
            raise
        raise ToolException(f"{exc}{MAY_HAVE_RUN}") from exc
    # Home Assistant answers every state the call wrote, in order: an entity that changed
    # twice (a script run to its end: on, then off) is there twice, and its last state is
    # the one it is in.
    return {s["entity_id"]: s for s in _states(changed)}


def _changes(entity: str, latest: dict[str, dict[str, Any]]) -> list[str]:
    """What the model reads of the states a call changed."""
    latest = dict(latest)
    mine = latest.pop(entity, None)
    lines = [
        f"{_now(mine)}."
        if mine is not None
        else f"Home Assistant reported no change of {entity}'s state."
    ]
    return lines + [f"Also changed: {_now(s)}." for s in list(latest.values())[:5]]


# -- what the policy reads of a call (worker/tools/policy.py) --------------------------------


async def call_subjects(args: dict[str, Any], config: RunnableConfig, areas: bool) -> list[Subject]:
    """What an `ha_call_service` call acts on: its domain, service, entity and options, and
    (when a rule names an area) the entity's area, read from Home Assistant."""
    data = args.get("data")
    return [
        await _subject(
            config,
            str(args.get("domain", "")),
            str(args.get("service", "")),
            str(args.get("entity_id", "")),
            data if isinstance(data, dict) else {},
            areas,
        )
    ]


async def _subject(
    config: RunnableConfig,
    domain: str,
    service: str,
    entity_id: str,
    data: dict[str, Any],
    areas: bool,
) -> Subject:
    entity = entity_id.strip().lower()
    area: tuple[str, ...] | None = None
    known = True
    if areas:
        try:
            area = await _area_of(config, entity)
        except ToolException:  # no administrator's token, Home Assistant away: not known
            known = False
    return Subject(
        tool="ha_call_service",
        declared=True,
        domain=domain.strip().lower(),
        service=service.strip().lower(),
        entity=entity,
        area=area,
        area_known=known,
        options=data,
    )


def entity_area_template(entity: str) -> str:
    """The template that gives an entity's area (its own, or its device's): its name and id,
    both null for an entity in no area (helpers/template.py `area_name`, `area_id`)."""
    name = json.dumps(entity)
    return f'{{{{ {{"name": area_name({name}), "id": area_id({name})}} | tojson }}}}'


async def _area_of(config: RunnableConfig, entity: str) -> tuple[str, ...] | None:
    """The area an entity is in (its name and id), None for none; `ToolException` when Home
    Assistant cannot say (not an entity id, a token that may not render templates)."""
    if not _ENTITY_ID.fullmatch(entity):
        raise ToolException(f"Error: {trim(entity, 70)!r} is not an entity id")
    base, headers = _service(get_runtime(config).tool_settings.of(HomeAssistantSettings))
    rendered = await request_json(
        config,
        "POST",
        f"{base}/api/template",
        service=SERVICE,
        json={"template": entity_area_template(entity)},
        headers=headers,
        refused=REFUSED_TEMPLATE,
        reason_of=_reason,
    )
    name = rendered.get("name") if isinstance(rendered, dict) else None
    area_id = rendered.get("id") if isinstance(rendered, dict) else None
    if not isinstance(rendered, dict) or not all(
        isinstance(v, str | None) for v in (name, area_id)
    ):
        raise ToolException(f"Error: {SERVICE} sent an unexpected response to a template")
    found = tuple(v for v in (name, area_id) if isinstance(v, str))
    return found or None


# -- undo ------------------------------------------------------------------------------------

# States of a lock, and the service that brings each back.
_LOCK_SERVICES = {"locked": "lock", "locking": "lock", "unlocked": "unlock", "unlocking": "unlock"}
_COVER_SERVICES = {
    "open": "open_cover",
    "opening": "open_cover",
    "closed": "close_cover",
    "closing": "close_cover",
}
_PLAYER_SERVICES = {"off": "turn_off", "playing": "media_play", "paused": "media_pause"}
# A light's colour, by its color_mode: the option that sets it again.
_COLOURS = {
    "color_temp": "color_temp_kelvin",
    "hs": "hs_color",
    "rgb": "rgb_color",
    "rgbw": "rgbw_color",
    "rgbww": "rgbww_color",
    "xy": "xy_color",
}
_ON_OFF = frozenset({"switch", "fan", "light", "input_boolean", "humidifier", "siren"})


def restore_of(state: dict[str, Any]) -> Restore | None:
    """The service calls that put an entity back in `state` (its state object); None for
    what cannot be put back (a scene or a script ran: nothing says what it changed; an
    entity unavailable, or in a state no service sets)."""
    entity, value = state["entity_id"], state["state"]
    attributes = state.get("attributes") or {}
    domain = entity.split(".", 1)[0]
    calls: list[tuple[str, dict[str, Any]]] = []
    if domain == "light" and value == "on":
        data: dict[str, Any] = {}
        if _number(attributes.get("brightness")):
            data["brightness"] = round(attributes["brightness"])
        colour = _COLOURS.get(str(attributes.get("color_mode")))
        if colour is not None and attributes.get(colour) is not None:
            data[colour] = attributes[colour]
        calls.append(("turn_on", data))
    elif domain == "fan" and value == "on" and _number(attributes.get("percentage")):
        calls.append(("turn_on", {"percentage": attributes["percentage"]}))
    elif domain in _ON_OFF and value in ("on", "off"):
        calls.append((f"turn_{value}", {}))
    elif domain == "lock" and value in _LOCK_SERVICES:
        calls.append((_LOCK_SERVICES[value], {}))
    elif domain == "cover" and _number(attributes.get("current_position")):
        calls.append(("set_cover_position", {"position": attributes["current_position"]}))
    elif domain == "cover" and value in _COVER_SERVICES:
        calls.append((_COVER_SERVICES[value], {}))
    elif domain == "climate" and value in (attributes.get("hvac_modes") or ()):
        wanted = {k: attributes.get(k) for k in ("target_temp_low", "target_temp_high")}
        if _number(attributes.get("temperature")):
            calls.append(
                ("set_temperature", {"temperature": attributes["temperature"], "hvac_mode": value})
            )
        elif all(_number(v) for v in wanted.values()):
            calls.append(("set_temperature", {**wanted, "hvac_mode": value}))
        else:
            calls.append(("set_hvac_mode", {"hvac_mode": value}))
    elif domain == "media_player" and value in _PLAYER_SERVICES:
        calls.append((_PLAYER_SERVICES[value], {}))
    elif domain == "media_player" and value in ("on", "idle"):
        calls.append(("turn_on", {}))
    if not calls:
        return None
    made = tuple(
        {"domain": domain, "service": service, "entity_id": entity, "data": data}
        for service, data in calls
    )
    return Restore(made, f"{entity} back to {_brief(state)}")


def _restore_or_none(state: dict[str, Any]) -> Restore | None:
    """`restore_of`, None for a state it cannot read (an attribute of an unexpected type):
    a call that cannot be undone still runs."""
    try:
        return restore_of(state)
    except (TypeError, ValueError, KeyError, AttributeError):
        return None


async def _undoable(config: RunnableConfig) -> Undoable:
    """The last change to the house in this conversation that can be put back; a
    `ToolException` saying why there is none."""
    runtime = get_runtime(config)
    if runtime.conversation_id is None:
        raise ToolException("Error: undo works in a stored conversation; this turn has none")
    archivist = Archivist(
        runtime.redis, runtime.owner, retention_s=runtime.settings.conversation_retention_s
    )
    records = await archivist.latest_calls(runtime.conversation_id, LOOKBACK)
    window = runtime.settings.undo_window_s
    found = find_undo(records, now=time.time(), window_s=window)
    if found is None:
        raise ToolException(
            "Error: there is nothing to undo: Bernard made no change to the house in this "
            "conversation that it can put back"
        )
    if isinstance(found, TooLate):
        raise ToolException(
            f"Error: the last change was made {time.time() - found.at:.0f} s ago, and Bernard "
            f"undoes a change for {window:g} s only (BERNARD_UNDO_WINDOW_S)"
        )
    return found


async def _undo_subjects(
    args: dict[str, Any], config: RunnableConfig, areas: bool
) -> list[Subject]:
    """What undo would call, as the policy reads it: undoing an unlock is a lock call, asked
    or refused as one. None to undo: nothing (the tool then says so)."""
    try:
        found = await _undoable(config)
    except ToolException:
        return []
    return [
        await _subject(
            config, c["domain"], c["service"], c["entity_id"], dict(c.get("data") or {}), areas
        )
        for c in found.restore.calls
    ]


async def check_undo(args: dict[str, Any], config: RunnableConfig) -> str:
    """`undo`'s `confirmation_check`: what it would put back, once each call it would make
    can run; a `ToolException` when it cannot."""
    found = await _undoable(config)
    for c in found.restore.calls:
        await _checked(config, c["domain"], c["service"], c["entity_id"], c.get("data"))
    return f"Undo the last change: put {found.restore.said}"


async def _undo(config: RunnableConfig) -> tuple[str, Undone]:
    """Put back the entity of the last change to the house in this conversation."""
    reporter = get_reporter(config)
    with reporter.reporting_errors():
        found = await _undoable(config)
        reporter.step(f"Putting {found.restore.said}")
        lines = [f"Undone: put {found.restore.said}."]
        for c in found.restore.calls:
            call = await _checked(config, c["domain"], c["service"], c["entity_id"], c.get("data"))
            lines += _changes(call.entity, await _send(config, call))
    reporter.complete("Put back")
    return "\n".join(lines), Undone(found.call_id)


def undo_tool() -> BaseTool:
    """The `undo` tool: offered beside `ha_call_service`."""
    made = StructuredTool.from_function(
        coroutine=_undo,
        name="undo",
        description=(
            "Undo the last change Bernard made to the house in this conversation (when the "
            'user says "undo that", "put it back"): puts the entity back as it was just '
            "before, within a few minutes of the change."
        ),
        response_format="content_and_artifact",
        metadata={
            "confirmation_summary": lambda args: "Undo the last change to the house",
            "confirmation_check": check_undo,
            "policy_subjects": _undo_subjects,
        },
    )
    made.handle_tool_error = True
    return made


def _service_failure(exc: ServiceError, what: str, entity: str) -> str:
    """What the model reads of Home Assistant refusing a call it was sent."""
    if exc.status == 400 and not exc.reason:  # its plain "400: Bad Request", before running
        return (
            f"{exc}: {what} may not exist, or its data is not valid for {entity}; nothing "
            "was changed; check the entity with ha_get_state"
        )
    if exc.status == 500 and not exc.reason:  # a refusal its REST API does not explain
        return (
            f"{exc}: Home Assistant refused or could not carry out {what} for {entity} and "
            "gives the reason only in its log (Settings > System > Logs); check the entity "
            "with ha_get_state"
        )
    return str(exc)


def call_service_tool(domains: Iterable[str]) -> BaseTool:
    """The `ha_call_service` tool for these domains (its schema lists them; at least one)."""
    allowed = tuple(sorted(set(domains)))
    if not allowed:
        raise ValueError("ha_call_service needs at least one domain it may call")
    domain_type: Any = Literal[allowed]
    schema: type[BaseModel] = create_model(
        "HaCallService",
        domain=(
            domain_type,
            Field(description="The service's domain, the part of the entity id before the dot"),
        ),
        service=(
            str,
            Field(description='The service, e.g. "turn_on", "turn_off", "set_temperature"'),
        ),
        entity_id=(str, Field(description='The entity to act on, e.g. "light.kitchen"')),
        data=(
            dict[str, Any] | None,
            Field(
                None,
                description='The service\'s options, e.g. {"brightness_pct": 40} or '
                '{"temperature": 21}',
            ),
        ),
    )
    call = StructuredTool.from_function(
        coroutine=_call_service,
        name="ha_call_service",
        description=(
            "Control a Home Assistant device: call a service (turn_on, turn_off, toggle, "
            "set_temperature, open_cover, ...) on one entity. The household's policy says "
            "which calls the user confirms before they run."
        ),
        args_schema=schema,
        response_format="content_and_artifact",
        metadata={
            "requires_confirmation": True,
            "confirmation_summary": describe_call,
            "confirmation_check": check_call,
            "policy_subjects": call_subjects,
        },
    )
    # The model reads the error text as the tool's result and can correct its call.
    call.handle_tool_error = True
    return call


def home_assistant_tools(settings: HomeAssistantSettings) -> list[BaseTool]:
    """The Home Assistant tools for `settings`: the reads, and the call when any domain is
    allowed."""
    tools: list[BaseTool] = [ha_list_entities, ha_get_state]
    if settings.ha_domain_names():
        tools += [call_service_tool(settings.ha_domain_names()), undo_tool()]
    return tools


# The model reads the error text as the tool's result and can answer without it.
ha_list_entities.handle_tool_error = True
ha_get_state.handle_tool_error = True


# -- the summary the user confirms -------------------------------------------------------------

_VERBS = {
    "turn_on": "Turn on",
    "turn_off": "Turn off",
    "toggle": "Toggle",
    "open_cover": "Open",
    "close_cover": "Close",
    "stop_cover": "Stop",
    "lock": "Lock",
    "unlock": "Unlock",
    "media_play": "Play",
    "media_pause": "Pause",
    "media_stop": "Stop",
    "media_next_track": "Skip to the next track on",
    "media_previous_track": "Go back a track on",
    "volume_up": "Turn up the volume of",
    "volume_down": "Turn down the volume of",
}


def describe_call(args: dict[str, Any]) -> str:
    """What a service call does, in plain words, every option of `data` named.

    `{"domain": "light", "service": "turn_on", "entity_id": "light.kitchen", "data":
    {"brightness_pct": 40}}` -> "Turn on light.kitchen at 40 % brightness". Temperatures are
    in the unit Home Assistant is set to, which a call does not say, so they read "21°".
    """
    domain, service = str(args.get("domain", "")), str(args.get("service", ""))
    entity = str(args.get("entity_id", ""))
    data = dict(args.get("data") or {})
    head = _head(domain, service, entity, data)
    parts = [head, *_options(data)]
    rest = ", ".join(f"{key}={_value(value)}" for key, value in data.items())
    if rest:
        parts.append(f"with {rest}")
    return " ".join(parts)


def _head(domain: str, service: str, entity: str, data: dict[str, Any]) -> str:
    """The call's verb and object; takes the options it says out of `data`."""
    if domain == "scene" and service == "turn_on":
        return f"Activate {entity}"
    if domain == "script" and (service == "turn_on" or entity == f"script.{service}"):
        return f"Run {entity}"  # script.turn_on, or the script's own service
    if service == "set_temperature":
        if "temperature" in data:
            head = f"Set {entity} to {_degrees(data.pop('temperature'))}"
        elif {"target_temp_low", "target_temp_high"} <= data.keys():
            low, high = data.pop("target_temp_low"), data.pop("target_temp_high")
            head = f"Keep {entity} between {_degrees(low)} and {_degrees(high)}"
        else:
            head = f"Change the temperature of {entity}"
        if "hvac_mode" in data:
            head += f" in {_value(data.pop('hvac_mode'), quote=False)} mode"
        return head
    if service == "set_hvac_mode" and "hvac_mode" in data:
        return f"Switch {entity} to {_value(data.pop('hvac_mode'), quote=False)} mode"
    if service == "set_cover_position" and "position" in data:
        return f"Open {entity} to {_value(data.pop('position'))} %"
    if service == "volume_set" and isinstance(data.get("volume_level"), int | float):
        return f"Set the volume of {entity} to {data.pop('volume_level') * 100:g} %"
    if service in _VERBS:
        return f"{_VERBS[service]} {entity}"
    return f"Call {domain}.{service} on {entity}"


def _options(data: dict[str, Any]) -> list[str]:
    """The light options a person would name, in words; taken out of `data`."""
    said = []
    if "brightness_pct" in data:
        said.append(f"at {_value(data.pop('brightness_pct'))} % brightness")
    elif isinstance(data.get("brightness"), int | float):
        said.append(f"at {round(data.pop('brightness') / 255 * 100)} % brightness")
    if "color_name" in data:
        said.append(f"in {_value(data.pop('color_name'), quote=False)}")
    if "color_temp_kelvin" in data:
        said.append(f"at {_value(data.pop('color_temp_kelvin'))} K")
    if "transition" in data:
        said.append(f"over {_value(data.pop('transition'))} s")
    return said


def _degrees(value: Any) -> str:
    return f"{value:g}°" if isinstance(value, int | float) else _value(value)


def _value(value: Any, *, quote: bool = True) -> str:
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int | float):
        return f"{value:g}"
    if isinstance(value, str) and not quote:
        return value
    return json.dumps(value, ensure_ascii=False)


# -- checking what the model sent --------------------------------------------------------------


def _service(settings: HomeAssistantSettings) -> tuple[str, dict[str, str]]:
    """Home Assistant's base URL and the headers that authorize a request to it."""
    if not (settings.ha_url and settings.ha_token):
        raise ToolException(
            "Error: Home Assistant is not configured (BERNARD_HA_URL and BERNARD_HA_TOKEN)"
        )
    token = settings.ha_token.get_secret_value()
    return settings.ha_url.rstrip("/"), {"Authorization": f"Bearer {token}"}


def _domain(domain: str) -> str:
    name = domain.strip().lower()
    if not _NAME.fullmatch(name) or len(name) > 64:
        raise ToolException(f"Error: the domain {trim(domain, 70)!r} is not a domain name")
    return name


def _service_name(service: str) -> str:
    name = service.strip().lower()
    if not _NAME.fullmatch(name) or len(name) > 64:
        raise ToolException(f"Error: the service {trim(service, 70)!r} is not a service name")
    return name


def _entity_id(entity_id: str) -> str:
    entity = entity_id.strip().lower()
    if not entity:
        raise ToolException("Error: the entity id is empty")
    if not _ENTITY_ID.fullmatch(entity) or len(entity) > 255:
        raise ToolException(
            f"Error: the entity id {trim(entity_id, 70)!r} is not one; an entity id is "
            "domain.name, like light.kitchen"
        )
    return entity


def _area(area: str) -> str:
    where = " ".join(area.split())
    if len(where) > MAX_AREA_CHARS or not _AREA.fullmatch(where):
        raise ToolException(f"Error: the area {trim(area, 70)!r} is not an area name")
    return where


def _data(data: dict[str, Any] | None) -> dict[str, Any]:
    """The service's options; never a second target, never more than a service needs."""
    data = dict(data or {})
    widened = [key for key in _TARGETS if key in data]
    if widened:
        raise ToolException(
            f"Error: data may not hold {', '.join(widened)}: a call acts on its one entity_id"
        )
    if len(json.dumps(data, default=str)) > MAX_DATA_CHARS:
        raise ToolException(f"Error: data is longer than {MAX_DATA_CHARS} characters")
    return data


@dataclass(frozen=True, slots=True)
class _Area:
    """An area as Home Assistant resolved a name: its `name` (None: it has no such area) and
    the entities in it."""

    name: str | None
    entities: frozenset[str]


def area_template(area: str) -> str:
    """The template that resolves `area` (a name or an id) to its name and its entities.

    `area_name` answers for an area's id, `area_id` for its name (helpers/template.py in Home
    Assistant); neither answers for an area Home Assistant does not have, which tells it
    apart from an area with no entities. `json.dumps` makes the name a quoted string
    literal, as Jinja reads one; `_area` has already kept out anything but the characters of
    a name.
    """
    name = json.dumps(area)
    return (
        f'{{{{ {{"area": area_name({name}) or area_name(area_id({name}) or ""), '
        f'"entities": area_entities({name})}} | tojson }}}}'
    )


async def _area_entities(
    config: RunnableConfig, base: str, headers: dict[str, str], area: str
) -> _Area:
    rendered = await request_json(
        config,
        "POST",
        f"{base}/api/template",
        service=SERVICE,
        json={"template": area_template(area)},
        headers=headers,
        refused=REFUSED_TEMPLATE,
        reason_of=_reason,
    )
    name = rendered.get("area") if isinstance(rendered, dict) else None
    ids = rendered.get("entities") if isinstance(rendered, dict) else None
    if (
        not isinstance(ids, list)
        or not all(isinstance(i, str) for i in ids)
        or not isinstance(name, str | None)
    ):
        raise ToolException(f"Error: {SERVICE} sent an unexpected response to a template")
    return _Area(name, frozenset(ids))


async def _state_of(
    config: RunnableConfig, base: str, headers: dict[str, str], entity: str
) -> dict[str, Any] | None:
    """The entity's state object; None when Home Assistant has no such entity."""
    data = await request_json(
        config,
        "GET",
        f"{base}/api/states/{entity}",
        service=SERVICE,
        headers=headers,
        refused=REFUSED,
        missing_ok=True,
        reason_of=_reason,
    )
    if data is None:
        return None
    (state,) = _states([data])
    return state


async def _description(
    config: RunnableConfig, base: str, headers: dict[str, str], domain: str, service: str
) -> dict[str, Any] | None:
    """Home Assistant's description of the service (its fields and target), `{}` when it has
    no such service, None when it does not describe its services (an older or a pretend Home
    Assistant, or one whose descriptions do not fit the size limit): then the service and
    its options are left to Home Assistant, which refuses them with a plain 400."""
    try:
        listed = await request_json(
            config,
            "GET",
            f"{base}/api/services",
            service=SERVICE,
            headers=headers,
            refused=REFUSED,
            missing_ok=True,
            reason_of=_reason,
        )
    except ServiceError as exc:
        if exc.status in (401, 403):
            raise
        return None
    except ToolException:
        return None
    if not isinstance(listed, list):
        return None
    for entry in listed:
        if isinstance(entry, dict) and entry.get("domain") == domain:
            services = entry.get("services")
            found = services.get(service) if isinstance(services, dict) else None
            return found if isinstance(found, dict) else {}
    return {}


def _refusal(
    domain: str,
    service: str,
    entity: str,
    data: dict[str, Any],
    state: dict[str, Any],
    description: dict[str, Any] | None,
) -> str | None:
    """Why Home Assistant would refuse the call, as far as its description of the service and
    the entity's attributes tell; None when nothing does."""
    what = f"{domain}.{service}"
    attributes = state["attributes"]
    features = attributes.get("supported_features")
    features = features if isinstance(features, int) else 0
    if description is not None:
        if not description:
            return f"Home Assistant has no service {what}"
        fields = _fields(description)
        unknown = [key for key in data if key not in fields]
        if unknown:
            known = ", ".join(sorted(fields)) or "none"
            return f"{what} takes no {', '.join(unknown)}; the options it takes are {known}"
        for key, value in data.items():
            problem = _out_of_selector(key, value, fields[key])
            if problem is not None:
                return problem
        required = [
            f
            for target in (description.get("target") or {}).get("entity") or []
            if isinstance(target, dict)
            for f in [target.get("supported_features")]
            if isinstance(f, list) and f
        ]
        if required and not any(
            any(isinstance(bits, int) and features & bits == bits for bits in needed)
            for needed in required
        ):
            return f"{entity} does not support {what}"
    if domain == "climate" and service == "set_temperature":
        if "temperature" in data and not features & 1:
            return f"{entity} keeps a temperature range: set target_temp_low and target_temp_high"
        if {"target_temp_low", "target_temp_high"} & data.keys() and not features & 2:
            return f"{entity} keeps one temperature: set temperature"
        low = _as_number(data.get("target_temp_low"))
        high = _as_number(data.get("target_temp_high"))
        if low is not None and high is not None and low > high:
            return f"target_temp_low ({low:g}°) is above target_temp_high ({high:g}°)"
    for key, listed in _MODES:
        modes = attributes.get(listed)
        if key not in data:
            continue
        if modes is None:
            # An entity lists its modes of a kind whenever it has the feature: without the
            # list, Home Assistant refuses the mode (a fan's preset, a 500) or drops it and
            # runs the rest (a light's effect), neither what the user would be asked.
            return f"{entity} has no {key} {_value(data[key])}: it has no {listed}"
        if isinstance(modes, list) and data[key] not in modes:
            shown = ", ".join(str(m) for m in modes) or "none"
            return f"{entity} has no {key} {_value(data[key])}; its {listed} are {shown}"
    for key, least, most, unit in _BOUNDS:
        low, high, value = attributes.get(least), attributes.get(most), _as_number(data.get(key))
        if value is not None and _number(low) and _number(high) and not low <= value <= high:
            return (
                f"{entity} accepts a {key} from {low:g}{unit} to {high:g}{unit}, "
                f"not {value:g}{unit}"
            )
    return None


def _fields(description: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A service's options by name, those of its sections too (`advanced_fields`)."""
    found: dict[str, dict[str, Any]] = {}
    for name, spec in (description.get("fields") or {}).items():
        if not isinstance(spec, dict):
            continue
        if isinstance(spec.get("fields"), dict):  # a section
            found |= {k: v for k, v in spec["fields"].items() if isinstance(v, dict)}
        else:
            found[name] = spec
    return found


def _out_of_selector(key: str, given: Any, spec: dict[str, Any]) -> str | None:
    """What is not a number, or a number outside the bounds the service's own description
    gives it, in an option the description says is a number."""
    number = (spec.get("selector") or {}).get("number")
    if not isinstance(number, dict):
        return None
    value = _as_number(given)
    if value is None:
        return f"{key} must be a number, not {_value(given)}"
    low, high = number.get("min"), number.get("max")
    if _number(low) and _number(high) and not low <= value <= high:
        return f"{key} must be from {low:g} to {high:g}, not {value:g}"
    return None


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _as_number(value: Any) -> float | None:
    """A value as Home Assistant's service schemas read a number (`vol.Coerce(float)`: "40"
    is 40.0, and a temperature of "40" is refused as 40 is); None when it is not one, and
    for not-a-number and the infinities, which it takes or refuses without meaning them."""
    if _number(value):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
    else:
        return None
    return number if math.isfinite(number) else None


def _states(data: Any) -> list[dict[str, Any]]:
    """State objects with the fields the tools read; a tool error for any other shape."""
    if not isinstance(data, list) or not all(
        isinstance(s, dict)
        and isinstance(s.get("entity_id"), str)
        and isinstance(s.get("state"), str)
        and isinstance(s.get("attributes", {}), dict)
        for s in data
    ):
        raise ToolException(f"Error: {SERVICE} sent an unexpected response (not state objects)")
    return [{**s, "attributes": s.get("attributes") or {}} for s in data]


def _reason(body: Any) -> str | None:
    # Home Assistant explains a refusal as {"message": "..."}.
    message = body.get("message") if isinstance(body, dict) else None
    return trim(message, 300) if isinstance(message, str) else None


def _mentions(state: dict[str, Any], words: str) -> bool:
    wanted = words.lower().replace(" ", "_")
    name = str(state["attributes"].get("friendly_name") or "").lower().replace(" ", "_")
    return wanted in name or wanted in state["entity_id"]


# -- what the model reads ----------------------------------------------------------------------


def _label(state: dict[str, Any]) -> str:
    name = state["attributes"].get("friendly_name")
    return (
        f"{state['entity_id']} “{trim(name, 60)}”" if isinstance(name, str) else state["entity_id"]
    )


def _now(state: dict[str, Any]) -> str:
    """A changed entity as the call's result says it: what it is now, or, for an entity whose
    state is the time it was last activated (a scene), that it was; a script is running or
    not (its on and off), not switched on or off."""
    entity = state["entity_id"]
    kind = entity.split(".", 1)[0]
    if kind in _ACTIVATED:
        return f"{entity} was activated at {trim(state['state'], 60)}"
    if kind == "script" and state["state"] in _SCRIPT_STATES:
        return f"{entity} is {_SCRIPT_STATES[state['state']]}"
    return f"{entity} is now {_brief(state)}"


def _brief(state: dict[str, Any]) -> str:
    """The state with the attributes a person asks about first."""
    value, attributes = state["state"], state["attributes"]
    kind = state["entity_id"].split(".", 1)[0]
    if kind in _ACTIVATED:
        return (
            f"last activated {trim(value, 60)}"
            if value not in ("unknown", "")
            else "never activated"
        )
    if kind == "script" and value in _SCRIPT_STATES:
        return _SCRIPT_STATES[value]
    parts = [trim(value, 60)]
    unit = attributes.get("unit_of_measurement")
    if isinstance(unit, str) and unit:
        parts = [f"{trim(value, 60)} {unit}"]
    brightness = attributes.get("brightness")
    if kind == "light" and value == "on" and isinstance(brightness, int | float):
        parts.append(f"brightness {round(brightness / 255 * 100)} %")
    if kind == "climate":
        now, target = attributes.get("current_temperature"), attributes.get("temperature")
        if isinstance(now, int | float):
            parts.append(f"{now:g}° now")
        if isinstance(target, int | float):
            parts.append(f"set to {target:g}°")
    position = attributes.get("current_position")
    if kind == "cover" and isinstance(position, int | float):
        parts.append(f"{position:g} % open")
    percentage = attributes.get("percentage")
    if kind == "fan" and value == "on" and isinstance(percentage, int | float):
        parts.append(f"speed {percentage:g} %")
    title = attributes.get("media_title")
    if kind == "media_player" and isinstance(title, str) and title:
        parts.append(f"playing “{trim(title, 60)}”")
    return ", ".join(parts)


def _render_list(
    states: list[dict[str, Any]], kind: str | None, asked: str | None, place: _Area | None
) -> str:
    what = f"{kind} entities" if kind else "entities"
    if place is not None and place.name is None:
        if not states:
            one = f"{kind} entity" if kind else "entity"
            return f"Home Assistant has no area “{asked}”, and no {one}'s name mentions it."
        where = f" whose name mentions “{asked}” (Home Assistant has no area “{asked}”)"
    else:
        where = f" in the area “{place.name}”" if place is not None else ""
    if not states:
        return f"Home Assistant has no {what}{where}."
    ordered = sorted(states, key=lambda s: s["entity_id"])
    lines = [f"Home Assistant {what}{where}: {len(ordered)}"]
    lines += [f"- {_label(s)}: {_brief(s)}" for s in ordered[:MAX_LISTED]]
    if len(ordered) > MAX_LISTED:
        lines.append(f"… and {len(ordered) - MAX_LISTED} more; ask again with a domain or an area")
    return "\n".join(lines)


def _render_state(state: dict[str, Any]) -> str:
    attributes = state["attributes"]
    lines = [f"{_label(state)} is {_brief(state)}."]
    changed = state.get("last_changed")
    if isinstance(changed, str):
        lines.append(f"Last changed: {changed}")
    shown = [(k, v) for k, v in attributes.items() if k != "friendly_name"]
    if shown:
        lines.append("Attributes:")
        for key, value in shown[:MAX_ATTRIBUTES]:
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            lines.append(f"- {trim(str(key), 60)}: {trim(text, ATTRIBUTE_CHARS)}")
        if len(shown) > MAX_ATTRIBUTES:
            lines.append(f"… and {len(shown) - MAX_ATTRIBUTES} more attributes")
    return "\n".join(lines)
