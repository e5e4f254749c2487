"""Fixtures for Bernard as Home Assistant's conversation agent, end to end.

One real Home Assistant 2025.4 per test module (tests/homeassistant/hass.py; skipped, with
the reason, where its Python 3.13 venv is not built). Each test then runs its own Bernard
(API and worker in the test's loop, on the scripted upstream, keys on, its Home Assistant
tools pointed at that same Home Assistant), adds the integration through Home Assistant's
config-flow API, and makes an Assist pipeline with Bernard as its agent; all are removed
when the test ends.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from tests.homeassistant.assist import Assist, Satellite, assist_on, entities_of
from tests.homeassistant.hass import (
    HomeAssistant,
    HomeAssistantApi,
    start_home_assistant,
    venv_problem,
)
from tests.support.upstream import ScriptedUpstream


@pytest.fixture(scope="module")
def home_assistant(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HomeAssistant]:
    problem = venv_problem()
    if problem is not None:
        pytest.skip(problem)
    home = start_home_assistant(tmp_path_factory.mktemp("home-assistant"))
    try:
        yield home
    finally:
        home.stop()


@pytest.fixture
async def ha(home_assistant: HomeAssistant) -> AsyncIterator[HomeAssistantApi]:
    api = HomeAssistantApi(home_assistant)
    try:
        yield api
    finally:
        await api.aclose()


@pytest.fixture
async def assist(
    ha: HomeAssistantApi, home_assistant: HomeAssistant, upstream: ScriptedUpstream
) -> AsyncIterator[Assist]:
    async with assist_on(ha, home_assistant, upstream) as running:
        yield running


@pytest.fixture
async def one_model_assist(
    ha: HomeAssistantApi, home_assistant: HomeAssistant, upstream: ScriptedUpstream
) -> AsyncIterator[Assist]:
    """`assist` with Bernard's two roles on one model: the router's text is the answer."""
    same = {"router_model": "one-model", "response_model": "one-model"}
    async with assist_on(ha, home_assistant, upstream, **same) as running:
        yield running


@pytest.fixture
async def satellites(ha: HomeAssistantApi) -> AsyncIterator[dict[str, Satellite]]:
    """Two test satellites, "Kitchen" and "Bedroom", each a device that can announce."""
    made: dict[str, Satellite] = {}
    try:
        for name in ("Kitchen", "Bedroom"):
            created = await ha.flow("test_satellite", {"name": name})
            assert created["type"] == "create_entry", created
            entry_id = created["result"]["entry_id"]
            entities = {e["entity_id"].split(".")[0]: e for e in await entities_of(ha, entry_id)}
            satellite = entities["assist_satellite"]
            made[name] = Satellite(
                name,
                entry_id,
                satellite["entity_id"],
                satellite["device_id"],
                entities["tts"]["entity_id"],
            )
        yield made
    finally:
        for satellite in made.values():
            await ha.remove_entry(satellite.entry_id)
