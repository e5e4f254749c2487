"""Adding Bernard in Home Assistant's UI: its URL and API key, checked against the server
before the entry is made; and the entry's options (conversations, language).

The check asks Bernard what it serves (client.py `check`): no answer is `cannot_connect`, a
refused key `invalid_auth`. The key may be left empty for a Bernard that runs without keys.
"""

from __future__ import annotations

from typing import Any

import voluptuous as vol
from homeassistant.config_entries import ConfigFlow, ConfigFlowResult, OptionsFlow
from homeassistant.const import CONF_API_KEY, CONF_URL
from homeassistant.core import callback
from homeassistant.helpers.aiohttp_client import async_get_clientsession
from homeassistant.helpers.selector import (
    LanguageSelector,
    SelectSelector,
    SelectSelectorConfig,
    SelectSelectorMode,
    TextSelector,
    TextSelectorConfig,
    TextSelectorType,
)
from yarl import URL

from .client import BernardClient, BernardError, CannotConnect, InvalidAuth
from .const import (
    CONF_CONVERSATIONS,
    CONF_LANGUAGE,
    CONF_SHARED_CONVERSATION,
    DEFAULT_CONVERSATIONS,
    DEFAULT_SHARED_CONVERSATION,
    DOMAIN,
    LOGGER,
    ConversationMode,
)
from .routing import CONVERSATION_ID
from .runtime import BernardConfigEntry

USER_SCHEMA = vol.Schema(
    {
        vol.Required(CONF_URL): TextSelector(TextSelectorConfig(type=TextSelectorType.URL)),
        vol.Optional(CONF_API_KEY): TextSelector(
            TextSelectorConfig(type=TextSelectorType.PASSWORD)
        ),
    }
)


def normalize_url(text: str) -> str | None:
    """`http(s)://host[:port][/path]` without a trailing slash, or None for anything else."""
    try:
        url = URL(text.strip())
    except ValueError:
        return None
    if url.scheme not in ("http", "https") or not url.host or url.query or url.fragment:
        return None
    return str(url).rstrip("/")


class BernardConfigFlow(ConfigFlow, domain=DOMAIN):
    VERSION = 1

    async def async_step_user(self, user_input: dict[str, Any] | None = None) -> ConfigFlowResult:
        errors: dict[str, str] = {}
        if user_input is not None:
            url = normalize_url(user_input[CONF_URL])
            key = (user_input.get(CONF_API_KEY) or "").strip()
            if url is None:
                errors[CONF_URL] = "invalid_url"
            else:
                self._async_abort_entries_match({CONF_URL: url})
                errors = await self._check(url, key)
                if not errors:
                    host = URL(url).host
                    return self.async_create_entry(
                        title=f"Bernard ({host})", data={CONF_URL: url, CONF_API_KEY: key}
                    )
        return self.async_show_form(
            step_id="user",
            data_schema=self.add_suggested_values_to_schema(USER_SCHEMA, user_input),
            errors=errors,
        )

    async def _check(self, url: str, key: str) -> dict[str, str]:
        client = BernardClient(async_get_clientsession(self.hass), url, key)
        try:
            await client.check()
        except InvalidAuth:
            return {"base": "invalid_auth"}
        except CannotConnect as err:
            LOGGER.info("No Bernard answered: %s", err.reason)
            return {"base": "cannot_connect"}
        except BernardError as err:
            LOGGER.warning("Bernard answered the check with an error: %s", err.reason)
            return {"base": "unknown"}
        return {}

    @staticmethod
    @callback
    def async_get_options_flow(config_entry: BernardConfigEntry) -> OptionsFlow:
        return BernardOptionsFlow()


class BernardOptionsFlow(OptionsFlow):
    async def async_step_init(self, user_input: dict[str, Any] | None = None) -> ConfigFlowResult:
        errors: dict[str, str] = {}
        if user_input is not None:
            shared = user_input.get(CONF_SHARED_CONVERSATION, DEFAULT_SHARED_CONVERSATION)
            if not CONVERSATION_ID.fullmatch(shared):
                errors[CONF_SHARED_CONVERSATION] = "invalid_conversation_id"
            else:
                return self.async_create_entry(data=user_input)
        schema = vol.Schema(
            {
                vol.Required(CONF_CONVERSATIONS, default=DEFAULT_CONVERSATIONS): SelectSelector(
                    SelectSelectorConfig(
                        options=[mode.value for mode in ConversationMode],
                        translation_key=CONF_CONVERSATIONS,
                        mode=SelectSelectorMode.LIST,
                    )
                ),
                vol.Required(
                    CONF_SHARED_CONVERSATION, default=DEFAULT_SHARED_CONVERSATION
                ): TextSelector(),
                vol.Optional(CONF_LANGUAGE): LanguageSelector(),
            }
        )
        return self.async_show_form(
            step_id="init",
            data_schema=self.add_suggested_values_to_schema(
                schema, user_input or dict(self.config_entry.options)
            ),
            errors=errors,
        )
