"""The reading tools: `ha_list_entities` (by domain or area) and `ha_get_state`."""

from __future__ import annotations

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import ToolException, tool

from worker.tools.home_assistant.checks import checked_area, checked_domain, checked_entity
from worker.tools.home_assistant.client import (
    Area,
    area_entities,
    ha_request,
    state_objects,
    state_of,
)
from worker.tools.home_assistant.config import HomeAssistantSettings, endpoint
from worker.tools.home_assistant.rendering import mentions, render_list, render_state
from worker.tools.progress import get_reporter
from worker.tools.runtime import get_runtime


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
        kind = checked_domain(domain) if domain is not None and domain.strip() else None
        where = checked_area(area) if area is not None and area.strip() else None
        ha = endpoint(get_runtime(config).tool_settings.of(HomeAssistantSettings))
        # The states first: a bad token fails here, so a 401 on the template that follows
        # can only mean the token is not an administrator's.
        reporter.step(f"Asking Home Assistant for its {f'{kind} ' if kind else ''}entities")
        states = state_objects(await ha_request(config, ha, "GET", "/api/states"))
        found = [s for s in states if kind is None or s["entity_id"].startswith(f"{kind}.")]
        place: Area | None = None
        if where is not None:
            reporter.step(f"Finding the entities in “{where}”")
            place = await area_entities(config, ha, where)
            if place.name is not None:
                found = [s for s in found if s["entity_id"] in place.entities]
            else:  # no such area: the names may still say where a thing is
                found = [s for s in found if mentions(s, where)]
    reporter.complete(f"Found {len(found)} entit{'y' if len(found) == 1 else 'ies'}")
    return render_list(found, kind, where, place)


@tool
async def ha_get_state(entity_id: str, config: RunnableConfig) -> str:
    """Get the current state and attributes of one Home Assistant entity, such as
    "light.kitchen" or "climate.hall" (ha_list_entities gives the ids)."""
    reporter = get_reporter(config)
    with reporter.reporting_errors():
        entity = checked_entity(entity_id)
        ha = endpoint(get_runtime(config).tool_settings.of(HomeAssistantSettings))
        reporter.step(f"Reading the state of {entity}")
        state = await state_of(config, ha, entity)
        if state is None:
            raise ToolException(
                f"Error: Home Assistant has no entity {entity}; call ha_list_entities for the ids"
            )
    reporter.complete(f"{entity} is {state['state']}")
    return render_state(state)


# The model reads the error text as the tool's result and can answer without it.
ha_list_entities.handle_tool_error = True
ha_get_state.handle_tool_error = True
