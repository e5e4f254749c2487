"""Bernard, a streaming agent backend, as a conversation agent of Home Assistant's Assist.

A config entry is one Bernard server (its URL and API key, config_flow.py). Setting it up
makes its conversation agent (conversation.py) and starts a background task that follows
the key's event stream and announces Bernard's timers on the satellite that set them
(timers.py); unloading the entry cancels the task.
"""

from __future__ import annotations

from homeassistant.const import CONF_API_KEY, CONF_URL, Platform
from homeassistant.core import HomeAssistant
from homeassistant.helpers.aiohttp_client import async_get_clientsession

from .client import BernardClient
from .const import (
    CONF_CONVERSATIONS,
    CONF_SHARED_CONVERSATION,
    DEFAULT_CONVERSATIONS,
    DEFAULT_SHARED_CONVERSATION,
    DOMAIN,
    ConversationMode,
)
from .routing import Household
from .runtime import BernardConfigEntry, BernardData
from .timers import follow_timers

PLATFORMS = [Platform.CONVERSATION]


async def async_setup_entry(hass: HomeAssistant, entry: BernardConfigEntry) -> bool:
    client = BernardClient(
        async_get_clientsession(hass), entry.data[CONF_URL], entry.data.get(CONF_API_KEY)
    )
    household = Household(
        mode=ConversationMode(entry.options.get(CONF_CONVERSATIONS, DEFAULT_CONVERSATIONS)),
        shared=entry.options.get(CONF_SHARED_CONVERSATION) or DEFAULT_SHARED_CONVERSATION,
    )
    entry.runtime_data = BernardData(client=client, household=household)
    await hass.config_entries.async_forward_entry_setups(entry, PLATFORMS)
    entry.async_create_background_task(
        hass, follow_timers(hass, entry), f"{DOMAIN} timers of {entry.title}"
    )
    entry.async_on_unload(entry.add_update_listener(_options_changed))
    return True


async def async_unload_entry(hass: HomeAssistant, entry: BernardConfigEntry) -> bool:
    return await hass.config_entries.async_unload_platforms(entry, PLATFORMS)


async def _options_changed(hass: HomeAssistant, entry: BernardConfigEntry) -> None:
    await hass.config_entries.async_reload(entry.entry_id)
