"""The agent in Home Assistant's harness, against a scripted Bernard: what only a scripted
server can do to it (a connection broken mid-answer), and what it sends (the answer to a
question, passed through as any utterance is)."""

from __future__ import annotations

import json
import time
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


async def test_an_answer_a_newer_utterance_interrupted_is_what_it_said_not_an_apology(
    hass: HomeAssistant, bernard: ScriptedBernard
) -> None:
    bernard.event_streams = [None]
    interrupted = {"code": "turn_interrupted", "message": "interrupted", "type": "cancelled"}
    bernard.turns = {
        MESSAGES: [
            frame("text_delta", {"text": "Once upon"}, "1-0:0"),
            frame(
                "done", {"turn_id": "turn_1", "status": "cancelled", "error": interrupted}, "2-0:0"
            ),
        ],
    }
    entry, agent_id = await _agent(hass, bernard)

    result = await conversation.async_converse(
        hass, "Tell me a story", None, Context(), language="en", agent_id=agent_id
    )

    assert result.response.speech["plain"]["speech"] == "Once upon"
    assert result.response.response_type.value == "action_done"
    assert await hass.config_entries.async_unload(entry.entry_id)


async def test_an_answer_with_a_line_past_the_bound_is_an_apology_at_once(
    hass: HomeAssistant, bernard: ScriptedBernard
) -> None:
    """An 8 MiB line (MAX_LINE_CHARS is 4 Mi characters) ends the answer as soon as it
    passes the bound, without holding Home Assistant's loop, and is not read again."""
    bernard.event_streams = [None]
    huge = frame("text_delta", {"text": "x" * 8 * 2**20}, "1-0:0")
    bernard.turns = {MESSAGES: [frame("text_delta", {"text": "Hello"}, "0-1:0"), huge]}
    entry, agent_id = await _agent(hass, bernard)

    started = time.perf_counter()
    result = await conversation.async_converse(
        hass, "Say hello", None, Context(), language="en", agent_id=agent_id
    )
    took_s = time.perf_counter() - started

    print(f"\nan 8 MiB line: the agent answered in {took_s * 1000:.0f} ms")
    assert result.response.speech["plain"]["speech"] == "Sorry, I can't reach Bernard right now."
    assert bernard.turn_requests == [("POST", MESSAGES, "")]
    assert took_s < 2.0
    assert await hass.config_entries.async_unload(entry.entry_id)


async def test_a_question_is_spoken_as_bernard_asked_it_and_the_answer_passed_through(
    hass: HomeAssistant, bernard: ScriptedBernard
) -> None:
    bernard.event_streams = [None]
    waiting = {"turn_id": "turn_1", "status": "awaiting_confirmation", "usage": {}}
    proposal = {"confirmation_id": "conf_1", "summary": "Unlock lock.front_door"}
    bernard.turns = {
        MESSAGES: [
            [
                frame("text_delta", {"text": "Unlock lock.front_door : je le fais ?"}, "1-0:0"),
                frame("awaiting_confirmation", proposal, "2-0:0"),
                frame("done", waiting, "3-0:0"),
            ],
            [
                frame("text_delta", {"text": "C'est ouvert."}, "4-0:0"),
                frame("done", {"turn_id": "turn_1", "status": "completed"}, "5-0:0"),
            ],
        ]
    }
    entry, agent_id = await _agent(hass, bernard)

    asked = await conversation.async_converse(
        hass, "Ouvre la porte", None, Context(), language="fr", agent_id=agent_id
    )
    answered = await conversation.async_converse(
        hass, "Oui", asked.conversation_id, Context(), language="fr", agent_id=agent_id
    )

    assert asked.response.speech["plain"]["speech"] == "Unlock lock.front_door : je le fais ?"
    assert asked.continue_conversation is True
    assert answered.response.speech["plain"]["speech"] == "C'est ouvert."
    assert answered.continue_conversation is False
    # Both utterances are messages of the same conversation, in the user's language.
    assert bernard.posted == [({"content": "Ouvre la porte"}, "fr"), ({"content": "Oui"}, "fr")]
    assert [path for _, path, _ in bernard.turn_requests] == [MESSAGES, MESSAGES]
    assert await hass.config_entries.async_unload(entry.entry_id)
