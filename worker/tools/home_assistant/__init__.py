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

The package, one concern a module:

- config.py: `HomeAssistantSettings`, and the URL and headers of every request;
- client.py: the REST requests and the shapes of their answers;
- checks.py: what the model sent, checked as Home Assistant's schemas would;
- rendering.py: what the model and the user read;
- reads.py: `ha_list_entities`, `ha_get_state`;
- calls.py: `ha_call_service`, and what the policy reads of a call;
- restore.py and undo.py: what puts an entity back, and the `undo` tool.
"""

from __future__ import annotations

from langchain_core.tools import BaseTool

from worker.tools.home_assistant.calls import call_service_tool
from worker.tools.home_assistant.config import HomeAssistantSettings
from worker.tools.home_assistant.reads import ha_get_state, ha_list_entities
from worker.tools.home_assistant.undo import undo_tool

__all__ = ["HomeAssistantSettings", "home_assistant_tools"]


def home_assistant_tools(settings: HomeAssistantSettings) -> list[BaseTool]:
    """The Home Assistant tools for `settings`: the reads, and the call when any domain is
    allowed."""
    tools: list[BaseTool] = [ha_list_entities, ha_get_state]
    if settings.ha_domain_names():
        tools += [call_service_tool(settings.ha_domain_names()), undo_tool()]
    return tools
