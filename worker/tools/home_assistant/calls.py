"""`ha_call_service`: a service call checked (`checked_call`), sent once, answered with the
states it changed; and what the policy reads of it (`call_subjects`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import httpx
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool, ToolException
from pydantic import BaseModel, Field, create_model

from shared.records.undo import Restore
from worker.tools.home_assistant.checks import (
    checked_data,
    checked_domain,
    checked_entity,
    checked_service,
    refusal,
)
from worker.tools.home_assistant.client import (
    area_of,
    ha_request,
    service_description,
    state_objects,
    state_of,
)
from worker.tools.home_assistant.config import HomeAssistantSettings, endpoint
from worker.tools.home_assistant.rendering import changes, describe_call
from worker.tools.home_assistant.restore import restore_or_none
from worker.tools.http import ServiceError
from worker.tools.policy import Subject
from worker.tools.progress import get_reporter
from worker.tools.runtime import get_runtime

MAY_HAVE_RUN = "; the call may have run all the same: check with ha_get_state before trying again"


# The errors of a request that was never sent: nothing can have run.
_UNSENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)


@dataclass(frozen=True, slots=True)
class Call:
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
    call = await checked_call(
        config,
        str(args.get("domain", "")),
        str(args.get("service", "")),
        str(args.get("entity_id", "")),
        args.get("data"),
    )
    return describe_call(call.args())


async def checked_call(
    config: RunnableConfig, domain: str, service: str, entity_id: str, data: Any
) -> Call:
    """The call once everything Home Assistant would refuse without saying why is ruled out;
    reads the entity's state and the service's description, changes nothing."""
    settings = get_runtime(config).tool_settings.of(HomeAssistantSettings)
    allowed = settings.ha_domain_names()
    domain, service = checked_domain(domain), checked_service(service)
    if domain not in allowed:
        raise ToolException(
            f"Error: Bernard may not call {domain} services; the domains it may call are "
            f"{', '.join(sorted(allowed)) or 'none'} (BERNARD_HA_DOMAINS)"
        )
    entity = checked_entity(entity_id)
    if entity.split(".", 1)[0] != domain:
        raise ToolException(
            f"Error: {entity} is not a {domain} entity; call {domain} services on "
            f"{domain}.* entities"
        )
    options = checked_data(data)
    ha = endpoint(settings)
    state = await state_of(config, ha, entity)
    if state is None:  # Home Assistant would answer `200 []` and do nothing
        raise ToolException(
            f"Error: Home Assistant has no entity {entity}, so {domain}.{service} would do "
            "nothing; call ha_list_entities for the ids"
        )
    description = await service_description(config, ha, domain, service)
    problem = refusal(domain, service, entity, options, state, description)
    if problem is not None:
        raise ToolException(f"Error: {problem}; nothing was sent to Home Assistant")
    return Call(domain, service, entity, options, state)


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
        call = await checked_call(config, domain, service, entity_id, data)
        # The state `checked_call` read, just before the call is sent, is what undo puts back.
        restore = restore_or_none(call.state)
        latest = await send(config, call)
    reporter.complete(f"Home Assistant ran {call.domain}.{call.service}")
    lines = [f"Done: {describe_call(call.args())}.", *changes(call.entity, latest)]
    return "\n".join(lines), restore


async def send(config: RunnableConfig, call: Call) -> dict[str, dict[str, Any]]:
    """Send a checked call; the states it changed, the last of each entity."""
    ha = endpoint(get_runtime(config).tool_settings.of(HomeAssistantSettings))
    what = f"{call.domain}.{call.service}"
    get_reporter(config).step(f"Calling {what} for {call.entity}")
    try:
        changed = await ha_request(
            config,
            ha,
            "POST",
            f"/api/services/{call.domain}/{call.service}",
            json={"entity_id": call.entity, **call.data},
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
    return {s["entity_id"]: s for s in state_objects(changed)}


async def call_subjects(args: dict[str, Any], config: RunnableConfig, areas: bool) -> list[Subject]:
    """What an `ha_call_service` call acts on: its domain, service, entity and options, and
    (when a rule names an area) the entity's area, read from Home Assistant."""
    data = args.get("data")
    return [
        await subject(
            config,
            str(args.get("domain", "")),
            str(args.get("service", "")),
            str(args.get("entity_id", "")),
            data if isinstance(data, dict) else {},
            areas,
        )
    ]


async def subject(
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
            area = await area_of(config, entity)
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
