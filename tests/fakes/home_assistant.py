"""A fake Home Assistant that answers the REST API as Home Assistant 2025.4 does.

Every request needs `Authorization: Bearer <FakeHomeAssistant.token>`, or it is answered 401
as Home Assistant answers it. The house is a set of state objects (`states.json`;
`states-empty.json` in "empty" mode) that service calls change, its services are those of
`services.json` (Home Assistant's own descriptions of them) and its areas those of
`areas.json`. Fixture files hold `{"source": <where the shape comes from>, "body": <what is
sent>}`. Modes and holding: tests/fakes/searxng.py; two more modes here: "drop" (a service
call runs, then the connection breaks before the answer is complete) and "slow" (a service
call runs at once, its answer comes after `delay_s`), both as Home Assistant behaves when
the connection to it breaks or times out: the call is shielded and runs to its end.

What each answer reproduces, read from Home Assistant 2025.4.4's source (the
`homeassistant` wheel: homeassistant/...):

- 401 "401: Unauthorized" for a missing or bad token (helpers/http.py
  request_handler_factory raises aiohttp's HTTPUnauthorized) and, the same bytes, for a
  template rendered with a token that is not an administrator's (components/api/__init__.py
  APITemplateView is `@require_admin`; its `Unauthorized` becomes the same HTTPUnauthorized).
- `GET /api/states/<id>`: 404 `{"message": "Entity not found."}` for an unknown entity.
- `POST /api/template`: the rendered text as text/plain; 400 `{"message": "Error rendering
  template: ..."}` when it fails. The fake renders only the template the tools send, with
  area_name/area_id/area_entities as helpers/template.py has them.
- `GET /api/services`: `services.json`.
- `POST /api/services/<domain>/<service>` (APIDomainServicesView):
  - 400 "400: Bad Request" when the service does not exist (`has_service`, before anything
    runs) and when the data fails the service's schema (`vol.Invalid`: the entity service
    schemas of helpers/config_validation.py make_entity_service_schema refuse keys they do
    not know, a number that is not one, `vol.Coerce(float)`, which reads "40" as 40.0, and
    a brightness_pct or percentage outside 0 to 100);
  - 200 `[]` for an entity that does not exist, or is not of the service's domain (the
    domain's entity component has no such entity: helpers/service.py entity_service_call
    only logs "Referenced entities ... are missing or not currently available");
  - 500 "500 Internal Server Error\\n\\nServer got itself in trouble" (aiohttp's answer to
    an exception the view does not catch) for a `ServiceValidationError` or
    `ServiceNotSupported`: a temperature outside the thermostat's range
    (components/climate/__init__.py async_service_temperature_set, "temp_out_of_range"), a
    preset, fan or swing mode outside the entity's list (ClimateEntity._valid_mode_or_raise,
    FanEntity _valid_preset_mode_or_raise), an entity without a feature the service
    requires (entity_service_call, required_features); the reason goes only to Home
    Assistant's log;
  - an hvac_mode outside the entity's list is not refused: `_valid_mode_or_raise` only logs
    a warning for it in 2025.4 ("This will stop working in 2025.4 and raise an error
    instead"), and the entity takes it (a real generic thermostat asked for "cool" is set to
    cool and turns its heater on); one that is no `HVACMode` at all fails the schema, a 400;
  - otherwise 200 with the state objects that changed (the `state_changed` events of the
    call's context, in order): none when nothing changed, an entity written twice twice
    (the script's own service, `script.bedtime`, runs it to its end: the script on, what it
    changed, the script off; `script.turn_on` answers once it has started).
  `area_id` in the data targets the area's entities too, as Home Assistant's target fields
  do. Every call is kept in `service_calls`, whatever it answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.fakes.searxng import FakeService, Seen

# The one template the tools send (worker/tools/home_assistant/client.py `area_template`), the name
# a JSON string literal each time.
_AREA_TEMPLATE = re.compile(
    r'\{\{ \{"area": area_name\((?P<a>"(?:[^"\\]|\\.)*")\) or area_name\(area_id\((?P=a)\) or ""\),'
    r' "entities": area_entities\((?P=a)\)\} \| tojson \}\}'
)
_TARGETS = ("entity_id", "device_id", "area_id", "floor_id", "label_id")
BAD_REQUEST = "400: Bad Request"
SERVER_ERROR = "500 Internal Server Error\n\nServer got itself in trouble"
_FAILED = {
    "unauthorized": (401, "401: Unauthorized"),
    "forbidden": (403, "403: Forbidden"),
    "error": (500, SERVER_ERROR),
}
# The time the fake says a scene was activated at (Home Assistant writes utcnow().isoformat()).
ACTIVATED_AT = "2024-06-01T19:30:00.000000+00:00"
# The numbers the fake's services read, as their schemas coerce them (a string that is a
# number is one), with the range a schema holds them to (light's brightness_pct and fan's
# percentage, vol.Range(0, 100); a temperature's range is the entity's, a 500).
_SCHEMA_NUMBERS: dict[str, tuple[float, float] | None] = {
    "brightness_pct": (0, 100),
    "percentage": (0, 100),
    "temperature": None,
    "target_temp_low": None,
    "target_temp_high": None,
}
# homeassistant/components/climate/const.py HVACMode.
_HVAC_MODES = frozenset({"off", "heat", "cool", "heat_cool", "auto", "dry", "fan_only"})
# What the fake's scenes and scripts do to light.living_room: a light service and its data.
_EFFECTS: dict[str, tuple[str, dict[str, Any]]] = {
    "scene.movie_night": ("turn_on", {"brightness_pct": 20}),
    "script.bedtime": ("turn_off", {}),
}


@dataclass(frozen=True)
class ServiceCall:
    """One `POST /api/services/<domain>/<service>` the fake received, with its JSON body."""

    domain: str
    service: str
    body: Any


class Refused(Exception):
    """Home Assistant refuses the call: `status` 400 (before anything ran) or 500."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class ConnectionDropped(Exception):
    """Raised in "drop" mode once the answer has started: the server closes the connection."""


class FakeHomeAssistant(FakeService):
    folder = "home_assistant"
    token = "fake-ha-token"

    def __init__(self, mode: str = "ok", *, only: str | None = None, delay_s: float = 5.0) -> None:
        super().__init__(mode, only=only, delay_s=delay_s)
        self.service_calls: list[ServiceCall] = []
        self.templates: list[str] = []
        self.house: dict[str, dict[str, Any]] | None = None
        # False: `GET /api/services` is not there (as on launcher/demo_home.py's pretend home).
        self.services_listed = True

    def fixture(self, name: str) -> Any:
        document = super().fixture(name)
        assert document["source"], f"{name} says where its shape comes from"
        return document["body"]

    def routes(self) -> list[Route]:
        return [
            Route("/api/states", self.endpoint(self._states)),
            Route("/api/states/{entity_id}", self.endpoint(self._state)),
            Route("/api/template", self.endpoint(self._template), methods=["POST"]),
            Route("/api/services", self.endpoint(self._services)),
            Route(
                "/api/services/{domain}/{service}",
                self._authorized(self._service_call),
                methods=["POST"],
            ),
        ]

    def endpoint(
        self, reply: Callable[[Request, str], Any]
    ) -> Callable[[Request], Awaitable[Response]]:
        """The shared handler (modes, holding) behind Home Assistant's bearer token check; a
        POST's JSON body is read first, so `reply` finds it in `request.state.body`."""
        return self._authorized(super().endpoint(reply))

    def _authorized(
        self, handle: Callable[[Request], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        async def checked(request: Request) -> Response:
            if request.headers.get("authorization") != f"Bearer {self.token}":
                self.requests.append(Seen(request.url.path, dict(request.query_params)))
                return PlainTextResponse("401: Unauthorized", status_code=401)
            if request.method == "POST":
                request.state.body = json.loads(await request.body() or b"null")
            return await handle(request)

        return checked

    # -- the house ---------------------------------------------------------------------------

    def states(self, mode: str = "ok") -> dict[str, dict[str, Any]]:
        """The house's state objects by entity id, as service calls left them."""
        if mode == "empty":
            return {}
        if self.house is None:
            loaded = self.fixture("states.json")
            self.house = {s["entity_id"]: s for s in loaded}
        return self.house

    def _all(self, mode: str) -> list[dict[str, Any]]:
        return list(self.states(mode).values())

    def _states(self, request: Request, mode: str) -> Any:
        # Shape: https://developers.home-assistant.io/docs/api/rest (GET /api/states).
        return self._all(mode)

    def _state(self, request: Request, mode: str) -> Any:
        # Shape: the same page, GET /api/states/<entity_id>: one state object, 404 if none.
        wanted = request.path_params["entity_id"]
        for state in self._all(mode):
            if state["entity_id"] == wanted:
                return state
        return JSONResponse(self.fixture("not-found.json"), status_code=404)

    def _services(self, request: Request, mode: str) -> Any:
        if not self.services_listed:
            return PlainTextResponse("404: Not Found", status_code=404)
        return self.fixture("services.json")

    def _template(self, request: Request, mode: str) -> Any:
        # Shape: the same page, POST /api/template: the rendered text, sent as text/plain.
        template = str((request.state.body or {}).get("template", ""))
        self.templates.append(template)
        match = _AREA_TEMPLATE.fullmatch(template)
        if match is None:
            return JSONResponse(self.fixture("template-error.json"), status_code=400)
        area = self._area(json.loads(match["a"]))
        rendered = {"area": area and area["name"], "entities": area["entities"] if area else []}
        return PlainTextResponse(_tojson(rendered))

    def _area(self, lookup: str) -> dict[str, Any] | None:
        """The area with this id, or this name with case and spaces folded (as the area
        registry's async_get_area_by_name and area_name/area_id find it)."""
        folded = lookup.casefold().replace(" ", "")
        for area in self.fixture("areas.json"):
            if lookup == area["area_id"] or folded == area["name"].casefold().replace(" ", ""):
                return dict(area)
        return None

    # -- service calls -----------------------------------------------------------------------

    async def _service_call(self, request: Request) -> Response:
        domain, service = request.path_params["domain"], request.path_params["service"]
        body = request.state.body
        self.requests.append(Seen(request.url.path, dict(request.query_params)))
        self.service_calls.append(ServiceCall(domain, service, body))
        await self.held(request)
        mode = self.mode_for(request)
        if mode in _FAILED:
            status, text = _FAILED[mode]
            return PlainTextResponse(text, status_code=status)
        try:
            changed = self.call(domain, service, body if isinstance(body, dict) else {})
        except Refused as refused:
            text = BAD_REQUEST if refused.status == 400 else SERVER_ERROR
            return PlainTextResponse(text, status_code=refused.status)
        if mode == "slow":  # the call ran; the answer is late (the view shields the call)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), self.delay_s)
        if mode == "drop":  # the call ran; the connection breaks mid-answer
            return StreamingResponse(_broken(), media_type="application/json")
        return JSONResponse(changed)

    def call(self, domain: str, service: str, data: dict[str, Any]) -> list[dict[str, Any]]:
        """Run a service as Home Assistant runs it; the state objects it changed, or
        `Refused`."""
        description = self._description(domain, service)
        if description is None:
            raise Refused(400)  # has_service: no such service
        if domain == "script" and service not in ("turn_on", "turn_off", "toggle"):
            # A script's own service takes any data as its variables and runs it to its end.
            return self._run_script(f"script.{service}", to_its_end=True)
        fields = _field_names(description)
        if any(key not in fields and key not in _TARGETS for key in data):
            raise Refused(400)  # vol.Invalid: extra keys not allowed
        for key, bounds in _SCHEMA_NUMBERS.items():
            if key in data:
                try:
                    number = float(data[key])  # vol.Coerce(float): "40" is 40.0
                except (TypeError, ValueError):
                    raise Refused(400) from None
                if bounds is not None and not bounds[0] <= number <= bounds[1]:
                    raise Refused(400)  # vol.Range
        options = {k: v for k, v in data.items() if k not in _TARGETS}
        house = self.states()
        changed: list[dict[str, Any]] = []
        for entity_id in self._targets(data):
            state = house.get(entity_id)
            if state is None or not entity_id.startswith(f"{domain}."):
                continue  # "Referenced entities ... are missing": logged, skipped
            _required_features(description, state)
            if domain == "script":
                if service != "turn_off":  # the fake's scripts end at once: none to stop
                    changed += self._run_script(entity_id, to_its_end=False)
                continue
            new = _apply(domain, service, options, state)
            if new is not None:
                house[entity_id] = new
                changed.append(new)
                changed += self._effects(entity_id)
        return changed

    def _description(self, domain: str, service: str) -> dict[str, Any] | None:
        for entry in self.fixture("services.json"):
            if entry["domain"] == domain:
                found: dict[str, Any] | None = entry["services"].get(service)
                return found
        return None

    def _targets(self, data: dict[str, Any]) -> list[str]:
        ids = data.get("entity_id") or []
        targets = [ids] if isinstance(ids, str) else list(ids)
        areas = data.get("area_id") or []
        for area_id in [areas] if isinstance(areas, str) else areas:
            area = self._area(area_id)
            targets += area["entities"] if area else []
        return targets

    def _effects(self, entity_id: str) -> list[dict[str, Any]]:
        """What a scene or a script sets (the fake's movie night dims the living room to
        20 %, its bedtime script turns that light off); the states that changed."""
        effect = _EFFECTS.get(entity_id)
        if effect is None:
            return []
        house = self.states()
        light = _apply("light", *effect, house["light.living_room"])
        if light is None:
            return []
        house["light.living_room"] = light
        return [light]

    def _run_script(self, entity_id: str, *, to_its_end: bool) -> list[dict[str, Any]]:
        """A script's run, as Home Assistant answers it: `script.turn_on` answers once the
        run has started (ScriptEntity.async_turn_on waits for its first state change), the
        script's own service once it has ended, so its answer holds the script twice, on and
        then off. The fake's runs end at once."""
        house = self.states()
        script = house.get(entity_id)
        if script is None:
            return []
        running = copy.deepcopy(script)
        running["state"] = "on"
        running["attributes"] |= {"last_triggered": ACTIVATED_AT, "current": 1}
        running["last_changed"] = running["last_updated"] = running["last_reported"] = ACTIVATED_AT
        effects = self._effects(entity_id)
        ended = copy.deepcopy(running)
        ended["state"] = "off"
        ended["attributes"]["current"] = 0
        house[entity_id] = ended
        return [running, *effects, *([ended] if to_its_end else [])]


def _tojson(value: Any) -> str:
    """Jinja's own `tojson` filter, which Home Assistant's templates keep (jinja2/utils.py
    htmlsafe_json_dumps with its default policy, sort_keys): `json.dumps` with its spaces,
    keys sorted, and <, >, & and ' escaped."""
    text = json.dumps(value, sort_keys=True)
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("'", "\\u0027")):
        text = text.replace(char, escaped)
    return text


async def _broken() -> AsyncIterator[bytes]:
    raise ConnectionDropped("the fake drops the connection")
    yield b""  # pragma: no cover - makes this an async generator


def _field_names(description: dict[str, Any]) -> set[str]:
    """The data keys a service takes: its fields, those of its sections too."""
    names: set[str] = set()
    for name, spec in (description.get("fields") or {}).items():
        if isinstance(spec, dict) and isinstance(spec.get("fields"), dict):
            names |= set(spec["fields"])
        else:
            names.add(name)
    return names


def _required_features(description: dict[str, Any], state: dict[str, Any]) -> None:
    """`ServiceNotSupported` (a 500) when the entity lacks every feature set the service's
    target lists (entity_service_call's required_features)."""
    features = int(state["attributes"].get("supported_features") or 0)
    for target in (description.get("target") or {}).get("entity") or []:
        required = target.get("supported_features")
        if required and not any(features & f == f for f in required):
            raise Refused(500)


def _apply(
    domain: str, service: str, options: dict[str, Any], state: dict[str, Any]
) -> dict[str, Any] | None:
    """The entity's new state object, None when the call leaves it as it was."""
    new = copy.deepcopy(state)
    attributes = new["attributes"]
    value = new["state"]
    if domain in ("light", "switch", "fan") and service in ("turn_on", "turn_off", "toggle"):
        on = service == "turn_on" or (service == "toggle" and value == "off")
        new["state"] = "on" if on else "off"
        if domain == "light":
            if "brightness_pct" in options:
                attributes["brightness"] = round(float(options["brightness_pct"]) * 255 / 100)
            elif "brightness" in options:
                attributes["brightness"] = round(float(options["brightness"]))
            elif on and attributes.get("brightness") is None:
                attributes["brightness"] = 255
            if not on:
                attributes["brightness"] = None
            attributes["color_mode"] = attributes.get("color_mode") if on else None
        if domain == "fan" and "preset_mode" in options:
            _mode("preset_mode", "preset_modes", options, attributes)
    elif domain == "fan" and service == "set_preset_mode":
        _mode("preset_mode", "preset_modes", options, attributes)
        new["state"] = "on"
    elif domain == "fan" and service == "set_percentage":
        attributes["percentage"] = int(options["percentage"])
        new["state"] = "on" if attributes["percentage"] else "off"
    elif domain == "climate" and service == "set_temperature":
        _set_temperature(options, attributes)
        if "hvac_mode" in options:
            new["state"] = _hvac_mode(options)
    elif domain == "climate" and service == "set_hvac_mode":
        new["state"] = _hvac_mode(options)
    elif domain == "lock" and service in ("lock", "unlock"):
        new["state"] = "locked" if service == "lock" else "unlocked"
    elif domain == "scene" and service == "turn_on":
        new["state"] = ACTIVATED_AT
    if new == state:
        return None
    new["last_updated"] = new["last_reported"] = ACTIVATED_AT
    if new["state"] != state["state"]:
        new["last_changed"] = ACTIVATED_AT
    return new


def _mode(key: str, listed: str, options: dict[str, Any], attributes: dict[str, Any]) -> str:
    """The mode asked for, or `ServiceValidationError` (a 500) when the entity has no such
    mode ("not_valid_<kind>_mode")."""
    mode = str(options[key])
    if mode not in (attributes.get(listed) or []):
        raise Refused(500)
    attributes[key] = mode
    return mode


def _hvac_mode(options: dict[str, Any]) -> str:
    """The hvac_mode asked for, taken even when the entity does not list it (2025.4 only
    warns); a 400 when it is no `HVACMode` (the services' `vol.Coerce(HVACMode)`)."""
    mode = str(options["hvac_mode"])
    if mode not in _HVAC_MODES:
        raise Refused(400)
    return mode


def _set_temperature(options: dict[str, Any], attributes: dict[str, Any]) -> None:
    """async_service_temperature_set: the features first, then each value against the
    entity's range ("temp_out_of_range"), both `ServiceValidationError`s (a 500)."""
    features = int(attributes.get("supported_features") or 0)
    if "temperature" in options and not features & 1:
        raise Refused(500)  # missing_target_temperature_entity_feature
    if "target_temp_low" in options and not features & 2:
        raise Refused(500)  # missing_target_temperature_range_entity_feature
    low, high = attributes.get("min_temp", 7), attributes.get("max_temp", 35)
    for key in ("temperature", "target_temp_low", "target_temp_high"):
        if key in options:
            if not low <= float(options[key]) <= high:
                raise Refused(500)
            attributes[key] = float(options[key])
