"""A fake Home Assistant: the REST API's states, template and service endpoints.

Every request needs `Authorization: Bearer <FakeHomeAssistant.token>`, or it is answered 401
as Home Assistant answers it. `GET /api/states` answers `states.json` (`states-empty.json` in
"empty" mode); `GET /api/states/<entity_id>` answers that entity's object from the same list,
or 404 with `not-found.json`. `POST /api/template` renders only the template the tools send,
`{{ area_entities("<area>") | tojson }}`: `template-area-<slug of area>.json`, `[]` for an
area it does not know (as Home Assistant does), 400 with `template-error.json` for any other
template. `POST /api/services/<domain>/<service>` answers `service-<domain>-<service>.json`,
or `[]` (nothing changed); every call it receives is kept in `service_calls`, whatever it
answers. Mode "bad_request" answers a service call 400, as Home Assistant answers an unknown
service or invalid data. Fixture files hold `{"source": <where the shape comes from>, "body":
<what is sent>}`. Modes and holding: tests/fakes/searxng.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tests.fakes.searxng import FakeService, Seen, slug

_AREA_TEMPLATE = re.compile(r'\{\{ area_entities\(("(?:[^"\\]|\\.)*")\) \| tojson \}\}')


@dataclass(frozen=True)
class ServiceCall:
    """One `POST /api/services/<domain>/<service>` the fake received, with its JSON body."""

    domain: str
    service: str
    body: Any


class FakeHomeAssistant(FakeService):
    folder = "home_assistant"
    token = "fake-ha-token"

    def __init__(self, mode: str = "ok", *, only: str | None = None, delay_s: float = 5.0) -> None:
        super().__init__(mode, only=only, delay_s=delay_s)
        self.service_calls: list[ServiceCall] = []
        self.templates: list[str] = []

    def fixture(self, name: str) -> Any:
        document = super().fixture(name)
        assert document["source"], f"{name} says where its shape comes from"
        return document["body"]

    def routes(self) -> list[Route]:
        return [
            Route("/api/states", self.endpoint(self._states)),
            Route("/api/states/{entity_id}", self.endpoint(self._state)),
            Route("/api/template", self.endpoint(self._template), methods=["POST"]),
            Route(
                "/api/services/{domain}/{service}",
                self.endpoint(self._service),
                methods=["POST"],
            ),
        ]

    def endpoint(
        self, reply: Callable[[Request, str], Any]
    ) -> Callable[[Request], Awaitable[Response]]:
        """The shared handler, behind Home Assistant's bearer token check; a POST's JSON body
        is read first (so `reply` finds it in `request.state.body`) and a service call kept."""
        handle = super().endpoint(reply)

        async def checked(request: Request) -> Response:
            if request.headers.get("authorization") != f"Bearer {self.token}":
                self.requests.append(Seen(request.url.path, dict(request.query_params)))
                return PlainTextResponse("401: Unauthorized", status_code=401)
            if request.method == "POST":
                request.state.body = json.loads(await request.body() or b"null")
                if "domain" in request.path_params:
                    self.service_calls.append(
                        ServiceCall(
                            request.path_params["domain"],
                            request.path_params["service"],
                            request.state.body,
                        )
                    )
            return await handle(request)

        return checked

    def _all(self, mode: str) -> list[dict[str, Any]]:
        states: list[dict[str, Any]] = self.fixture(
            "states-empty.json" if mode == "empty" else "states.json"
        )
        return states

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

    def _template(self, request: Request, mode: str) -> Any:
        # Shape: the same page, POST /api/template: the rendered text, sent as text/plain.
        template = str((request.state.body or {}).get("template", ""))
        self.templates.append(template)
        match = _AREA_TEMPLATE.fullmatch(template)
        if match is None:
            return JSONResponse(self.fixture("template-error.json"), status_code=400)
        name = f"template-area-{slug(json.loads(match[1]))}.json"
        ids = self.fixture(name) if self.has_fixture(name) else []
        return PlainTextResponse(json.dumps(ids))

    def _service(self, request: Request, mode: str) -> Any:
        # Shape: the same page, POST /api/services/<domain>/<service>: the changed states.
        if mode == "bad_request":
            return PlainTextResponse("400: Bad Request", status_code=400)
        domain, service = request.path_params["domain"], request.path_params["service"]
        name = f"service-{domain}-{service}.json"
        return self.fixture(name) if self.has_fixture(name) else []
