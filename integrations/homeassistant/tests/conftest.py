"""Fixtures for the integration's tests in Home Assistant's test harness
(pytest-homeassistant-custom-component): a scripted Bernard on loopback that answers the
config flow's check as Bernard does, and custom integrations turned on."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from homeassistant.core import HomeAssistant
from homeassistant.setup import async_setup_component

KEY = "bernard-test-key"


@pytest.fixture
async def home(hass: HomeAssistant, enable_custom_integrations: None) -> None:
    """Home Assistant with its core integration set up (the conversation integration needs
    it), loading custom_components/bernard."""
    assert await async_setup_component(hass, "homeassistant", {})


@dataclass
class ScriptedBernard:
    """`GET /v1/models` as Bernard answers it (`BERNARD_API_KEYS` holding `KEY`): the model
    list for the key, Bernard's 401 envelope for any other; `models` replaces the answer."""

    url: str = ""
    models: Callable[[web.Request], web.Response] | None = None
    seen: list[str] = field(default_factory=list)

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
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    scripted.url = f"http://127.0.0.1:{port}"
    yield scripted
    await runner.cleanup()
