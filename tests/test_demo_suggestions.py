"""The playground's first-screen suggestions, each sent through the API to the offline demo
model with every tool's service there (fakes on loopback, and the demo home `./run` starts):
each must call its tool and answer with what the tool found.

The suggestions are read from the playground's own file (api/playground/app.js
`SUGGESTIONS`), so a new one is sent too, and fails until `ANSWERS` says what its answer
must hold.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from api.routes.playground import ROOT
from launcher.demo_home import demo_home_app
from tests.fakes.mediawiki import FakeMediaWiki
from tests.fakes.open_meteo import FakeOpenMeteo
from tests.fakes.plex import FakePlex
from tests.fakes.searxng import FakeSearxng
from tests.support.serving import serve
from tests.support.sse import named, of
from tests.support.stack import Stack, make_config
from tests.support.users import ALICE

# `["tool", "text"],` rows between `const SUGGESTIONS = [` and `];`, and the one shown when
# the server has none of those tools: `... : ["text"];`.
_TABLE = re.compile(r"^const SUGGESTIONS = \[\n(?P<rows>.*?)^\];", re.M | re.S)
_ROW = re.compile(r'^\s*\["(?P<tool>[a-z_]+)", "(?P<text>[^"\n]+)"\],$')
_FALLBACK = re.compile(r' : \["(?P<text>[^"\n]+)"\];$', re.M)


def suggestions() -> list[tuple[str | None, str]]:
    """The first screen's (tool, text) pairs as app.js lists them, and (None, the text it
    shows when the server has none of their tools)."""
    script = (ROOT / "app.js").read_text()
    table, fallback = _TABLE.search(script), _FALLBACK.findall(script)
    assert table is not None, "app.js has no SUGGESTIONS table"
    rows = [_ROW.match(line) for line in table["rows"].splitlines()]
    assert all(rows), f"a SUGGESTIONS row this test cannot read: {table['rows']!r}"
    assert len(fallback) == 1, f"not one suggestion without a tool: {fallback}"
    return [*((row["tool"], row["text"]) for row in rows if row is not None), (None, fallback[0])]


SUGGESTIONS = suggestions()

# What each suggestion's answer must say: what the tool found (in the fakes' fixtures and the
# demo home) and, for the time, the zone's name and offset, not the time (Japan keeps no
# summer time, so the offset never changes).
ANSWERS: dict[str, list[str]] = {
    "Turn on the kitchen lights": [
        "Done: Turn on light.kitchen_light. light.kitchen_light is now on, brightness 100 %."
    ],
    "What is playing on Plex right now?": ["Living Room TV: movie “The Matrix” (1999), playing"],
    "Will it rain in Paris tomorrow?": [
        "Weather for Paris, Île-de-France, France",
        "Sun 2024-06-02: slight rain, 13.5°C to 19.8°C, precipitation 4.6 mm",
    ],
    "Set a timer for 10 minutes for the pasta": ["Timer “pasta” set for 10 min"],
    "Remember that the spare key is under the blue pot": [
        "I will remember: the spare key is under the blue pot."
    ],
    "Who was Ada Lovelace?": ["was an English mathematician and writer"],
    # The fake SearXNG answers every query with the same results.
    "Search the web for this week's Debian news": [
        "Web results for “this week's Debian news”: 1. Sea otter - Wikipedia"
    ],
    "What is 17.5 % of 2,340?": ["The result of 17.5 * 2340 / 100 is 409.5."],
    "What time is it in Tokyo?": ["The time in Asia/Tokyo is ", "+09:00 (", ", Asia/Tokyo, JST)."],
    "Tell me a fun fact about otters": ["I can tell the time, do arithmetic and keep notes"],
}

HA_TOKEN = "demo-token"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack() -> AsyncIterator[Stack]:
    """One stack for the module on the demo model, every tool's service configured."""
    async with contextlib.AsyncExitStack() as running:
        home = await running.enter_async_context(serve(demo_home_app(HA_TOKEN)))
        meteo = await running.enter_async_context(FakeOpenMeteo())
        wiki = await running.enter_async_context(FakeMediaWiki())
        search = await running.enter_async_context(FakeSearxng())
        plex = await running.enter_async_context(FakePlex())
        config = make_config(
            None,
            openai_base_url=None,
            openai_api_key=None,
            api_keys=f"key-alice:alice-{uuid.uuid4().hex[:8]}",
            ha_url=f"http://127.0.0.1:{home}",
            ha_token=HA_TOKEN,
            open_meteo_url=meteo.base_url,
            open_meteo_geocoding_url=meteo.base_url,
            wikipedia_url=wiki.base_url,
            searxng_url=search.base_url,
            plex_url=plex.base_url,
            plex_token=FakePlex.token,
        )
        assert config.settings.demo_mode
        yield await running.enter_async_context(config.stack())


async def ask(stack: Stack, text: str) -> tuple[list[dict[str, Any]], str]:
    """`text` sent as the playground sends it, to a new conversation, and each call it waits
    on approved: the calls made and the answer."""
    made = await stack.client.post("/v1/conversations", json={}, headers=ALICE)
    assert made.status_code == 201, made.text
    url = f"/v1/conversations/{made.json()['id']}"
    events = await named(stack.client, f"{url}/messages", {"content": text}, ALICE)
    turns = [events]
    while waiting := of(turns[-1], "awaiting_confirmation"):
        decision = {"confirmation_id": waiting[0]["confirmation_id"], "decision": "approve"}
        turns.append(await named(stack.client, f"{url}/resume", decision, ALICE))
    calls = [call for turn in turns for call in of(turn, "tool_call")]
    answer = "".join(data["text"] for turn in turns for data in of(turn, "text_delta"))
    return calls, answer


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(("tool", "text"), SUGGESTIONS, ids=[text for _, text in SUGGESTIONS])
async def test_each_suggestion_calls_its_tool_and_answers_with_what_it_found(
    stack: Stack, tool: str | None, text: str
) -> None:
    calls, answer = await ask(stack, text)
    called = [call["name"] for call in calls]
    assert (tool in called) if tool else not called, f"{text!r} called {called}"
    assert text in ANSWERS, f"add to ANSWERS what the answer to {text!r} must say"
    missing = [fragment for fragment in ANSWERS[text] if fragment not in answer]
    assert not missing, f"{text!r} was answered {answer!r}"


def test_every_answer_is_for_a_suggestion() -> None:
    assert sorted(ANSWERS) == sorted(text for _, text in SUGGESTIONS)
