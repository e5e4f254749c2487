"""What a set-up config entry holds while Home Assistant runs (`entry.runtime_data`)."""

from __future__ import annotations

from dataclasses import dataclass

from homeassistant.config_entries import ConfigEntry

from .client import BernardClient
from .routing import Household


@dataclass
class BernardData:
    client: BernardClient
    household: Household


type BernardConfigEntry = ConfigEntry[BernardData]
