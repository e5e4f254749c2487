"""Adding Bernard through the config flow, and its options, in Home Assistant's harness.

The flow's check goes over real HTTP to a scripted Bernard on loopback (conftest.py)."""

from __future__ import annotations

import socket

import pytest
from aiohttp import web
from homeassistant import config_entries
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.bernard.const import DOMAIN, ConversationMode

from .conftest import KEY, ScriptedBernard

pytestmark = pytest.mark.usefixtures("home")


async def _submit(hass: HomeAssistant, url: str, key: str | None) -> dict:
    started = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_USER}
    )
    assert started["type"] is FlowResultType.FORM and started["step_id"] == "user"
    form = {"url": url} if key is None else {"url": url, "api_key": key}
    return await hass.config_entries.flow.async_configure(started["flow_id"], form)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_a_bernard_that_takes_the_key_becomes_an_entry(
    hass: HomeAssistant, bernard: ScriptedBernard
) -> None:
    result = await _submit(hass, bernard.url + "/", KEY)
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert result["title"] == "Bernard (127.0.0.1)"
    assert result["data"] == {"url": bernard.url, "api_key": KEY}
    assert bernard.seen == [f"Bearer {KEY}"]


async def test_a_refused_key_is_invalid_auth(hass: HomeAssistant, bernard: ScriptedBernard) -> None:
    result = await _submit(hass, bernard.url, "not-a-key")
    assert result["type"] is FlowResultType.FORM
    assert result["errors"] == {"base": "invalid_auth"}


async def test_no_key_for_a_bernard_with_keys_is_invalid_auth(
    hass: HomeAssistant, bernard: ScriptedBernard
) -> None:
    result = await _submit(hass, bernard.url, None)
    assert result["errors"] == {"base": "invalid_auth"}
    assert bernard.seen == [""], "no Authorization header without a key"


async def test_nothing_listening_is_cannot_connect(
    hass: HomeAssistant, socket_enabled: None
) -> None:
    result = await _submit(hass, f"http://127.0.0.1:{_closed_port()}", KEY)
    assert result["type"] is FlowResultType.FORM
    assert result["errors"] == {"base": "cannot_connect"}


async def test_a_server_that_is_not_bernard_is_cannot_connect(
    hass: HomeAssistant, bernard: ScriptedBernard
) -> None:
    bernard.models = lambda request: web.Response(text="<html>router login</html>")
    result = await _submit(hass, bernard.url, KEY)
    assert result["errors"] == {"base": "cannot_connect"}


async def test_a_bernard_that_fails_is_unknown(
    hass: HomeAssistant, bernard: ScriptedBernard
) -> None:
    bernard.models = lambda request: web.json_response(
        {"error": {"message": "boom", "code": "internal_error"}}, status=500
    )
    result = await _submit(hass, bernard.url, KEY)
    assert result["errors"] == {"base": "unknown"}


async def test_an_address_that_is_not_http_is_refused_before_any_request(
    hass: HomeAssistant, bernard: ScriptedBernard
) -> None:
    result = await _submit(hass, "ftp://127.0.0.1:21", KEY)
    assert result["errors"] == {"url": "invalid_url"}
    assert bernard.seen == []


async def test_the_same_bernard_twice_is_refused(
    hass: HomeAssistant, bernard: ScriptedBernard
) -> None:
    MockConfigEntry(domain=DOMAIN, data={"url": bernard.url, "api_key": KEY}).add_to_hass(hass)
    result = await _submit(hass, bernard.url + "/", KEY)
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "already_configured"


async def _entry(hass: HomeAssistant, bernard: ScriptedBernard) -> MockConfigEntry:
    entry = MockConfigEntry(domain=DOMAIN, data={"url": bernard.url, "api_key": KEY})
    entry.add_to_hass(hass)
    assert await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done()
    return entry


async def test_conversations_are_per_device_until_the_options_say_otherwise(
    hass: HomeAssistant, bernard: ScriptedBernard
) -> None:
    entry = await _entry(hass, bernard)
    household = entry.runtime_data.household
    assert (household.mode, household.shared) == (ConversationMode.PER_DEVICE, "home-assistant")

    form = await hass.config_entries.options.async_init(entry.entry_id)
    assert form["type"] is FlowResultType.FORM
    result = await hass.config_entries.options.async_configure(
        form["flow_id"],
        {"conversations": "shared", "shared_conversation": "house", "language": "fr"},
    )
    await hass.async_block_till_done()

    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert entry.options == {
        "conversations": "shared",
        "shared_conversation": "house",
        "language": "fr",
    }
    household = entry.runtime_data.household  # the entry was reloaded with them
    assert (household.mode, household.shared) == (ConversationMode.SHARED, "house")
    await hass.config_entries.async_unload(entry.entry_id)


async def test_a_shared_conversation_id_bernard_would_refuse_is_refused(
    hass: HomeAssistant, bernard: ScriptedBernard
) -> None:
    entry = await _entry(hass, bernard)
    form = await hass.config_entries.options.async_init(entry.entry_id)
    result = await hass.config_entries.options.async_configure(
        form["flow_id"], {"conversations": "shared", "shared_conversation": "the house"}
    )
    assert result["type"] is FlowResultType.FORM
    assert result["errors"] == {"shared_conversation": "invalid_conversation_id"}
    await hass.config_entries.async_unload(entry.entry_id)
