"""Bernard as Home Assistant's conversation agent: added through the config-flow API, the
agent of an Assist pipeline of its own, on a house the tests put back as it was."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from tests.homeassistant.hass import HomeAssistant, HomeAssistantApi
from tests.support.stack import Config, Stack, make_config
from tests.support.upstream import ScriptedUpstream

KEY = "household-key-0f3c9a"


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
