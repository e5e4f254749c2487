"""Fixtures for Bernard as Home Assistant's conversation agent, end to end.

One real Home Assistant 2025.4 per test module (tests/homeassistant/hass.py; skipped, with
the reason, where its Python 3.13 venv is not built). Each test then runs its own Bernard
(API and worker in the test's loop, on the scripted upstream, keys on, its Home Assistant
tools pointed at that same Home Assistant), adds the integration through Home Assistant's
config-flow API, and makes an Assist pipeline with Bernard as its agent; all are removed
when the test ends.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.conftest import Config, Stack, make_config
from tests.homeassistant.hass import (
    HomeAssistant,
    HomeAssistantApi,
    start_home_assistant,
    venv_problem,
)
from tests.upstream import ScriptedUpstream

KEY = "household-key-0f3c9a"


@pytest.fixture(scope="module")
def home_assistant(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HomeAssistant]:
    problem = venv_problem()
    if problem is not None:
        pytest.skip(problem)
    home = start_home_assistant(tmp_path_factory.mktemp("home-assistant"))
    try:
        yield home
    finally:
        home.stop()


@pytest.fixture
async def ha(home_assistant: HomeAssistant) -> AsyncIterator[HomeAssistantApi]:
    api = HomeAssistantApi(home_assistant)
    try:
        yield api
    finally:
        await api.aclose()


@dataclass
class Assist:
    """Bernard running, added to Home Assistant, the agent of the preferred pipeline."""

    stack: Stack
    upstream: ScriptedUpstream
    ha: HomeAssistantApi
    user: str
    entry_id: str
    agent_id: str
    pipeline_id: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {KEY}"}

    async def messages(self, conversation_id: str) -> list[dict[str, Any]]:
        """The rows Bernard stored in one of this household's conversations."""
        response = await self.stack.client.get(
            f"/v1/conversations/{conversation_id}/messages", headers=self.headers
        )
        assert response.status_code == 200, response.text
        return list(response.json()["data"])


async def entities_of(ha: HomeAssistantApi, entry_id: str) -> list[dict[str, Any]]:
    """The entity registry's entries of one config entry."""
    entries = await ha.command("config/entity_registry/list")
    return [e for e in entries if e["config_entry_id"] == entry_id]


def bernard_settings(
    upstream: ScriptedUpstream, home: HomeAssistant, user: str, **overrides: Any
) -> Config:
    return make_config(
        upstream,
        api_keys=f"{KEY}:{user}",
        ha_url=home.url,
        ha_token=home.token,
        ha_domains="light,fan,climate,lock",
        **overrides,
    )


async def reset_house(ha: HomeAssistantApi) -> None:
    """Every light and the fan off, the kitchen light's level full, the front door locked and
    the back door not, the thermostat off at 20°."""
    powers = ["kitchen_light", "hall_light", "ceiling_fan", "boiler", "back_door_locked"]
    await ha.call_service(
        "input_boolean", "turn_off", entity_id=[f"input_boolean.{p}" for p in powers]
    )
    await ha.call_service("input_boolean", "turn_on", entity_id="input_boolean.front_door_locked")
    await ha.call_service(
        "input_number", "set_value", entity_id="input_number.kitchen_light_level", value=255
    )
    await ha.call_service(
        "climate",
        "set_temperature",
        entity_id="climate.living_room",
        temperature=20,
        hvac_mode="off",
    )


@pytest.fixture
async def assist(
    ha: HomeAssistantApi, home_assistant: HomeAssistant, upstream: ScriptedUpstream
) -> AsyncIterator[Assist]:
    async with assist_on(ha, home_assistant, upstream) as running:
        yield running


@pytest.fixture
async def one_model_assist(
    ha: HomeAssistantApi, home_assistant: HomeAssistant, upstream: ScriptedUpstream
) -> AsyncIterator[Assist]:
    """`assist` with Bernard's two roles on one model: the router's text is the answer."""
    same = {"router_model": "one-model", "response_model": "one-model"}
    async with assist_on(ha, home_assistant, upstream, **same) as running:
        yield running


@contextlib.asynccontextmanager
async def assist_on(
    ha: HomeAssistantApi,
    home_assistant: HomeAssistant,
    upstream: ScriptedUpstream,
    **overrides: Any,
) -> AsyncIterator[Assist]:
    """Bernard, on these settings, as the conversation agent of Home Assistant's preferred
    pipeline."""
    await reset_house(ha)
    user = f"household-{uuid.uuid4().hex[:8]}"
    async with bernard_settings(upstream, home_assistant, user, **overrides).stack() as stack:
        created = await ha.flow("bernard", {"url": stack.base_url, "api_key": KEY})
        assert created["type"] == "create_entry", created
        entry_id = created["result"]["entry_id"]
        (agent,) = [e["entity_id"] for e in await entities_of(ha, entry_id)]
        listed = await ha.command("assist_pipeline/pipeline/list")
        pipeline = await ha.command(
            "assist_pipeline/pipeline/create",
            name=f"Bernard {user}",
            language="en",
            conversation_engine=agent,
            conversation_language="en",
            stt_engine=None,
            stt_language=None,
            tts_engine=None,
            tts_language=None,
            tts_voice=None,
            wake_word_entity=None,
            wake_word_id=None,
            prefer_local_intents=False,
        )
        await ha.command("assist_pipeline/pipeline/set_preferred", pipeline_id=pipeline["id"])
        try:
            yield Assist(stack, upstream, ha, user, entry_id, agent, pipeline["id"])
        finally:
            await ha.command(
                "assist_pipeline/pipeline/set_preferred",
                pipeline_id=listed["preferred_pipeline"],
            )
            await ha.command("assist_pipeline/pipeline/delete", pipeline_id=pipeline["id"])
            await ha.remove_entry(entry_id)


@dataclass
class Satellite:
    name: str
    entry_id: str
    entity_id: str
    device_id: str
    voice: str  # its text-to-speech entity


@pytest.fixture
async def satellites(ha: HomeAssistantApi) -> AsyncIterator[dict[str, Satellite]]:
    """Two test satellites, "Kitchen" and "Bedroom", each a device that can announce."""
    made: dict[str, Satellite] = {}
    try:
        for name in ("Kitchen", "Bedroom"):
            created = await ha.flow("test_satellite", {"name": name})
            assert created["type"] == "create_entry", created
            entry_id = created["result"]["entry_id"]
            entities = {e["entity_id"].split(".")[0]: e for e in await entities_of(ha, entry_id)}
            satellite = entities["assist_satellite"]
            made[name] = Satellite(
                name,
                entry_id,
                satellite["entity_id"],
                satellite["device_id"],
                entities["tts"]["entity_id"],
            )
        yield made
    finally:
        for satellite in made.values():
            await ha.remove_entry(satellite.entry_id)
