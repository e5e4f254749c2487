"""The web tools (`web_search`, `wikipedia`, `weather`) and Home Assistant's read tools
(`ha_list_entities`, `ha_get_state`) against fake services on loopback.

Each tool talks real HTTP to a fake of its service (tests/fakes/), whose answers come from
fixtures in the real APIs' documented shapes. A tool is called directly through the
router's `execute` (its progress and its outcome, as the router sees them), and through the
whole pipeline: API, worker, scripted models, a streaming chat completion.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis.asyncio as redis_asyncio
from langchain_core.tools import BaseTool, ToolException

from launcher.redis_server import free_port
from shared.events import ToolProgress
from tests.fakes.home_assistant import FakeHomeAssistant
from tests.fakes.mediawiki import FakeMediaWiki
from tests.fakes.open_meteo import FakeOpenMeteo
from tests.fakes.searxng import FakeSearxng, FakeService, Seen
from tests.support.sse import Frame, collect, frames, text_of
from tests.support.stack import Config, make_config
from tests.support.upstream import Reply, ScriptedUpstream
from worker.calls import ToolOutcome
from worker.harness.tool_call import PlannedCall, arguments_text, execute
from worker.tools.home_assistant.reads import ha_get_state, ha_list_entities
from worker.tools.runtime import ToolRuntime, http_client
from worker.tools.search import web_search
from worker.tools.weather import weather
from worker.tools.wikipedia import EXTRACT_CHARS, wiki_base, wikipedia

CHAT = "/v1/chat/completions"

SEA_OTTERS = """\
Web results for “sea otters”:
1. Sea otter - Wikipedia
   https://en.wikipedia.org/wiki/Sea_otter
   The sea otter (Enhydra lutris) is a marine mammal native to the coasts of the northern \
and eastern North Pacific Ocean. Adult sea otters typically weigh between 14 and 45 kg (31 \
and 99 lb), making them the heaviest members of the weasel family, but among the smallest \
marine mammals. Unlike most…
2. Sea Otter | National Geographic
   https://www.nationalgeographic.com/animals/mammals/facts/sea-otter
   Sea otters are famous for floating on their backs and using rocks to crack open shellfish.
3. Sea Otter | Monterey Bay Aquarium
   https://www.montereybayaquarium.org/animals/animals-a-to-z/sea-otter
   Sea otters eat about a quarter of their body weight in food each day.
4. Sea Otter | NOAA Fisheries
   https://www.fisheries.noaa.gov/species/sea-otter
5. Sea Otter | Species | WWF
   https://www.worldwildlife.org/species/sea-otter
   Sea otters are a keystone species: they keep sea urchins from overgrazing kelp forests."""

ADA_LOVELACE = """\
Ada Lovelace

Augusta Ada King, Countess of Lovelace was an English mathematician and writer, chiefly \
known for her work on Charles Babbage's proposed mechanical general-purpose computer, the \
Analytical Engine. She was the first to recognise that the machine had applications beyond \
pure calculation.

URL: https://en.wikipedia.org/wiki/Ada_Lovelace"""

BERLIN_METRIC = """\
Weather for Berlin, Germany (Europe/Berlin)
Now (2024-06-01 14:15): 21.3°C, partly cloudy, wind 12.4 km/h, humidity 48%
Sat 2024-06-01: partly cloudy, 14.2°C to 23.1°C, precipitation 0 mm
Sun 2024-06-02: slight rain, 13.5°C to 19.8°C, precipitation 4.6 mm
Mon 2024-06-03: thunderstorm, 11.9°C to 17.2°C, precipitation 12.3 mm"""

BERLIN_IMPERIAL_WEEK = """\
Weather for Berlin, Germany (Europe/Berlin)
Now (2024-06-01 14:15): 70.3°F, partly cloudy, wind 7.7 mph, humidity 48%
Sat 2024-06-01: partly cloudy, 57.6°F to 73.6°F, precipitation 0 inch
Sun 2024-06-02: slight rain, 56.3°F to 67.6°F, precipitation 0.181 inch
Mon 2024-06-03: thunderstorm, 53.4°F to 63°F, precipitation 0.484 inch
Tue 2024-06-04: overcast, 51.4°F to 68.9°F, precipitation 0.008 inch
Wed 2024-06-05: clear sky, 54.7°F to 75.2°F, precipitation 0 inch
Thu 2024-06-06: mainly clear, 59.2°F to 79.3°F, precipitation n/a
Fri 2024-06-07: slight rain showers, 58.5°F to 73.2°F, precipitation 0.043 inch"""

SEARCH_STEPS = [
    ("step", "Searching the web for “sea otters”"),
    ("step", "Retrieved 6 results"),
    ("complete", "Formatting results"),
]
WIKI_STEPS = [
    ("step", "Searching Wikipedia for “Ada Lovelace”"),
    ("step", "Reading “Ada Lovelace”"),
    ("complete", "Read “Ada Lovelace”"),
]
HA_LIGHTS = """\
Home Assistant light entities: 2
- light.kitchen “Kitchen Light”: off
- light.living_room “Living Room Lights”: on, brightness 71 %"""

HA_LIVING_ROOM = """\
light.living_room “Living Room Lights” is on, brightness 71 %.
Last changed: 2024-06-01T18:40:02.551870+00:00
Attributes:
- supported_color_modes: ["brightness"]
- color_mode: brightness
- brightness: 180
- supported_features: 32"""

HA_LIST_STEPS = [
    ("step", "Asking Home Assistant for its light entities"),
    ("complete", "Found 2 entities"),
]
HA_STATE_STEPS = [
    ("step", "Reading the state of light.living_room"),
    ("complete", "light.living_room is on"),
]
WEATHER_STEPS = [
    ("step", "Locating “Berlin”"),
    ("step", "Fetching the forecast for Berlin, Germany"),
    ("complete", "Forecast for Berlin, Germany"),
]


@dataclass(frozen=True)
class Case:
    """A tool, the fake of its service, the settings pointing there and a happy call."""

    tool: BaseTool
    fake: type[FakeService]
    urls: tuple[str, ...]
    args: dict[str, Any]
    output: str
    steps: list[tuple[str, str]]
    service: str
    extra: dict[str, Any] = field(default_factory=dict)  # other settings the service needs


CASES = {
    "web_search": Case(
        web_search,
        FakeSearxng,
        ("searxng_url",),
        {"query": "sea otters"},
        SEA_OTTERS,
        SEARCH_STEPS,
        "the search service (SearXNG)",
    ),
    "wikipedia": Case(
        wikipedia,
        FakeMediaWiki,
        ("wikipedia_url",),
        {"query": "Ada Lovelace"},
        ADA_LOVELACE,
        WIKI_STEPS,
        "Wikipedia",
    ),
    "weather": Case(
        weather,
        FakeOpenMeteo,
        ("open_meteo_url", "open_meteo_geocoding_url"),
        {"location": "Berlin"},
        BERLIN_METRIC,
        WEATHER_STEPS,
        "the weather service (Open-Meteo)",
    ),
    "ha_list_entities": Case(
        ha_list_entities,
        FakeHomeAssistant,
        ("ha_url",),
        {"domain": "light"},
        HA_LIGHTS,
        HA_LIST_STEPS,
        "Home Assistant",
        {"ha_token": FakeHomeAssistant.token},
    ),
    "ha_get_state": Case(
        ha_get_state,
        FakeHomeAssistant,
        ("ha_url",),
        {"entity_id": "light.living_room"},
        HA_LIVING_ROOM,
        HA_STATE_STEPS,
        "Home Assistant",
        {"ha_token": FakeHomeAssistant.token},
    ),
}


def settings_for(
    case: Case, base_url: str, upstream: ScriptedUpstream | None = None, **overrides: Any
) -> Config:
    values = {**dict.fromkeys(case.urls, base_url), **case.extra, **overrides}
    return make_config(upstream, **values)


async def call(
    tool: BaseTool, args: dict[str, Any], config: Config, redis: redis_asyncio.Redis
) -> tuple[ToolOutcome, list[tuple[str, str]]]:
    """Run `tool` as the router does; its outcome and its progress as (phase, message)."""
    planned = PlannedCall(id="call_1", name=tool.name, args=args, arguments=arguments_text(args))
    async with http_client(config.settings) as http:
        runtime = ToolRuntime(
            owner="t", redis=redis, settings=config.settings, http=http, tool_settings=config.tools
        )
        running = execute(planned, {tool.name: tool}, timeout_s=10, runtime=runtime)
        progress = [item async for item in running]
    assert all(isinstance(p, ToolProgress) for p in progress)
    return running.result, [(p.phase, p.message) for p in progress]


@pytest.fixture
async def searxng() -> AsyncIterator[FakeSearxng]:
    async with FakeSearxng() as fake:
        yield fake


@pytest.fixture
async def mediawiki() -> AsyncIterator[FakeMediaWiki]:
    async with FakeMediaWiki() as fake:
        yield fake


@pytest.fixture
async def open_meteo() -> AsyncIterator[FakeOpenMeteo]:
    async with FakeOpenMeteo() as fake:
        yield fake


# -- every tool: success and each way its service can fail ----------------------------------


@pytest.mark.parametrize("name", list(CASES))
async def test_a_tool_returns_its_text_for_the_fixture_and_reports_its_steps(
    name: str, redis: redis_asyncio.Redis
) -> None:
    case = CASES[name]
    async with case.fake() as fake:
        outcome, progress = await call(
            case.tool, case.args, settings_for(case, fake.base_url), redis
        )
    assert (outcome.status, outcome.content) == ("success", case.output)
    assert progress == case.steps


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize(
    ("mode", "problem"),
    [
        ("slow", "{service} did not answer within 0.2s"),
        ("unauthorized", "{service} refused the request (HTTP 401)"),
        ("forbidden", "{service} refused the request (HTTP 403)"),
        ("error", "{service} failed (HTTP 500)"),
        ("malformed", "{service} sent a response that is not valid JSON"),
        ("wrong_shape", "{service} sent an unexpected"),
    ],
)
async def test_a_failing_service_is_an_error_result_the_model_reads(
    name: str, mode: str, problem: str, redis: redis_asyncio.Redis
) -> None:
    case = CASES[name]
    async with case.fake(mode, delay_s=5) as fake:
        settings = settings_for(case, fake.base_url, tool_http_timeout_s=0.2)
        outcome, progress = await call(case.tool, case.args, settings, redis)
    expected = "Error: " + problem.format(service=case.service)
    assert outcome.status == "error"
    assert outcome.content.startswith(expected), outcome.content
    assert outcome.failure is None  # the tool answered; the turn has nothing to report
    assert progress[0][0] == "step"
    assert progress[-1] == ("error", outcome.content.removeprefix("Error: "))


@pytest.mark.parametrize("name", list(CASES))
async def test_a_service_that_refuses_connections_is_an_error_result(
    name: str, redis: redis_asyncio.Redis
) -> None:
    case = CASES[name]
    settings = settings_for(case, f"http://127.0.0.1:{free_port()}")
    outcome, _ = await call(case.tool, case.args, settings, redis)
    assert outcome.status == "error"
    assert outcome.content.startswith(f"Error: could not reach {case.service}: ")


@pytest.mark.parametrize("name", list(CASES))
async def test_a_tool_whose_service_is_not_configured_says_so(
    name: str, redis: redis_asyncio.Redis
) -> None:
    case = CASES[name]
    outcome, _ = await call(case.tool, case.args, settings_for(case, ""), redis)
    assert outcome.status == "error"
    assert "not configured" in outcome.content


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("web_search", {"query": "  "}),
        ("web_search", {"query": "x" * 501}),
        ("wikipedia", {"query": ""}),
        ("wikipedia", {"query": "x" * 301}),
        ("weather", {"location": " \n"}),
        ("weather", {"location": "x" * 201}),
        ("ha_get_state", {"entity_id": " "}),
        ("ha_get_state", {"entity_id": "light." + "x" * 300}),
        ("ha_list_entities", {"area": "x" * 101}),
    ],
)
async def test_an_empty_or_huge_query_is_refused_before_any_request(
    name: str, args: dict[str, Any], redis: redis_asyncio.Redis
) -> None:
    case = CASES[name]
    async with case.fake() as fake:
        outcome, progress = await call(case.tool, args, settings_for(case, fake.base_url), redis)
    assert outcome.status == "error" and outcome.content.startswith("Error: the ")
    assert fake.requests == []
    assert [phase for phase, _ in progress] == ["error"]


# -- web_search -----------------------------------------------------------------------------


async def test_web_search_sends_the_query_to_searxngs_json_api(
    searxng: FakeSearxng, redis: redis_asyncio.Redis
) -> None:
    settings = make_config(searxng_url=searxng.base_url + "/")
    await call(web_search, {"query": "  sea\n otters "}, settings, redis)
    assert searxng.requests == [Seen("/search", {"q": "sea otters", "format": "json"})]


@pytest.mark.parametrize(("asked", "shown"), [(2, 2), (1, 1), (0, 1), (-3, 1), (10, 6), (50, 6)])
async def test_web_search_shows_at_most_max_results_between_1_and_10(
    asked: int, shown: int, searxng: FakeSearxng, redis: redis_asyncio.Redis
) -> None:
    settings = make_config(searxng_url=searxng.base_url)
    outcome, _ = await call(web_search, {"query": "otters", "max_results": asked}, settings, redis)
    numbered = [line for line in outcome.content.splitlines() if line[:1].isdigit()]
    assert [line.split(".")[0] for line in numbered] == [str(i) for i in range(1, shown + 1)]


async def test_web_search_with_no_results_says_so(
    searxng: FakeSearxng, redis: redis_asyncio.Redis
) -> None:
    searxng.mode = "empty"
    settings = make_config(searxng_url=searxng.base_url)
    outcome, progress = await call(web_search, {"query": "xqzzv plorbnik"}, settings, redis)
    assert (outcome.status, outcome.content) == ("success", "No results for “xqzzv plorbnik”.")
    assert progress[1:] == [("step", "Retrieved 0 results"), ("complete", "Formatting results")]


async def test_a_searxng_that_refuses_json_tells_the_model_why(
    searxng: FakeSearxng, redis: redis_asyncio.Redis
) -> None:
    searxng.mode = "forbidden"  # what SearXNG answers when `json` is not in search.formats
    outcome, _ = await call(
        web_search, {"query": "otters"}, make_config(searxng_url=searxng.base_url), redis
    )
    assert outcome.content == (
        "Error: the search service (SearXNG) refused the request (HTTP 403); "
        "the instance may require a login or not allow the JSON format"
    )


# -- wikipedia ------------------------------------------------------------------------------


async def test_wikipedia_searches_then_reads_the_best_match(
    mediawiki: FakeMediaWiki, redis: redis_asyncio.Redis
) -> None:
    await call(
        wikipedia, {"query": "Ada Lovelace"}, make_config(wikipedia_url=mediawiki.base_url), redis
    )
    search = {
        "action": "query",
        "list": "search",
        "srsearch": "Ada Lovelace",
        "format": "json",
        "srlimit": "5",
    }
    assert mediawiki.requests == [
        Seen("/w/api.php", search),
        Seen("/api/rest_v1/page/summary/Ada_Lovelace", {}),
    ]


async def test_wikipedia_skips_a_disambiguation_page_for_the_next_match(
    mediawiki: FakeMediaWiki, redis: redis_asyncio.Redis
) -> None:
    settings = make_config(wikipedia_url=mediawiki.base_url)
    outcome, progress = await call(wikipedia, {"query": "Mercury"}, settings, redis)
    title, extract, tail = outcome.content.split("\n\n")
    assert title == "Mercury (planet)"
    assert extract.startswith("Mercury is the first planet from the Sun and the smallest")
    assert extract.endswith("as it is at…") and len(extract) <= EXTRACT_CHARS
    assert "may refer to" not in outcome.content  # never the disambiguation page's text
    assert tail.splitlines() == [
        "URL: https://en.wikipedia.org/wiki/Mercury_(planet)",
        "Note: “Mercury” is a disambiguation page. Other matches: Mercury (element), "
        "Freddie Mercury, Mercury (mythology).",
    ]
    assert progress == [
        ("step", "Searching Wikipedia for “Mercury”"),
        ("step", "Reading “Mercury”"),
        ("step", "Reading “Mercury (planet)”"),
        ("complete", "Read “Mercury (planet)”"),
    ]
    assert [r.path for r in mediawiki.requests][1:] == [
        "/api/rest_v1/page/summary/Mercury",
        "/api/rest_v1/page/summary/Mercury_(planet)",
    ]


async def test_wikipedia_with_only_disambiguation_pages_asks_for_a_narrower_query(
    mediawiki: FakeMediaWiki, redis: redis_asyncio.Redis
) -> None:
    settings = make_config(wikipedia_url=mediawiki.base_url)
    outcome, _ = await call(wikipedia, {"query": "Columbus"}, settings, redis)
    assert (outcome.status, outcome.content) == (
        "success",
        "“Columbus” is ambiguous: Wikipedia lists several topics under Columbus, "
        "Columbus (disambiguation). Ask the user which one they mean, or call wikipedia again "
        "with a more specific query (add what kind of thing it is).",
    )
    assert "may refer to" not in outcome.content


async def test_wikipedia_skips_a_hit_whose_page_is_gone(
    mediawiki: FakeMediaWiki, redis: redis_asyncio.Redis
) -> None:
    settings = make_config(wikipedia_url=mediawiki.base_url)
    outcome, _ = await call(wikipedia, {"query": "Lovelace"}, settings, redis)
    assert (outcome.status, outcome.content) == ("success", ADA_LOVELACE)


@pytest.mark.parametrize(
    ("query", "mode", "answer"),
    [
        ("xqzzv", "ok", "Wikipedia has no article matching “xqzzv”."),
        ("Ada Lovelace", "empty", "Wikipedia has no article matching “Ada Lovelace”."),
        (
            "ada lovelase",
            "ok",
            "Wikipedia has no article matching “ada lovelase”. Did you mean “ada lovelace”?",
        ),
    ],
)
async def test_wikipedia_with_no_match_says_so(
    query: str, mode: str, answer: str, mediawiki: FakeMediaWiki, redis: redis_asyncio.Redis
) -> None:
    mediawiki.mode = mode
    settings = make_config(wikipedia_url=mediawiki.base_url)
    outcome, _ = await call(wikipedia, {"query": query}, settings, redis)
    assert (outcome.status, outcome.content) == ("success", answer)


@pytest.mark.parametrize(
    ("mode", "only", "error"),
    [
        ("api_error", None, "Error: Wikipedia rejected the search: text search is disabled."),
        ("error", "/api/rest_v1/", "Error: Wikipedia failed (HTTP 500)"),
        ("wrong_shape", "/api/rest_v1/", "Error: Wikipedia sent an unexpected page summary"),
    ],
)
async def test_wikipedia_reports_an_api_error_and_a_failing_summary(
    mode: str, only: str | None, error: str, mediawiki: FakeMediaWiki, redis: redis_asyncio.Redis
) -> None:
    mediawiki.mode, mediawiki.only = mode, only
    settings = make_config(wikipedia_url=mediawiki.base_url)
    outcome, _ = await call(wikipedia, {"query": "Ada Lovelace"}, settings, redis)
    assert (outcome.status, outcome.content) == ("error", error)


@pytest.mark.parametrize(
    ("configured", "lang", "base"),
    [
        ("https://en.wikipedia.org", None, "https://en.wikipedia.org"),
        ("https://en.wikipedia.org/", "de", "https://de.wikipedia.org"),
        ("https://en.wikipedia.org", " FR ", "https://fr.wikipedia.org"),
        ("https://de.wikipedia.org", "en", "https://en.wikipedia.org"),
        ("https://en.wikipedia.org", "als", "https://als.wikipedia.org"),
        ("http://wiki.home.lan/", "de", "http://wiki.home.lan"),  # self-hosted: one language
        ("https://wikipedia.example.org", "de", "https://wikipedia.example.org"),
    ],
)
def test_wiki_base_switches_language_only_on_public_wikipedia(
    configured: str, lang: str | None, base: str
) -> None:
    assert wiki_base(configured, lang) == base


@pytest.mark.parametrize("lang", ["english", "d", "d3", "de-ch", "../x", ""])
def test_wiki_base_refuses_what_is_not_a_language_code(lang: str) -> None:
    with pytest.raises(ToolException, match="2-3 letter language code"):
        wiki_base("https://en.wikipedia.org", lang)


async def test_wikipedia_on_a_self_hosted_wiki_ignores_lang_and_checks_it(
    mediawiki: FakeMediaWiki, redis: redis_asyncio.Redis
) -> None:
    settings = make_config(wikipedia_url=mediawiki.base_url)
    outcome, _ = await call(wikipedia, {"query": "Ada Lovelace", "lang": "de"}, settings, redis)
    assert outcome.content == ADA_LOVELACE
    bad, _ = await call(wikipedia, {"query": "Ada Lovelace", "lang": "german"}, settings, redis)
    assert (bad.status, bad.content) == (
        "error",
        "Error: lang must be a 2-3 letter language code like 'de', not 'german'",
    )


# -- weather --------------------------------------------------------------------------------


async def test_weather_geocodes_then_asks_for_the_forecast_there(
    open_meteo: FakeOpenMeteo, redis: redis_asyncio.Redis
) -> None:
    settings = CASES["weather"]
    await call(weather, {"location": "Berlin"}, settings_for(settings, open_meteo.base_url), redis)
    assert open_meteo.requests == [
        Seen("/v1/search", {"name": "Berlin", "count": "1", "language": "en", "format": "json"}),
        Seen(
            "/v1/forecast",
            {
                "latitude": "52.52437",
                "longitude": "13.41053",
                "current": "temperature_2m,weather_code,wind_speed_10m,relative_humidity_2m",
                "daily": "temperature_2m_max,temperature_2m_min,precipitation_sum,weather_code",
                "timezone": "auto",
                "forecast_days": "3",
            },
        ),
    ]


async def test_weather_in_imperial_units_asks_for_them_and_shows_them(
    open_meteo: FakeOpenMeteo, redis: redis_asyncio.Redis
) -> None:
    settings = settings_for(CASES["weather"], open_meteo.base_url)
    args = {"location": "Berlin", "days": 7, "units": "imperial"}
    outcome, _ = await call(weather, args, settings, redis)
    assert (outcome.status, outcome.content) == ("success", BERLIN_IMPERIAL_WEEK)
    forecast = open_meteo.requests[-1].params
    assert {
        k: forecast[k] for k in ("temperature_unit", "wind_speed_unit", "precipitation_unit")
    } == {
        "temperature_unit": "fahrenheit",
        "wind_speed_unit": "mph",
        "precipitation_unit": "inch",
    }
    assert forecast["forecast_days"] == "7"


@pytest.mark.parametrize(("days", "asked"), [(1, "1"), (0, "1"), (16, "16"), (40, "16")])
async def test_weather_asks_for_1_to_16_days(
    days: int, asked: str, open_meteo: FakeOpenMeteo, redis: redis_asyncio.Redis
) -> None:
    settings = settings_for(CASES["weather"], open_meteo.base_url)
    outcome, _ = await call(weather, {"location": "Berlin", "days": days}, settings, redis)
    assert open_meteo.requests[-1].params["forecast_days"] == asked
    day_lines = outcome.content.splitlines()[2:]
    assert len(day_lines) == min(int(asked), 7)  # the fixture holds a week


async def test_weather_names_the_place_with_its_region_and_country(
    open_meteo: FakeOpenMeteo, redis: redis_asyncio.Redis
) -> None:
    settings = settings_for(CASES["weather"], open_meteo.base_url)
    outcome, progress = await call(weather, {"location": "springfield"}, settings, redis)
    assert outcome.content.startswith("Weather for Springfield, Illinois, United States (")
    assert progress[1] == ("step", "Fetching the forecast for Springfield, Illinois, United States")


@pytest.mark.parametrize("mode", ["ok", "empty"])
async def test_weather_for_an_unknown_place_is_a_clear_error(
    mode: str, open_meteo: FakeOpenMeteo, redis: redis_asyncio.Redis
) -> None:
    open_meteo.mode = mode
    settings = settings_for(CASES["weather"], open_meteo.base_url)
    outcome, progress = await call(weather, {"location": "Atlantis"}, settings, redis)
    message = "no place called “Atlantis” was found; try the name of a nearby city"
    assert (outcome.status, outcome.content) == ("error", f"Error: {message}")
    assert progress == [("step", "Locating “Atlantis”"), ("error", message)]
    assert [r.path for r in open_meteo.requests] == ["/v1/search"]


@pytest.mark.parametrize(
    ("mode", "error"),
    [
        (
            "bad_request",
            "Error: the weather service (Open-Meteo) failed (HTTP 400): "
            "Latitude must be in range of -90 to 90°. Given: 152.52.",
        ),
        ("error", "Error: the weather service (Open-Meteo) failed (HTTP 500)"),
        (
            "wrong_shape",
            "Error: the weather service (Open-Meteo) sent an unexpected forecast response",
        ),
    ],
)
async def test_weather_reports_a_failing_forecast_after_a_good_geocoding(
    mode: str, error: str, open_meteo: FakeOpenMeteo, redis: redis_asyncio.Redis
) -> None:
    open_meteo.mode, open_meteo.only = mode, "/v1/forecast"
    settings = settings_for(CASES["weather"], open_meteo.base_url)
    outcome, progress = await call(weather, {"location": "Berlin"}, settings, redis)
    assert (outcome.status, outcome.content) == ("error", error)
    assert [phase for phase, _ in progress] == ["step", "step", "error"]


# -- through the pipeline -------------------------------------------------------------------


def chat_body(question: str, mode: str) -> dict[str, Any]:
    return {
        "model": "bernard-v1",
        "messages": [{"role": "user", "content": question}],
        "stream": True,
        "stream_options": {"include_usage": True, "tool_events": mode},
    }


def bernard_of(collected: Sequence[Frame], kind: str) -> list[dict[str, Any]]:
    return [f.bernard for f in collected if f.bernard and f.bernard["type"] == kind]


def delta_of(collected: Sequence[Frame], key: str) -> list[dict[str, Any]]:
    """The entries of `delta.<key>` (tool_calls or tool_outputs) across the stream."""
    return [
        entry
        for f in collected
        if not f.done and f.json.get("choices")
        for entry in f.json["choices"][0]["delta"].get(key) or []
    ]


@pytest.mark.parametrize("mode", ["bernard", "delta"])
@pytest.mark.parametrize("name", list(CASES))
async def test_a_turn_calls_the_tool_streams_its_progress_and_result_then_the_answer(
    name: str, mode: str, upstream: ScriptedUpstream
) -> None:
    case = CASES[name]
    upstream.script_router(Reply.tool_calls([(case.tool.name, case.args)]))
    upstream.script(Reply.text("Here is what I found."))
    async with (
        case.fake() as fake,
        settings_for(case, fake.base_url, upstream).stack(tools=[case.tool]) as stack,
    ):
        got = await collect(stack.client, "POST", CHAT, json=chat_body("look it up", mode))

    progress = bernard_of(got, "tool_progress")
    assert [(p["phase"], p["message"]) for p in progress] == case.steps
    if mode == "bernard":
        (called,) = bernard_of(got, "tool_call")
        (result,) = bernard_of(got, "tool_result")
        assert (called["name"], result["tool_call_id"]) == (case.tool.name, called["id"])
        assert (result["content"], result["truncated"]) == (case.output, False)
    else:
        (called,) = [c | c["function"] for c in delta_of(got, "tool_calls")]
        (result,) = delta_of(got, "tool_outputs")
        assert (called["name"], result["id"]) == (case.tool.name, called["id"])
        assert result["content"] == case.output
        assert not bernard_of(got, "tool_call") and not bernard_of(got, "tool_result")
    assert {p["tool_call_id"] for p in progress} == {called["id"]}
    assert text_of(got) == "Here is what I found."
    assert got[-1].done
    # The response model read the tool's whole output.
    tool_messages = [m for m in upstream.requests[-1]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == [case.output]


@pytest.mark.parametrize("name", list(CASES))
async def test_a_service_over_its_time_gives_an_error_result_and_the_turn_goes_on(
    name: str, upstream: ScriptedUpstream
) -> None:
    case = CASES[name]
    upstream.script_router(Reply.tool_calls([(case.tool.name, case.args)]))
    upstream.script(Reply.text("The service is slow right now."))
    async with case.fake("slow", delay_s=5) as fake:
        settings = settings_for(case, fake.base_url, upstream, tool_http_timeout_s=0.2)
        async with settings.stack(tools=[case.tool]) as stack:
            got = await collect(stack.client, "POST", CHAT, json=chat_body("look it up", "bernard"))
    (result,) = bernard_of(got, "tool_result")
    assert result["content"] == f"Error: {case.service} did not answer within 0.2s"
    assert bernard_of(got, "tool_progress")[-1]["phase"] == "error"
    assert text_of(got) == "The service is slow right now."
    finish = [
        f
        for f in got
        if not f.done and f.json.get("choices") and f.json["choices"][0]["finish_reason"]
    ]
    assert finish[0].json["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("mode", ["bernard", "delta"])
@pytest.mark.parametrize("name", list(CASES))
async def test_progress_reaches_the_client_while_the_service_has_not_answered(
    name: str, mode: str, upstream: ScriptedUpstream
) -> None:
    case = CASES[name]
    upstream.script_router(Reply.tool_calls([(case.tool.name, case.args)]))
    upstream.script(Reply.text("Done."))
    async with case.fake() as fake:
        fake.hold()
        async with (
            settings_for(case, fake.base_url, upstream).stack(tools=[case.tool]) as stack,
            stack.client.stream("POST", CHAT, json=chat_body("look it up", mode)) as response,
        ):
            stream = frames(response)
            seen: list[Frame] = []
            while not bernard_of(seen, "tool_progress"):
                seen.append(await anext(stream))
            # The client holds the first step while the service holds its answer.
            await fake.wait_held()
            assert bernard_of(seen, "tool_progress")[0]["message"] == case.steps[0][1]
            assert not bernard_of(seen, "tool_result") and not delta_of(seen, "tool_outputs")
            fake.release()
            rest = [frame async for frame in stream]
    outputs = bernard_of(rest, "tool_result") or delta_of(rest, "tool_outputs")
    assert [o["content"] for o in outputs] == [case.output]
    assert text_of(rest) == "Done."
