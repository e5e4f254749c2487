"""Bernard's timers ringing in the house: one background task per config entry follows the
key's event stream (`GET /v1/events`) and announces each `timer_fired` on the satellite
that set the timer.

The satellite is the device that last spoke in the timer's conversation (routing.py); its
`assist_satellite` entities that support announcements say it (`assist_satellite.announce`).
Every ring also fires `bernard_timer_fired` on Home Assistant's bus, with the device (if
known) and the sentence, for automations and for houses whose satellites cannot announce.

A dropped stream is resumed after a pause with `Last-Event-ID`, so a timer that rang
meanwhile is still announced, once; a refused key is retried slowly (it is logged once).
A connection is held `EVENTS_S` at most: at its end the stream is resumed at once, quietly.
"""

from __future__ import annotations

import asyncio
from typing import Final

from homeassistant.components.assist_satellite import AssistSatelliteEntityFeature
from homeassistant.const import ATTR_ENTITY_ID, ATTR_SUPPORTED_FEATURES
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers import entity_registry as er

from .client import BernardError, InvalidAuth, TimerFired
from .const import CONF_LANGUAGE, EVENT_TIMER_FIRED, EVENTS_S, LOGGER
from .languages import phrases_for
from .runtime import BernardConfigEntry

# Pauses before reconnecting after a drop (the last one repeats), and after a refused key.
RETRY_PAUSES_S: Final = (1.0, 2.0, 5.0, 15.0, 30.0)
REFUSED_PAUSE_S: Final = 300.0


async def follow_timers(hass: HomeAssistant, entry: BernardConfigEntry) -> None:
    """Announce the entry's timers until the entry is unloaded (which cancels this)."""
    client = entry.runtime_data.client
    last_id: str | None = None
    failures = 0

    def opened() -> None:
        nonlocal failures
        if failures:
            LOGGER.info("Bernard's event stream is back (%s)", client.url)
        failures = 0

    while True:
        started = asyncio.get_running_loop().time()
        try:
            async for event_id, event in client.user_events(last_id, on_open=opened):
                last_id = event_id
                if isinstance(event, TimerFired):
                    entry.async_create_background_task(
                        hass, announce(hass, entry, event), f"announce timer {event.timer_id}"
                    )
            reason = "the stream ended"
        except InvalidAuth as err:
            LOGGER.error("Bernard refused the key for its event stream: %s", err.reason)
            await asyncio.sleep(REFUSED_PAUSE_S)
            continue
        except BernardError as err:
            reason = err.reason
        if asyncio.get_running_loop().time() - started >= EVENTS_S:
            LOGGER.debug("Bernard's event stream was held %s s: opening it again", EVENTS_S)
            continue
        if failures == 0:
            LOGGER.warning("Bernard's event stream dropped, reconnecting: %s", reason)
        await asyncio.sleep(RETRY_PAUSES_S[min(failures, len(RETRY_PAUSES_S) - 1)])
        failures += 1


def timer_sentence(label: str, language: str | None) -> str:
    phrases = phrases_for(language)
    return phrases.timer_done.format(label=label) if label else phrases.timer_done_unlabelled


async def announce(hass: HomeAssistant, entry: BernardConfigEntry, event: TimerFired) -> None:
    device_id = entry.runtime_data.household.device_for(event.conversation_id)
    message = timer_sentence(event.label, entry.options.get(CONF_LANGUAGE) or hass.config.language)
    hass.bus.async_fire(
        EVENT_TIMER_FIRED,
        {
            "timer_id": event.timer_id,
            "label": event.label,
            "conversation_id": event.conversation_id,
            "device_id": device_id,
            "message": message,
        },
    )
    satellites = _announcers(hass, device_id)
    if not satellites:
        LOGGER.info(
            "Timer %s rang; no satellite that announces belongs to device %s",
            event.timer_id,
            device_id,
        )
        return
    for entity_id in satellites:
        try:
            await hass.services.async_call(
                "assist_satellite",
                "announce",
                {ATTR_ENTITY_ID: entity_id, "message": message},
                blocking=True,
            )
        except HomeAssistantError as err:
            LOGGER.warning("%s could not announce timer %s: %s", entity_id, event.timer_id, err)


def _announcers(hass: HomeAssistant, device_id: str | None) -> list[str]:
    """The device's satellite entities that can announce."""
    if device_id is None:
        return []
    found = []
    for entry in er.async_entries_for_device(er.async_get(hass), device_id):
        state = hass.states.get(entry.entity_id)
        features = state.attributes.get(ATTR_SUPPORTED_FEATURES, 0) if state else 0
        if entry.domain == "assist_satellite" and features & AssistSatelliteEntityFeature.ANNOUNCE:
            found.append(entry.entity_id)
    return found
