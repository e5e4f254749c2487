"""Fixtures for the integration's tests in Home Assistant's test harness
(pytest-homeassistant-custom-component): a scripted Bernard on loopback that answers the
config flow's check, the event stream and turn streams as Bernard does, and custom
integrations turned on."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from homeassistant.core import HomeAssistant
from homeassistant.setup import async_setup_component

KEY = "bernard-test-key"
DROP = "DROP"
HOLD = "HOLD"


@pytest.fixture
async def home(hass: HomeAssistant, enable_custom_integrations: None) -> None:
    """Home Assistant with its core integration set up (the conversation integration needs
    it), loading custom_components/bernard."""
    assert await async_setup_component(hass, "homeassistant", {})


@dataclass
class ScriptedBernard:
    """`GET /v1/models` as Bernard answers it (`BERNARD_API_KEYS` holding `KEY`): the model
    list for the key, Bernard's 401 envelope for any other; `models` replaces the answer.

    `GET /v1/events` sends, on its n-th connection, the frames of `event_streams[n]` (SSE
    text) and then ends that connection (`None` there: holds it open; a `HOLD` frame: holds
    it open there); `event_requests` keeps each connection's `Last-Event-ID` ("" without
    one).

    A turn's stream (`POST .../messages`, `POST .../resume`, `GET /v1/turns/{id}/events`)
    sends the frames `turns` holds for its path, as turn `turn_1` (a list of frame lists
    for a path: one list per request, in order); a `DROP` frame breaks the connection there.
    `turn_requests` keeps (method, path, Last-Event-ID) of each, `posted` each POST's
    (body, Accept-Language).
    """

    url: str = ""
    models: Callable[[web.Request], web.Response] | None = None
    seen: list[str] = field(default_factory=list)
    event_streams: list[list[str] | None] = field(default_factory=list)
    event_requests: list[str] = field(default_factory=list)
    turns: dict[str, list[str] | list[list[str]]] = field(default_factory=dict)
    turn_requests: list[tuple[str, str, str]] = field(default_factory=list)
    posted: list[tuple[dict[str, Any], str]] = field(default_factory=list)

    async def turn(self, request: web.Request) -> web.StreamResponse:
        last_id = request.headers.get("Last-Event-ID", "")
        self.turn_requests.append((request.method, request.path, last_id))
        if request.method == "POST":
            self.posted.append((await request.json(), request.headers.get("Accept-Language", "")))
        scripted = self.turns.get(request.path)
        if not scripted:
            return web.json_response({"error": {"message": "no such turn"}}, status=404)
        frames = scripted.pop(0) if isinstance(scripted[0], list) else scripted
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "X-Bernard-Turn-Id": "turn_1"}
        )
        await response.prepare(request)
        for frame in frames:
            if frame == DROP:
                assert request.transport is not None
                request.transport.close()
                break
            await response.write(frame.encode())
        return response

    async def events(self, request: web.Request) -> web.StreamResponse:
        self.event_requests.append(request.headers.get("Last-Event-ID", ""))
        n = len(self.event_requests) - 1
        frames = self.event_streams[n] if n < len(self.event_streams) else None
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if frames is None:
            await asyncio.Event().wait()  # held until the client goes away
        for frame in frames or []:
            if frame == HOLD:
                await asyncio.Event().wait()
            await response.write(frame.encode())
        return response

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append(request.headers.get("Authorization", ""))
        if self.models is not None:
            return self.models(request)
        if request.headers.get("Authorization") != f"Bearer {KEY}":
            error = {
                "message": "invalid API key",
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_api_key",
            }
            return web.json_response({"error": error}, status=401)
        model = {"id": "bernard-v1", "object": "model", "created": 0, "owned_by": "bernard"}
        return web.json_response({"object": "list", "data": [model]})


@pytest.fixture
async def bernard(socket_enabled: None) -> AsyncIterator[ScriptedBernard]:
    """The scripted Bernard; sockets are open for the test (to loopback only, as Home
    Assistant's harness allows)."""
    scripted = ScriptedBernard()
    app = web.Application()
    app.router.add_get("/v1/models", scripted.handle)
    app.router.add_get("/v1/events", scripted.events)
    app.router.add_post("/v1/conversations/{id}/messages", scripted.turn)
    app.router.add_post("/v1/conversations/{id}/resume", scripted.turn)
    app.router.add_get("/v1/turns/{id}/events", scripted.turn)
    # Held streams end when their client goes away, as they do in Bernard.
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    scripted.url = f"http://127.0.0.1:{port}"
    yield scripted
    await runner.cleanup()
