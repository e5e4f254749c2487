"""A voice for the satellite's pipeline: announcing needs one to make the sentence's URL.
Every sentence sounds the same: a quarter of a second of nothing."""

from __future__ import annotations

from typing import Any

from homeassistant.components.tts import TextToSpeechEntity, TtsAudioType
from homeassistant.config_entries import ConfigEntry
from homeassistant.core import HomeAssistant
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback

# Ten MPEG-1 layer III frames (128 kbit/s, 44.1 kHz: 417 bytes each) holding nothing: MP3,
# Home Assistant's default format, so it converts nothing (that would need ffmpeg).
SILENCE = (bytes.fromhex("fffb9000") + bytes(413)) * 10


async def async_setup_entry(
    hass: HomeAssistant, entry: ConfigEntry, async_add_entities: AddConfigEntryEntitiesCallback
) -> None:
    async_add_entities([TestVoice(entry)])


class TestVoice(TextToSpeechEntity):
    _attr_name = "Test voice"
    _attr_default_language = "en"

    def __init__(self, entry: ConfigEntry) -> None:
        self._attr_unique_id = f"{entry.entry_id}-voice"
        self._attr_supported_languages = ["en"]

    def get_tts_audio(self, message: str, language: str, options: dict[str, Any]) -> TtsAudioType:
        return "mp3", SILENCE
