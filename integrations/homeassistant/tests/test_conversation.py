"""The agent in Home Assistant's harness, against a scripted Bernard: what only a scripted
server can do to it (a connection broken mid-answer)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from homeassistant.components import conversation
from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers import entity_registry as er
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.bernard.const import DOMAIN

from .conftest import DROP, KEY, ScriptedBernard

pytestmark = pytest.mark.usefixtures("home")
MESSAGES = "/v1/conversations/home-assistant/messages"


def frame(event: str, data: dict[str, Any], entry_id: str) -> str:
    return f"event: {event}\ndata: {json.dumps(data)}\nid: {entry_id}\n\n"


async def _agent(hass: HomeAssistant, bernard: ScriptedBernard) -> tuple[MockConfigEntry, str]:
    entry = MockConfigEntry(domain=DOMAIN, data={"url": bernard.url, "api_key": KEY})
    entry.add_to_hass(hass)
    assert await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done()
    agent_id = er.async_get(hass).async_get_entity_id("conversation", DOMAIN, entry.entry_id)
    assert agent_id is not None
    return entry, agent_id


async def test_an_answer_broken_mid_stream_resumes_after_the_last_word_heard(
    hass: HomeAssistant, bernard: ScriptedBernard
) -> None:
    bernard.event_streams = [None]
    bernard.turns = {
        MESSAGES: [frame("text_delta", {"text": "Hello"}, "1-0:0"), DROP],
        "/v1/turns/turn_1/events": [
            frame("text_delta", {"text": " world."}, "2-0:0"),
            frame("done", {"turn_id": "turn_1", "status": "completed", "usage": {}}, "3-0:0"),
        ],
    }
    entry, agent_id = await _agent(hass, bernard)

    result = await conversation.async_converse(
        hass, "Say hello", None, Context(), language="en", agent_id=agent_id
    )

    assert result.response.speech["plain"]["speech"] == "Hello world."
    assert bernard.turn_requests == [
        ("POST", MESSAGES, ""),
        ("GET", "/v1/turns/turn_1/events", "1-0:0"),
    ]
    assert await hass.config_entries.async_unload(entry.entry_id)
