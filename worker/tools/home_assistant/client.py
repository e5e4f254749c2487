"""Home Assistant's REST API as the tools read it: an entity's state, the states, the
services' descriptions and the templates that resolve areas, each answer checked for the
shape the tools read."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import ToolException

from worker.tools.home_assistant.checks import ENTITY_ID
from worker.tools.home_assistant.config import Endpoint, HomeAssistantSettings, endpoint
from worker.tools.http import ServiceError, request_json, trim
from worker.tools.runtime import get_runtime

SERVICE = "Home Assistant"


REFUSED = "; check BERNARD_HA_TOKEN (a long-lived access token from a Home Assistant profile)"


REFUSED_TEMPLATE = (
    "; listing by area renders a template, which Home Assistant allows only with an "
    "administrator's token: use an administrator's token in BERNARD_HA_TOKEN, or list by "
    "domain instead"
)


def entity_area_template(entity: str) -> str:
    """The template that gives an entity's area (its own, or its device's): its name and id,
    both null for an entity in no area (helpers/template.py `area_name`, `area_id`)."""
    name = json.dumps(entity)
    return f'{{{{ {{"name": area_name({name}), "id": area_id({name})}} | tojson }}}}'


async def area_of(config: RunnableConfig, entity: str) -> tuple[str, ...] | None:
    """The area an entity is in (its name and id), None for none; `ToolException` when Home
    Assistant cannot say (not an entity id, a token that may not render templates)."""
    if not ENTITY_ID.fullmatch(entity):
        raise ToolException(f"Error: {trim(entity, 70)!r} is not an entity id")
    ha = endpoint(get_runtime(config).tool_settings.of(HomeAssistantSettings))
    rendered = await render_template(config, ha, entity_area_template(entity))
    name = rendered.get("name") if isinstance(rendered, dict) else None
    area_id = rendered.get("id") if isinstance(rendered, dict) else None
    if not isinstance(rendered, dict) or not all(
        isinstance(v, str | None) for v in (name, area_id)
    ):
        raise ToolException(f"Error: {SERVICE} sent an unexpected response to a template")
    found = tuple(v for v in (name, area_id) if isinstance(v, str))
    return found or None


async def ha_request(
    config: RunnableConfig,
    ha: Endpoint,
    method: str,
    path: str,
    *,
    json: Any = None,
    refused: str = REFUSED,
    missing_ok: bool = False,
) -> Any:
    """`request_json` to `path` of the REST API of Home Assistant at `ha`, as every Home
    Assistant tool asks it: what a refusal should make the operator check (`refused`), and
    Home Assistant's own words in an error reply (`message_of`)."""
    return await request_json(
        config,
        method,
        ha.base + path,
        service=SERVICE,
        json=json,
        headers=ha.headers,
        refused=refused,
        missing_ok=missing_ok,
        reason_of=message_of,
    )


async def render_template(config: RunnableConfig, ha: Endpoint, template: str) -> Any:
    """What Home Assistant renders `template` to (`POST /api/template`), parsed as JSON."""
    return await ha_request(
        config,
        ha,
        "POST",
        "/api/template",
        json={"template": template},
        refused=REFUSED_TEMPLATE,
    )


@dataclass(frozen=True, slots=True)
class Area:
    """An area as Home Assistant resolved a name: its `name` (None: it has no such area) and
    the entities in it."""

    name: str | None
    entities: frozenset[str]


def area_template(area: str) -> str:
    """The template that resolves `area` (a name or an id) to its name and its entities.

    `area_name` answers for an area's id, `area_id` for its name (helpers/template.py in Home
    Assistant); neither answers for an area Home Assistant does not have, which tells it
    apart from an area with no entities. `json.dumps` makes the name a quoted string
    literal, as Jinja reads one; `checked_area` has already kept out anything but the characters of
    a name.
    """
    name = json.dumps(area)
    return (
        f'{{{{ {{"area": area_name({name}) or area_name(area_id({name}) or ""), '
        f'"entities": area_entities({name})}} | tojson }}}}'
    )


async def area_entities(config: RunnableConfig, ha: Endpoint, area: str) -> Area:
    rendered = await render_template(config, ha, area_template(area))
    name = rendered.get("area") if isinstance(rendered, dict) else None
    ids = rendered.get("entities") if isinstance(rendered, dict) else None
    if (
        not isinstance(ids, list)
        or not all(isinstance(i, str) for i in ids)
        or not isinstance(name, str | None)
    ):
        raise ToolException(f"Error: {SERVICE} sent an unexpected response to a template")
    return Area(name, frozenset(ids))


async def state_of(config: RunnableConfig, ha: Endpoint, entity: str) -> dict[str, Any] | None:
    """The entity's state object; None when Home Assistant has no such entity."""
    data = await ha_request(config, ha, "GET", f"/api/states/{entity}", missing_ok=True)
    if data is None:
        return None
    (state,) = state_objects([data])
    return state


async def service_description(
    config: RunnableConfig, ha: Endpoint, domain: str, service: str
) -> dict[str, Any] | None:
    """Home Assistant's description of the service (its fields and target), `{}` when it has
    no such service, None when it does not describe its services (an older or a pretend Home
    Assistant, or one whose descriptions do not fit the size limit): then the service and
    its options are left to Home Assistant, which refuses them with a plain 400."""
    try:
        listed = await ha_request(config, ha, "GET", "/api/services", missing_ok=True)
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


def state_objects(data: Any) -> list[dict[str, Any]]:
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


def message_of(body: Any) -> str | None:
    # Home Assistant explains a refusal as {"message": "..."}.
    message = body.get("message") if isinstance(body, dict) else None
    return trim(message, 300) if isinstance(message, str) else None
