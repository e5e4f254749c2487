"""A voice satellite for the end-to-end tests (tests/homeassistant/): a device with an
`assist_satellite` entity that can announce, keeping what it was asked to say in its
`announcements` attribute, and a text-to-speech entity for the pipeline it announces with.

A real satellite (ESPHome, Wyoming) plays the announcement; this one keeps its sentence,
which is all a test can hear. Add one through the config flow with a `name`.
"""

from __future__ import annotations

from homeassistant.config_entries import ConfigEntry
from homeassistant.const import Platform
from homeassistant.core import HomeAssistant

PLATFORMS = [Platform.ASSIST_SATELLITE, Platform.TTS]


async def async_setup_entry(hass: HomeAssistant, entry: ConfigEntry) -> bool:
    await hass.config_entries.async_forward_entry_setups(entry, PLATFORMS)
    return True


async def async_unload_entry(hass: HomeAssistant, entry: ConfigEntry) -> bool:
    return await hass.config_entries.async_unload_platforms(entry, PLATFORMS)
