"""The demo home: a small pretend Home Assistant that `./run` starts beside the offline demo
model when no `BERNARD_HA_URL` is set, so a first run shows a tool that reports progress and
changes the house ("Turn on the kitchen light": the household policy lets a light run at
once), and "Undo that" putting it back.

It answers the part of Home Assistant's REST API that Bernard's tools use
(worker/tools/home_assistant/), in its shapes (https://developers.home-assistant.io/docs/
api/rest/): `GET /api/`, `GET /api/states`, `GET /api/states/<entity_id>`, `POST /api/template`
(only the area template the tools send: worker/tools/home_assistant/client.py `area_template`) and
`POST /api/services/<domain>/<service>` for the services of its lights, its fan and its
thermostat. Every request needs
`Authorization: Bearer <BERNARD_HA_TOKEN>` (the launcher makes one per run and gives the same
to the worker). State changes last as long as the process: a restart brings the house back
as it was.

    python -m launcher.demo_home --port 8124     # BERNARD_HA_TOKEN in the environment
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

__all__ = ["AREAS", "BadRequestError", "DemoHome", "demo_home_app", "main"]

TOKEN_ENV = "BERNARD_HA_TOKEN"

# area id -> (name, entity ids). The ids are made from the names, as Home Assistant makes
# them ("Kitchen Light" is light.kitchen_light), so a guess from the words misses them.
AREAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "kitchen": ("Kitchen", ("light.kitchen_light",)),
    "living_room": ("Living Room", ("light.living_room_lights",)),
    "bedroom": ("Bedroom", ("light.bedroom_lamp", "switch.bedroom_fan")),
    "hall": ("Hall", ("climate.hall_thermostat",)),
}
_LIGHTS = {
    "light.kitchen_light": ("Kitchen Light", None),
    "light.living_room_lights": ("Living Room Lights", 180),
    "light.bedroom_lamp": ("Bedroom Lamp", None),
}
_AREA_TEMPLATE = re.compile(
    r'\{\{ \{"area": area_name\((?P<a>"(?:[^"\\]|\\.)*")\) or area_name\(area_id\((?P=a)\) or ""\),'
    r' "entities": area_entities\((?P=a)\)\} \| tojson \}\}'
)
_ON_OFF = {"turn_on": "on", "turn_off": "off"}


class BadRequestError(Exception):
    """Home Assistant would refuse this call with a 400; `message` None for a bare one."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or "400: Bad Request")
        self.message = message


class DemoHome:
    """The house: its entities' state objects, changed by service calls."""

    def __init__(self) -> None:
        self.states: dict[str, dict[str, Any]] = {}
        for entity_id, (name, brightness) in _LIGHTS.items():
            on = brightness is not None
            self._set(
                entity_id,
                "on" if on else "off",
                {
                    "supported_color_modes": ["brightness"],
                    "color_mode": "brightness" if on else None,
                    "brightness": brightness,
                    "friendly_name": name,
                    "supported_features": 32,
                },
            )
        self._set("switch.bedroom_fan", "off", {"friendly_name": "Bedroom Fan"})
        self._set(
            "climate.hall_thermostat",
            "heat",
            {
                "hvac_modes": ["off", "heat"],
                "min_temp": 7,
                "max_temp": 35,
                "target_temp_step": 0.5,
                "current_temperature": 19.5,
                "temperature": 20,
                "hvac_action": "heating",
                "friendly_name": "Hall Thermostat",
                "supported_features": 385,
            },
        )

    def area(self, area: str) -> dict[str, Any]:
        """An area named by its id or its name (any case) as the area template renders it:
        its name (None when there is no such area) and its entities."""
        wanted = area.strip().casefold()
        for area_id, (name, entities) in AREAS.items():
            if wanted in (area_id, name.casefold()):
                return {"area": name, "entities": list(entities)}
        return {"area": None, "entities": []}

    def call(self, domain: str, service: str, data: dict[str, Any]) -> list[dict[str, Any]]:
        """Run a service; the state objects it changed. `BadRequestError` as Home Assistant
        answers 400 (an unknown service, or data the service refuses)."""
        handler = {
            "light": self._light,
            "switch": self._switch,
            "climate": self._climate,
        }.get(domain)
        if handler is None:
            raise BadRequestError()
        targets = data.get("entity_id")
        ids = [targets] if isinstance(targets, str) else targets
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise BadRequestError()
        options = {k: v for k, v in data.items() if k != "entity_id"}
        changed = []
        # An entity it does not have is skipped, as Home Assistant skips it (with a warning).
        for entity_id in ids:
            if entity_id.split(".", 1)[0] == domain and entity_id in self.states:
                before = self.states[entity_id]
                handler(entity_id, service, options)
                if self.states[entity_id] is not before:
                    changed.append(self.states[entity_id])
        return changed

    def _light(self, entity_id: str, service: str, options: dict[str, Any]) -> None:
        current = self.states[entity_id]
        service = _switched(current, service)
        brightness = current["attributes"]["brightness"] or 255
        if service == "turn_on" and "brightness_pct" in options:
            brightness = round(_number(options["brightness_pct"], 0, 100) * 255 / 100)
        elif service == "turn_on" and "brightness" in options:
            brightness = round(_number(options["brightness"], 0, 255))
        on = service == "turn_on" and brightness > 0  # brightness 0 turns a light off
        self._set(
            entity_id,
            "on" if on else "off",
            {
                **current["attributes"],
                "color_mode": "brightness" if on else None,
                "brightness": brightness if on else None,
            },
        )

    def _switch(self, entity_id: str, service: str, options: dict[str, Any]) -> None:
        current = self.states[entity_id]
        self._set(entity_id, _ON_OFF[_switched(current, service)], current["attributes"])

    def _climate(self, entity_id: str, service: str, options: dict[str, Any]) -> None:
        current = self.states[entity_id]
        attributes = dict(current["attributes"])
        mode = options.get("hvac_mode", current["state"])
        if mode not in attributes["hvac_modes"]:
            raise BadRequestError()
        if service == "set_temperature" and "temperature" in options:
            low, high = attributes["min_temp"], attributes["max_temp"]
            value = options["temperature"]
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise BadRequestError()
            if not low <= value <= high:
                raise BadRequestError(
                    f"Provided temperature {value} is not valid. Accepted range is {low} to {high}."
                )
            attributes["temperature"] = value
            state = mode
        elif service == "set_hvac_mode" and "hvac_mode" in options:
            state = mode
        elif service in _ON_OFF:
            state = "heat" if service == "turn_on" else "off"
        else:
            raise BadRequestError()
        attributes["hvac_action"] = "off" if state == "off" else "heating"
        self._set(entity_id, state, attributes)

    def _set(self, entity_id: str, state: str, attributes: dict[str, Any]) -> None:
        """A new state object (Home Assistant never changes one in place)."""
        now = datetime.now(UTC).isoformat()
        before = self.states.get(entity_id)
        if before is not None and (before["state"], before["attributes"]) == (state, attributes):
            return
        changed = before is None or before["state"] != state
        last_changed = now if before is None or changed else before["last_changed"]
        self.states[entity_id] = {
            "entity_id": entity_id,
            "state": state,
            "attributes": attributes,
            "last_changed": last_changed,
            "last_reported": now,
            "last_updated": now,
            "context": {
                "id": os.urandom(13).hex().upper()[:26],
                "parent_id": None,
                "user_id": None,
            },
        }


def _switched(current: dict[str, Any], service: str) -> str:
    """The `_ON_OFF` service that `service` is for an entity in state `current`: a toggle
    turns it off when on, else on; `BadRequestError` for any other service."""
    if service == "toggle":
        service = "turn_off" if current["state"] == "on" else "turn_on"
    if service not in _ON_OFF:
        raise BadRequestError()
    return service


def _number(value: Any, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise BadRequestError(
            f"Invalid value {value!r}: expected a number from {low:g} to {high:g}"
        )
    return float(value)


def demo_home_app(token: str, home: DemoHome | None = None) -> Starlette:
    """The demo home's HTTP API, accepting `Bearer <token>`."""
    house = home or DemoHome()

    def authorized(
        handler: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def checked(request: Request) -> Response:
            if request.headers.get("authorization") != f"Bearer {token}":
                return PlainTextResponse("401: Unauthorized", status_code=401)
            return await handler(request)

        return checked

    async def status(request: Request) -> Response:
        return JSONResponse({"message": "API running."})

    async def states(request: Request) -> Response:
        return JSONResponse(list(house.states.values()))

    async def state(request: Request) -> Response:
        found = house.states.get(request.path_params["entity_id"])
        if found is None:
            return JSONResponse({"message": "Entity not found."}, status_code=404)
        return JSONResponse(found)

    async def template(request: Request) -> Response:
        body = await _json(request)
        text = body.get("template") if isinstance(body, dict) else None
        match = _AREA_TEMPLATE.fullmatch(text) if isinstance(text, str) else None
        if match is None:
            return JSONResponse(
                {"message": "Error rendering template: the demo home renders only area_entities"},
                status_code=400,
            )
        return PlainTextResponse(json.dumps(house.area(json.loads(match["a"]))))

    async def service(request: Request) -> Response:
        body = await _json(request)
        if not isinstance(body, dict):
            return JSONResponse({"message": "Data should be valid JSON."}, status_code=400)
        try:
            changed = house.call(
                request.path_params["domain"], request.path_params["service"], body
            )
        except BadRequestError as exc:
            if exc.message is None:
                return PlainTextResponse(str(exc), status_code=400)
            return JSONResponse({"message": exc.message}, status_code=400)
        return JSONResponse(changed)

    return Starlette(
        routes=[
            Route("/api/", authorized(status)),
            Route("/api/states", authorized(states)),
            Route("/api/states/{entity_id}", authorized(state)),
            Route("/api/template", authorized(template), methods=["POST"]),
            Route("/api/services/{domain}/{service}", authorized(service), methods=["POST"]),
        ]
    )


async def _json(request: Request) -> Any:
    try:
        return json.loads(await request.body() or b"null")
    except ValueError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.demo_home", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    token = os.environ.get(TOKEN_ENV)
    if not token:
        parser.error(f"{TOKEN_ENV} must hold the token the demo home accepts")
    uvicorn.run(
        demo_home_app(token),
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        lifespan="off",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
