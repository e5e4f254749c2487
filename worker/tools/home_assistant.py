"""The Home Assistant tools: read what the house's entities are doing, and call a service on
one of them once the user has confirmed it.

They speak Home Assistant's REST API (https://developers.home-assistant.io/docs/api/rest/),
every request carrying `Authorization: Bearer <BERNARD_HA_TOKEN>`, a long-lived access token
made on the user's profile page in Home Assistant, to `BERNARD_HA_URL`:

- `ha_list_entities(domain?, area?)`: `GET /api/states` answers every entity's state object
  (`entity_id`, `state`, `attributes`, `last_changed`, ...). A state object has no area, so an
  area is resolved by rendering a template, `POST /api/template` with
  `{"template": "{{ area_entities(\"kitchen\") | tojson }}"}`: `area_entities` takes an
  area's name or id and also counts the entities placed there through their device. Home
  Assistant renders templates only for an administrator's token (another gets 401, which the
  tool explains). When Home Assistant has no area of that name, the tool lists the entities
  whose friendly name or id mention it instead, and says so.
- `ha_get_state(entity_id)`: `GET /api/states/<entity_id>` (404 when there is none).
- `ha_call_service(domain, service, entity_id, data?)`: `POST /api/services/<domain>/<service>`
  with `{"entity_id": ..., **data}`, answered with the states that changed. It changes the
  house, so it waits for the user's confirmation (worker/tools/confirmation.py) with a summary
  in plain words ("Turn on light.kitchen at 40 % brightness"). Only the domains of
  `BERNARD_HA_DOMAINS` can be called: the tool is built for them (`call_service_tool`), its
  schema lists them, so a call for another domain fails its schema and is never proposed,
  and the tool checks the domain again before it sends anything.

Requests go through the worker's shared HTTP client (worker/tools/runtime.py), each limited by
`BERNARD_TOOL_HTTP_TIMEOUT_S`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any, Literal

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool, ToolException, tool
from pydantic import BaseModel, Field, create_model

from shared.settings import Settings
from worker.tools.http import ServiceError, request_json, trim
from worker.tools.progress import get_reporter
from worker.tools.runtime import get_runtime

__all__ = [
    "MAX_ATTRIBUTES",
    "MAX_LISTED",
    "call_service_tool",
    "describe_call",
    "ha_get_state",
    "ha_list_entities",
    "home_assistant_tools",
]

SERVICE = "Home Assistant"
MAX_LISTED = 40  # entities in one list; the model narrows by domain or area for the rest
MAX_ATTRIBUTES = 25
ATTRIBUTE_CHARS = 200
MAX_AREA_CHARS = 100
MAX_DATA_CHARS = 2000
REFUSED = "; check BERNARD_HA_TOKEN (a long-lived access token from a Home Assistant profile)"
REFUSED_TEMPLATE = (
    "; listing by area renders a template, which Home Assistant allows only with an "
    "administrator's token: check BERNARD_HA_TOKEN, or list by domain instead"
)
# Home Assistant's own rule for ids (homeassistant/core.py `valid_entity_id`), in short.
_NAME = re.compile(r"[a-z0-9]+(?:_[a-z0-9]+)*")
_ENTITY_ID = re.compile(r"[a-z0-9]+(?:_[a-z0-9]+)*\.[a-z0-9]+(?:_[a-z0-9]+)*")
# An area name goes into a template, so only what area names are made of gets in.
_AREA = re.compile(r"[\w' .-]+")
# Keys that would widen the call beyond the confirmed entity.
_TARGETS = ("entity_id", "device_id", "area_id", "floor_id", "label_id")


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
        base, headers = _service(get_runtime(config).settings)
        in_area: set[str] | None = None
        if where is not None:
            reporter.step(f"Finding the entities in “{where}”")
            in_area = await _area_entities(config, base, headers, where)
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
        by_name = False
        if where is not None and in_area is not None:
            if in_area:
                found = [s for s in found if s["entity_id"] in in_area]
            else:  # no such area: the names may still say where a thing is
                by_name = True
                found = [s for s in found if _mentions(s, where)]
    reporter.complete(f"Found {len(found)} entit{'y' if len(found) == 1 else 'ies'}")
    return _render_list(found, kind, where, by_name)


@tool
async def ha_get_state(entity_id: str, config: RunnableConfig) -> str:
    """Get the current state and attributes of one Home Assistant entity, such as
    "light.kitchen" or "climate.hall" (ha_list_entities gives the ids)."""
    reporter = get_reporter(config)
    with reporter.reporting_errors():
        entity = _entity_id(entity_id)
        base, headers = _service(get_runtime(config).settings)
        reporter.step(f"Reading the state of {entity}")
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
            raise ToolException(
                f"Error: Home Assistant has no entity {entity}; call ha_list_entities for the ids"
            )
        (state,) = _states([data])
    reporter.complete(f"{entity} is {state['state']}")
    return _render_state(state)


# -- calling a service -----------------------------------------------------------------------


async def _call_service(
    domain: str,
    service: str,
    entity_id: str,
    config: RunnableConfig,
    data: dict[str, Any] | None = None,
) -> str:
    """Call a Home Assistant service on one entity."""
    reporter = get_reporter(config)
    with reporter.reporting_errors():
        settings = get_runtime(config).settings
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
        reporter.step(f"Calling {domain}.{service} for {entity}")
        try:
            changed = await request_json(
                config,
                "POST",
                f"{base}/api/services/{domain}/{service}",
                service=SERVICE,
                json={"entity_id": entity, **options},
                headers=headers,
                refused=REFUSED,
                reason_of=_reason,
            )
        except ServiceError as exc:
            if exc.status == 400 and not exc.reason:  # Home Assistant's plain "400: Bad Request"
                raise ToolException(
                    f"{exc}: {domain}.{service} may not exist, or its data is not valid for "
                    f"{entity}; check the entity with ha_get_state"
                ) from exc
            raise
        states = _states(changed)
    reporter.complete(f"Home Assistant ran {domain}.{service}")
    done = {"domain": domain, "service": service, "entity_id": entity, "data": options}
    lines = [f"Done: {describe_call(done)}."]
    mine = [s for s in states if s["entity_id"] == entity]
    if mine:
        lines.append(f"{entity} is now {_brief(mine[0])}.")
    else:
        lines.append(f"Home Assistant reported no change of {entity}'s state.")
    others = [s for s in states if s["entity_id"] != entity][:5]
    lines += [f"Also changed: {s['entity_id']} is now {_brief(s)}." for s in others]
    return "\n".join(lines)


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
            "set_temperature, open_cover, ...) on one entity. The user confirms the call "
            "before it runs."
        ),
        args_schema=schema,
        metadata={"requires_confirmation": True, "confirmation_summary": describe_call},
    )
    # The model reads the error text as the tool's result and can correct its call.
    call.handle_tool_error = True
    return call


def home_assistant_tools(settings: Settings) -> list[BaseTool]:
    """The Home Assistant tools for `settings`: the reads, and the call when any domain is
    allowed."""
    tools: list[BaseTool] = [ha_list_entities, ha_get_state]
    if settings.ha_domain_names():
        tools.append(call_service_tool(settings.ha_domain_names()))
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
    if domain == "script" and service == "turn_on":
        return f"Run {entity}"
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


def _service(settings: Settings) -> tuple[str, dict[str, str]]:
    """Home Assistant's base URL and the headers that authorize a request to it."""
    if not (settings.ha_url and settings.ha_token):
        raise ToolException(
            "Error: Home Assistant is not configured (BERNARD_HA_URL and BERNARD_HA_TOKEN)"
        )
    return settings.ha_url.rstrip("/"), {"Authorization": f"Bearer {settings.ha_token}"}


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


async def _area_entities(
    config: RunnableConfig, base: str, headers: dict[str, str], area: str
) -> set[str]:
    # `json.dumps` makes the name a quoted string literal, as Jinja reads one; `_area` has
    # already kept out anything but the characters of a name.
    template = f"{{{{ area_entities({json.dumps(area)}) | tojson }}}}"
    ids = await request_json(
        config,
        "POST",
        f"{base}/api/template",
        service=SERVICE,
        json={"template": template},
        headers=headers,
        refused=REFUSED_TEMPLATE,
        reason_of=_reason,
    )
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise ToolException(f"Error: {SERVICE} sent an unexpected response to a template")
    return set(ids)


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


def _brief(state: dict[str, Any]) -> str:
    """The state with the attributes a person asks about first."""
    value, attributes = state["state"], state["attributes"]
    kind = state["entity_id"].split(".", 1)[0]
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
    title = attributes.get("media_title")
    if kind == "media_player" and isinstance(title, str) and title:
        parts.append(f"playing “{trim(title, 60)}”")
    return ", ".join(parts)


def _render_list(
    states: list[dict[str, Any]], kind: str | None, area: str | None, by_name: bool
) -> str:
    what = f"{kind} entities" if kind else "entities"
    if by_name and area is not None:
        where = f" whose name mentions “{area}” (Home Assistant has no entities in such an area)"
    else:
        where = f" in the area “{area}”" if area is not None else ""
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
