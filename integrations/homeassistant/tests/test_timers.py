"""Timers that ring in Bernard, heard in Home Assistant: the key's event stream is followed,
and resumed after a drop from the last event it delivered."""

from __future__ import annotations

import asyncio
import json

import pytest
from homeassistant.core import Event, HomeAssistant, callback
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.bernard import client, timers
from custom_components.bernard.const import DOMAIN, EVENT_TIMER_FIRED
from custom_components.bernard.timers import timer_sentence

from .conftest import HOLD, KEY, ScriptedBernard

pytestmark = pytest.mark.usefixtures("home")
DEVICE = "5b2d1f0c9e8a4c7b9f6d3e2a1b0c9d8e"


def fired(entry_id: str, timer_id: str, label: str) -> str:
    data = {"timer_id": timer_id, "label": label, "conversation_id": f"ha-device-{DEVICE}"}
    return f"event: timer_fired\ndata: {json.dumps(data)}\nid: {entry_id}\n\n"


async def test_a_dropped_event_stream_resumes_after_the_last_timer_heard(
    hass: HomeAssistant, bernard: ScriptedBernard
) -> None:
    bernard.event_streams = [
        [": ping\n\n", fired("1700000000000-0:0", "timer_1", "tea")],  # then it drops
        [fired("1700000000001-0:0", "timer_2", "eggs")],
    ]
    heard: list[Event] = []
    both = asyncio.Event()

    @callback
    def hear(event: Event) -> None:
        heard.append(event)
        if len(heard) == 2:
            both.set()

    hass.bus.async_listen(EVENT_TIMER_FIRED, hear)
    entry = MockConfigEntry(domain=DOMAIN, data={"url": bernard.url, "api_key": KEY})
    entry.add_to_hass(hass)
    assert await hass.config_entries.async_setup(entry.entry_id)

    async with asyncio.timeout(10):  # the reconnection waits a second first
        await both.wait()

    assert [e.data for e in heard] == [
        {
            "timer_id": "timer_1",
            "label": "tea",
            "conversation_id": f"ha-device-{DEVICE}",
            "device_id": DEVICE,
            "message": "Your tea timer is done.",
        },
        {
            "timer_id": "timer_2",
            "label": "eggs",
            "conversation_id": f"ha-device-{DEVICE}",
            "device_id": DEVICE,
            "message": "Your eggs timer is done.",
        },
    ]
    assert bernard.event_requests[:2] == ["", "1700000000000-0:0"]
    assert await hass.config_entries.async_unload(entry.entry_id)


async def test_an_event_stream_held_open_is_opened_again_after_events_s_from_its_last_event(
    hass: HomeAssistant,
    bernard: ScriptedBernard,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A connection that never ends (nothing more sent, or a line that never ends) is
    given up after EVENTS_S and opened again at once, from its last event, quietly."""
    monkeypatch.setattr(client, "EVENTS_S", 0.5)
    monkeypatch.setattr(timers, "EVENTS_S", 0.5)
    bernard.event_streams = [
        [fired("1700000000000-0:0", "timer_1", "tea"), HOLD],
        ["data: " + "x" * 1000, HOLD],  # a line that never ends
        [fired("1700000000001-0:0", "timer_2", "eggs"), HOLD],
    ]
    heard: list[Event] = []
    both = asyncio.Event()

    @callback
    def hear(event: Event) -> None:
        heard.append(event)
        if len(heard) == 2:
            both.set()

    hass.bus.async_listen(EVENT_TIMER_FIRED, hear)
    entry = MockConfigEntry(domain=DOMAIN, data={"url": bernard.url, "api_key": KEY})
    entry.add_to_hass(hass)
    started = asyncio.get_running_loop().time()
    assert await hass.config_entries.async_setup(entry.entry_id)

    async with asyncio.timeout(5):  # two renewals of 0.5 s, no pause between
        await both.wait()

    assert asyncio.get_running_loop().time() - started < 3.0
    assert [e.data["timer_id"] for e in heard] == ["timer_1", "timer_2"]
    assert bernard.event_requests[:3] == ["", "1700000000000-0:0", "1700000000000-0:0"]
    assert "dropped" not in caplog.text
    assert await hass.config_entries.async_unload(entry.entry_id)


@pytest.mark.parametrize(
    ("label", "language", "sentence"),
    [
        ("pasta", "en", "Your pasta timer is done."),
        ("", "en-GB", "Your timer is done."),
        ("pâtes", "fr", "Votre minuteur pâtes est terminé."),
        ("", "de", "Dein Timer ist abgelaufen."),
        ("tea", None, "Your tea timer is done."),
    ],
)
def test_a_ringing_timer_is_said_in_the_configured_language(
    label: str, language: str | None, sentence: str
) -> None:
    assert timer_sentence(label, language) == sentence
