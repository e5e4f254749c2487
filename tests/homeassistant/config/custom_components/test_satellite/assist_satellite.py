"""The satellite: announcements are kept, in order, in the `announcements` attribute."""

from __future__ import annotations

from typing import Any

from homeassistant.components.assist_pipeline import PipelineEvent
from homeassistant.components.assist_satellite import (
    AssistSatelliteAnnouncement,
    AssistSatelliteConfiguration,
    AssistSatelliteEntity,
    AssistSatelliteEntityFeature,
)
from homeassistant.config_entries import ConfigEntry
from homeassistant.core import HomeAssistant, callback
from homeassistant.helpers.device_registry import DeviceInfo
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback

from .config_flow import DOMAIN


async def async_setup_entry(
    hass: HomeAssistant, entry: ConfigEntry, async_add_entities: AddConfigEntryEntitiesCallback
) -> None:
    async_add_entities([TestSatellite(entry)])


class TestSatellite(AssistSatelliteEntity):
    _attr_has_entity_name = True
    _attr_name = None
    _attr_supported_features = AssistSatelliteEntityFeature.ANNOUNCE

    def __init__(self, entry: ConfigEntry) -> None:
        self._attr_unique_id = entry.entry_id
        self._attr_device_info = DeviceInfo(
            identifiers={(DOMAIN, entry.entry_id)}, name=entry.title
        )
        self.announcements: list[str] = []

    @property
    def extra_state_attributes(self) -> dict[str, Any]:
        return {"announcements": self.announcements}

    @callback
    def async_get_configuration(self) -> AssistSatelliteConfiguration:
        return AssistSatelliteConfiguration(
            available_wake_words=[], active_wake_words=[], max_active_wake_words=1
        )

    async def async_set_configuration(self, config: AssistSatelliteConfiguration) -> None:
        """Nothing to configure."""

    @callback
    def on_pipeline_event(self, event: PipelineEvent) -> None:
        """Nothing to play: the tests run pipelines from text."""

    async def async_announce(self, announcement: AssistSatelliteAnnouncement) -> None:
        self.announcements.append(announcement.message)
