"""One satellite per entry, named by the flow's only field."""

from __future__ import annotations

from typing import Any

import voluptuous as vol
from homeassistant.config_entries import ConfigFlow, ConfigFlowResult

DOMAIN = "test_satellite"


class TestSatelliteFlow(ConfigFlow, domain=DOMAIN):
    VERSION = 1

    async def async_step_user(self, user_input: dict[str, Any] | None = None) -> ConfigFlowResult:
        if user_input is not None:
            return self.async_create_entry(title=user_input["name"], data={})
        return self.async_show_form(step_id="user", data_schema=vol.Schema({"name": str}))
