"""The offline demo chat model: streaming, usage, call parameters, and its keyword routing."""

from __future__ import annotations

import json
import operator
import time
from collections.abc import Iterator, Sequence
from functools import reduce
from typing import Any

import pytest
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.tools import tool

from launcher.redis_server import free_port
from tests.fakes.open_meteo import FakeOpenMeteo
from tests.support.sse import Frame, collect, text_of
from tests.support.stack import Config, Stack, make_config
from worker.demo_model import (
    DEMO_NOTICE,
    DemoChatModel,
    _find_expression,
    _find_percentage,
    _find_timezone,
    _split_tokens,
)
from worker.tools import default_tools, delete_note, list_notes, save_note

NOTES_TOOLS = [save_note, list_notes, delete_note]


@tool
def get_time(timezone: str = "UTC") -> str:
    """The current time in an IANA time zone."""
    return "12:00"


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    return "42"


@tool
def respond() -> str:
    """Stop calling tools and answer the user."""
    return ""


ALL_TOOLS = [get_time, calculator, respond, *NOTES_TOOLS]


def calls(message: BaseMessage) -> list[tuple[str, dict[str, Any], str | None]]:
    assert isinstance(message, AIMessage)
    return [(c["name"], c["args"], c["id"]) for c in message.tool_calls]


async def test_streams_several_chunks_then_usage() -> None:
    model = DemoChatModel(token_delay_s=0)
    chunks = [c async for c in model.astream("What's up?")]

    texts = [c.content for c in chunks if c.content]
    assert len(texts) > 5
    total = reduce(operator.add, chunks)
    assert isinstance(total, AIMessageChunk)
    assert total.content == "".join(str(t) for t in texts)
    assert str(total.content).startswith('You said: "What\'s up?" ')
    assert str(total.content).endswith(DEMO_NOTICE)
    usage = total.usage_metadata
    assert usage is not None
    assert usage["output_tokens"] == len(texts)
    assert usage["input_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert total.response_metadata["finish_reason"] == "stop"


async def test_streaming_is_paced_by_token_delay() -> None:
    assert DemoChatModel().token_delay_s == pytest.approx(0.02)
    model = DemoChatModel(token_delay_s=0.01)
    stamps = [time.monotonic() async for _ in model.astream("hello")]
    assert stamps[-1] - stamps[0] >= 0.01 * (len(stamps) - 2)


def test_sync_stream_and_invoke_agree() -> None:
    model = DemoChatModel(token_delay_s=0)
    streamed = reduce(operator.add, model.stream("Tell me a joke"))
    invoked = model.invoke("Tell me a joke")
    assert invoked.content == streamed.content
    assert invoked.usage_metadata == streamed.usage_metadata
    assert model._llm_type == "bernard-demo"


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        ("What time is it?", [("get_time", {"timezone": "UTC"})]),
        ("What time is it in Europe/Paris?", [("get_time", {"timezone": "Europe/Paris"})]),
        ("What time is it in Tokyo?", [("get_time", {"timezone": "Asia/Tokyo"})]),
        ("what's the time in utc", [("get_time", {"timezone": "UTC"})]),
        ("What is (2 + 3) * 4?", [("calculator", {"expression": "(2 + 3) * 4"})]),
        ("compute 7*6 please", [("calculator", {"expression": "7*6"})]),
        ("What is 17.5 % of 2,340?", [("calculator", {"expression": "17.5 * 2340 / 100"})]),
        ("What is 50 % 7?", [("calculator", {"expression": "50 % 7"})]),
        (
            "What's the time in Asia/Tokyo, and 10 / 4?",
            [("get_time", {"timezone": "Asia/Tokyo"}), ("calculator", {"expression": "10 / 4"})],
        ),
        ("Tell me about otters", [("respond", {})]),
        ("What happened on 2024-01-05?", [("respond", {})]),
        (
            "Remember that the door code is 1234.",
            [("save_note", {"text": "the door code is 1234"})],
        ),
        ("please remember my bike is blue", [("save_note", {"text": "my bike is blue"})]),
        ("Forget about the door code!", [("delete_note", {"match": "the door code"})]),
        ("What did I ask you to remember?", [("list_notes", {})]),
        ("what do you remember", [("list_notes", {})]),
        ("Show me my notes", [("list_notes", {})]),
    ],
)
async def test_routes_the_question_to_a_tool(
    question: str, expected: list[tuple[str, dict[str, Any]]]
) -> None:
    message = await DemoChatModel().bind_tools(ALL_TOOLS).ainvoke(question)
    ids = [f"call_demo_{i + 1}" for i in range(len(expected))]
    assert calls(message) == [(n, a, i) for (n, a), i in zip(expected, ids, strict=True)]
    assert message.content == ""
    assert message.response_metadata["finish_reason"] == "tool_calls"


@tool
def web_search(query: str) -> str:
    """Search the web."""
    return ""


@tool
def wikipedia(query: str) -> str:
    """Look something up."""
    return ""


@tool
def weather(location: str) -> str:
    """The weather somewhere."""
    return ""


@tool
def ha_list_entities(domain: str | None = None, area: str | None = None) -> str:
    """List Home Assistant entities."""
    return ""


@tool
def ha_call_service(domain: str, service: str, entity_id: str, data: dict | None = None) -> str:
    """Call a Home Assistant service."""
    return ""


HOUSEHOLD_TOOLS = [
    *ALL_TOOLS,
    web_search,
    wikipedia,
    weather,
    ha_list_entities,
    ha_call_service,
    *default_tools()[5:],  # the timers
]


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        (
            "Set a timer for 5 minutes for the pasta",
            [("set_timer", {"duration": "300s", "label": "pasta"})],
        ),
        ("start a timer for 90 seconds", [("set_timer", {"duration": "90s", "label": "timer"})]),
        ("What timers are running?", [("list_timers", {})]),
        ("cancel timer_0a1b2c3d4e", [("cancel_timer", {"timer_id": "timer_0a1b2c3d4e"})]),
        # A command for the house first lists the entities of its kind: ids are never guessed.
        ("Turn on the kitchen light at 40%", [("ha_list_entities", {"domain": "light"})]),
        ("please turn off the living room lights", [("ha_list_entities", {"domain": "light"})]),
        (
            "turn off the fan",
            [("ha_list_entities", {"domain": "fan"}), ("ha_list_entities", {"domain": "switch"})],
        ),
        (
            "turn on the TV",
            [
                ("ha_list_entities", {"domain": "switch"}),
                ("ha_list_entities", {"domain": "light"}),
            ],
        ),
        ("Set the thermostat to 21 degrees", [("ha_list_entities", {"domain": "climate"})]),
        ("What's the weather in Lyon tomorrow?", [("weather", {"location": "Lyon"})]),
        ("Will it rain in Paris tomorrow?", [("weather", {"location": "Paris"})]),
        ("Is it snowing in Oslo?", [("weather", {"location": "Oslo"})]),
        ("weather please", [("weather", {"location": "Paris"})]),
        ("Search the web for otter facts", [("web_search", {"query": "otter facts"})]),
        ("Who was Ada Lovelace?", [("wikipedia", {"query": "Ada Lovelace"})]),
        ("Tell me about otters.", [("wikipedia", {"query": "otters"})]),
        ("What is 2 + 2?", [("calculator", {"expression": "2 + 2"})]),
        # Answered from the conversation, never looked up.
        ("What is my name?", [("respond", {})]),
        ("who am I", [("respond", {})]),
    ],
)
async def test_routes_household_questions_when_those_tools_are_offered(
    question: str, expected: list[tuple[str, dict[str, Any]]]
) -> None:
    message = await DemoChatModel().bind_tools(HOUSEHOLD_TOOLS).ainvoke(question)
    assert [(name, args) for name, args, _ in calls(message)] == expected


# What ha_list_entities answers for the demo home (launcher/demo_home.py), by domain.
LISTED = {
    "light": "Home Assistant light entities: 3\n"
    "- light.bedroom_lamp “Bedroom Lamp”: off\n"
    "- light.kitchen_light “Kitchen Light”: off\n"
    "- light.living_room_lights “Living Room Lights”: on, brightness 71 %",
    "switch": "Home Assistant switch entities: 1\n- switch.bedroom_fan “Bedroom Fan”: off",
    "fan": "Home Assistant has no fan entities.",
    "climate": "Home Assistant climate entities: 1\n"
    "- climate.hall_thermostat “Hall Thermostat”: heat, 19.5° now, set to 20°",
}


def looked_up(question: str, domains: Sequence[str]) -> list[BaseMessage]:
    """A turn that asked ha_list_entities for `domains` and heard the demo home's answers."""
    ids = [f"call_demo_{i + 1}" for i in range(len(domains))]
    return [
        HumanMessage(question),
        AIMessage(
            "",
            tool_calls=[
                {"name": "ha_list_entities", "args": {"domain": d}, "id": i}
                for d, i in zip(domains, ids, strict=True)
            ],
        ),
        *[
            ToolMessage(LISTED[d], tool_call_id=i, name="ha_list_entities")
            for d, i in zip(domains, ids, strict=True)
        ],
    ]


async def step(history: list[BaseMessage], *, streamed: bool) -> AIMessage:
    """One router step on `history`: as the router of two models calls it (`ainvoke`, with
    `respond`), or as one model's streamed step with the tools bound and no `respond`."""
    if not streamed:
        return await DemoChatModel().bind_tools(HOUSEHOLD_TOOLS).ainvoke(history)
    model = DemoChatModel(token_delay_s=0).bind_tools(
        [t for t in HOUSEHOLD_TOOLS if t.name != "respond"]
    )
    total = reduce(operator.add, [c async for c in model.astream(history)])
    assert isinstance(total, AIMessageChunk)
    return total


@pytest.mark.parametrize("streamed", [False, True], ids=["invoked", "streamed"])
@pytest.mark.parametrize(
    ("question", "domains", "expected"),
    [
        (
            "Turn on the kitchen light",
            ["light"],
            {"domain": "light", "service": "turn_on", "entity_id": "light.kitchen_light"},
        ),
        (
            "Turn on the kitchen lights at 40%",
            ["light"],
            {
                "domain": "light",
                "service": "turn_on",
                "entity_id": "light.kitchen_light",
                "data": {"brightness_pct": 40},
            },
        ),
        (
            "please turn off the living room lights",
            ["light"],
            {"domain": "light", "service": "turn_off", "entity_id": "light.living_room_lights"},
        ),
        (
            "turn on the bedroom lamp",
            ["light"],
            {"domain": "light", "service": "turn_on", "entity_id": "light.bedroom_lamp"},
        ),
        (
            "turn off the fan",
            ["fan", "switch"],
            {"domain": "switch", "service": "turn_off", "entity_id": "switch.bedroom_fan"},
        ),
        (
            "Set the thermostat to 21 degrees",
            ["climate"],
            {
                "domain": "climate",
                "service": "set_temperature",
                "entity_id": "climate.hall_thermostat",
                "data": {"temperature": 21.0},
            },
        ),
    ],
)
async def test_a_command_calls_the_service_on_the_entity_the_list_names(
    question: str, domains: list[str], expected: dict[str, Any], streamed: bool
) -> None:
    message = await step(looked_up(question, domains), streamed=streamed)
    n = len(domains) + 1
    assert calls(message) == [("ha_call_service", expected, f"call_demo_{n}")]


@pytest.mark.parametrize("streamed", [False, True], ids=["invoked", "streamed"])
@pytest.mark.parametrize(
    ("question", "domains", "said"),
    [
        (
            "Turn on the garage light",
            ["light"],
            "I could not tell which one you mean by “garage light”; Home Assistant has "
            "Bedroom Lamp (light.bedroom_lamp), Kitchen Light (light.kitchen_light), "
            "Living Room Lights (light.living_room_lights).",
        ),
        (
            "Turn on the light",
            ["light"],
            "I could not tell which one you mean by “light”; Home Assistant has "
            "Bedroom Lamp (light.bedroom_lamp), Kitchen Light (light.kitchen_light), "
            "Living Room Lights (light.living_room_lights).",
        ),
        ("turn on the fan", ["fan"], "I found nothing in Home Assistant for “fan”."),
    ],
)
async def test_a_command_no_one_entity_fits_calls_nothing_and_says_what_there_is(
    question: str, domains: list[str], said: str, streamed: bool
) -> None:
    history = looked_up(question, domains)
    routed = await step(history, streamed=streamed)
    if streamed:  # one model: its step is the answer
        answer = str(routed.content)
        assert routed.tool_calls == []
    else:
        assert [name for name, _, _ in calls(routed)] == ["respond"]
        answer = str((await DemoChatModel().ainvoke(history)).content)
    assert answer == f'You said: "{question}". {said} {DEMO_NOTICE}'


async def test_the_answer_after_a_call_says_what_it_did_not_the_list() -> None:
    history = [
        *looked_up("Turn on the kitchen light", ["light"]),
        AIMessage(
            "",
            tool_calls=[
                {
                    "name": "ha_call_service",
                    "args": {"domain": "light", "service": "turn_on", "entity_id": "x"},
                    "id": "call_demo_2",
                }
            ],
        ),
        ToolMessage(
            "Done: Turn on light.kitchen_light.\nlight.kitchen_light is now on, brightness 100 %.",
            tool_call_id="call_demo_2",
        ),
    ]
    assert calls(await DemoChatModel().bind_tools(HOUSEHOLD_TOOLS).ainvoke(history)) == [
        ("respond", {}, "call_demo_3")
    ]
    answer = str((await DemoChatModel().ainvoke(history)).content)
    assert answer == (
        'You said: "Turn on the kitchen light". Done: Turn on light.kitchen_light. '
        f"light.kitchen_light is now on, brightness 100 %. {DEMO_NOTICE}"
    )


@pytest.mark.parametrize(
    ("result", "said"),
    [
        (
            "Error: Home Assistant has no entity light.kitchen, so light.turn_on would do "
            "nothing; call ha_list_entities for the ids",
            "The ha_call_service tool reported a problem: Error: Home Assistant has no entity "
            "light.kitchen, so light.turn_on would do nothing.",
        ),
        (
            "Error: Home Assistant did not answer within 10s; the call may have run all the "
            "same: check with ha_get_state before trying again",
            "The ha_call_service tool reported a problem: Error: Home Assistant did not answer "
            "within 10s; the call may have run all the same.",
        ),
        (
            "Error: 500: Home Assistant refused or could not carry out light.turn_on for "
            "light.kitchen_light and gives the reason only in its log (Settings > System > "
            "Logs); check the entity with ha_get_state",
            "The ha_call_service tool reported a problem: Error: 500: Home Assistant refused or "
            "could not carry out light.turn_on for light.kitchen_light and gives the reason "
            "only in its log (Settings > System > Logs).",
        ),
    ],
)
def test_a_tools_advice_to_the_model_is_never_said_to_the_person(result: str, said: str) -> None:
    history: list[BaseMessage] = [
        HumanMessage("Turn on the kitchen light"),
        AIMessage(
            "",
            tool_calls=[
                {
                    "name": "ha_call_service",
                    "args": {"domain": "light", "service": "turn_on", "entity_id": "x"},
                    "id": "c",
                }
            ],
        ),
        ToolMessage(result, tool_call_id="c", status="error"),
    ]
    answer = str(DemoChatModel().invoke(history).content)
    assert answer == f'You said: "Turn on the kitchen light". {said} {DEMO_NOTICE}'


@pytest.mark.parametrize(
    ("history", "said"),
    [
        ([HumanMessage("My name is Ann."), AIMessage("Hello.")], "Your name is Ann."),
        ([HumanMessage("Hi, call me Bob"), AIMessage("Hello.")], "Your name is Bob."),
        (
            [
                HumanMessage("my name is Ann"),
                AIMessage("Hello."),
                HumanMessage("Actually, my name is Anna!"),
                AIMessage("Noted."),
            ],
            "Your name is Anna.",
        ),
        (
            [SystemMessage("What the user asked you to remember (their notes):\n- my name is Zoé")],
            "Your name is Zoé.",
        ),
        ([HumanMessage("hello")], "You have not told me your name yet."),
    ],
)
def test_what_is_my_name_is_answered_from_the_conversation_and_the_notes(
    history: list[BaseMessage], said: str
) -> None:
    question = "What is my name?"
    answer = str(DemoChatModel().invoke([*history, HumanMessage(question)]).content)
    assert answer == f'You said: "{question}" {said} {DEMO_NOTICE}'


def test_my_name_is_is_heard() -> None:
    answer = str(DemoChatModel().invoke("My name is Ann.").content)
    assert answer == f'You said: "My name is Ann." Nice to meet you, Ann. {DEMO_NOTICE}'


def test_the_weather_is_said_as_the_tool_says_it() -> None:
    history: list[BaseMessage] = [
        HumanMessage("Will it rain in Paris tomorrow?"),
        AIMessage("", tool_calls=[{"name": "weather", "args": {"location": "Paris"}, "id": "c"}]),
        ToolMessage(
            "Error: could not reach the weather service (Open-Meteo): connection refused",
            tool_call_id="c",
            status="error",
        ),
    ]
    answer = str(DemoChatModel().invoke(history).content)
    assert answer == (
        'You said: "Will it rain in Paris tomorrow?" The weather tool reported a problem: '
        "Error: could not reach the weather service (Open-Meteo): connection refused. "
        f"{DEMO_NOTICE}"
    )


# The scans below are told apart from quadratic ones by the CPU they take, not by the clock:
# a linear one of these inputs takes at most 1.6 s of CPU here (a whole turn of the demo model
# on 100 KB), a quadratic one tens of seconds to hours, and on a loaded machine (the suite on
# three workers beside other work) a linear one took 7 s of wall time.
LINEAR_CPU_S = 5.0


@pytest.fixture
def linear() -> Iterator[None]:
    """Fails the test if it took `LINEAR_CPU_S` of this process's CPU or more."""
    started = time.process_time()
    yield
    used = time.process_time() - started
    assert used < LINEAR_CPU_S, f"{used:.1f} s of CPU: not linear"


@pytest.mark.usefixtures("linear")
@pytest.mark.parametrize(
    "question",
    [" " * 100_000 + "x", "in A " * 20_000, "turn on " + "a " * 50_000, "set a timer " * 10_000],
)
async def test_household_routing_is_linear(question: str) -> None:
    await DemoChatModel().bind_tools(HOUSEHOLD_TOOLS).ainvoke(question)


async def test_routes_to_respond_once_tools_have_answered() -> None:
    history: list[BaseMessage] = [
        HumanMessage("What time is it?"),
        AIMessage("", tool_calls=[{"name": "get_time", "args": {}, "id": "call_demo_1"}]),
        ToolMessage("12:00", tool_call_id="call_demo_1", name="get_time"),
    ]
    message = await DemoChatModel().bind_tools(ALL_TOOLS).ainvoke(history)
    assert calls(message) == [("respond", {}, "call_demo_2")]


async def test_without_respond_tool_answers_in_text() -> None:
    model = DemoChatModel(token_delay_s=0).bind_tools([get_time, calculator])
    message = await model.ainvoke("Tell me about otters")
    assert message.tool_calls == []
    assert DEMO_NOTICE in str(message.content)


async def test_tool_choice_forces_a_tool_or_none() -> None:
    model = DemoChatModel()
    forced = await model.bind_tools(ALL_TOOLS, tool_choice="respond").ainvoke("What time is it?")
    assert calls(forced) == [("respond", {}, "call_demo_1")]
    none = await model.bind_tools(ALL_TOOLS, tool_choice="none").ainvoke("What time is it?")
    assert calls(none) == []


async def test_streamed_tool_calls_match_invoke() -> None:
    model = DemoChatModel(token_delay_s=0).bind_tools(ALL_TOOLS)
    question = "time in America/New_York and 2 ** 8?"
    total = reduce(operator.add, [c async for c in model.astream(question)])
    invoked = await model.ainvoke(question)
    assert calls(total) == calls(invoked)
    assert total.usage_metadata is not None and total.usage_metadata["output_tokens"] > 0


async def test_answer_reports_tool_results() -> None:
    history: list[BaseMessage] = [
        HumanMessage("old question"),
        AIMessage("old answer"),
        HumanMessage("What time is it in Europe/Paris, and what is 6*7?"),
        AIMessage(
            "",
            tool_calls=[
                {"name": "get_time", "args": {"timezone": "Europe/Paris"}, "id": "call_demo_1"},
                {"name": "calculator", "args": {"expression": "6*7"}, "id": "call_demo_2"},
            ],
        ),
        ToolMessage("2026-01-01T12:00:00+01:00", tool_call_id="call_demo_1"),
        ToolMessage("42", tool_call_id="call_demo_2"),
    ]
    chunks = [c async for c in DemoChatModel(token_delay_s=0).astream(history)]
    text = "".join(str(c.content) for c in chunks)
    assert "The time in Europe/Paris is 2026-01-01T12:00:00+01:00." in text
    assert "The result of 6*7 is 42." in text
    assert text.endswith(DEMO_NOTICE)


def test_tool_errors_are_reported() -> None:
    history: list[BaseMessage] = [
        HumanMessage("What is 1/0?"),
        AIMessage(
            "", tool_calls=[{"name": "calculator", "args": {"expression": "1/0"}, "id": "c"}]
        ),
        ToolMessage("Error: division by zero", tool_call_id="c", status="error"),
    ]
    text = str(DemoChatModel().invoke(history).content)
    assert "The calculator tool reported a problem: Error: division by zero." in text


# -- finding arithmetic and time zones ---------------------------------------------------------


@pytest.mark.parametrize(
    ("question", "expression"),
    [
        ("What is (2 + 3) * 4?", "(2 + 3) * 4"),
        ("compute 7*6 please", "7*6"),
        ("What's the time in Asia/Tokyo, and 10 / 4?", "10 / 4"),
        ("time in America/New_York and 2 ** 8?", "2 ** 8"),
        ("What happened on 2024-01-05?", None),
        ("What is 2 + 2 on 2024-01-05?", "2 + 2"),
        ("Tell me about otters", None),
        ("What is 42?", None),
        ("1 2 3", None),
        ("2 *** 3", None),
        ("10 % 3 = ?", "10 % 3"),
        ("7 // 2 and 1 % 3", "7 // 2"),
        ("1.5 * 2", "1.5 * 2"),
        ("2**-1", "2**-1"),
        ("3 - -2", "3 - -2"),
        ("x -1+2", "-1+2"),
        ("(-3) ** 2", "(-3) ** 2"),
        ("( 1 + 2 )", "( 1 + 2 )"),
        # Parentheses next to the numbers that pair with nothing are dropped at the ends only.
        ("(what is 2+2)", "2+2"),
        ("((1 + 2) * 3", "(1 + 2) * 3"),
        ("1+2 ))", "1+2"),
        ("2 + (3", "2 + (3"),
        # A number may start after a dot, as the regex this scan replaced allowed.
        ("v1.2.3+4", "2.3+4"),
    ],
)
def test_finds_the_first_arithmetic(question: str, expression: str | None) -> None:
    assert _find_expression(question) == expression


@pytest.mark.parametrize(
    ("question", "expression"),
    [
        ("What is 17.5 % of 2,340?", "17.5 * 2340 / 100"),
        ("15% of 80", "15 * 80 / 100"),
        ("what's 20 percent of 80", "20 * 80 / 100"),
        ("20 per cent of 1,000,000.5", "20 * 1000000.5 / 100"),
        ("10% of 2,340, please", "10 * 2340 / 100"),
        ("3 %  OF  4", "3 * 4 / 100"),
        ("007 % of 0", "7 * 0 / 100"),
        ("0.5% of 00.5", "0.5 * 0.5 / 100"),
        # The calculator's "%" is a remainder; a number is whole or none of it is taken.
        ("What is 50 % 7?", None),
        ("2 % of 2,3400", None),
        ("2 % of 2,34", None),
        ("1.5.5 % of 3", None),
        ("% of 3", None),
    ],
)
def test_finds_a_percentage_of_a_number(question: str, expression: str | None) -> None:
    assert _find_percentage(question) == expression


@pytest.mark.parametrize(
    ("question", "timezone"),
    [
        ("What time is it?", "UTC"),
        ("What time is it in Europe/Paris?", "Europe/Paris"),
        ("what's the time in utc", "UTC"),
        ("gmt please", "GMT"),
        ("time in asia/tokyo", "asia/tokyo"),
        ("America/Argentina/Buenos_Aires now", "America/Argentina/Buenos_Aires"),
        ("Europe/Paris- now", "Europe/Paris"),
        ("Europe/Paris/x1", "Europe/Paris"),
        ("EuropeX/Paris", "UTC"),
        ("Mars/Base", "UTC"),
        ("Europe/", "UTC"),
        # A place the question ends with, by the zone named after it.
        ("What time is it in Tokyo?", "Asia/Tokyo"),
        ("What time is it in New York right now?", "America/New_York"),
        ("the time at Port-au-Prince", "America/Port-au-Prince"),
        ("What time is it in Tokyo, Japan?", "UTC"),
        ("What time is it in Springfield?", "UTC"),
        ("What time is it for Ann?", "UTC"),
    ],
)
def test_finds_the_timezone(question: str, timezone: str) -> None:
    assert _find_timezone(question) == timezone


# Inputs built to make a scan of the text quadratic. The regex this scan replaced backtracked
# through the digits, parentheses and spaces ones from every start, and its parenthesis trimming
# re-sliced the string per parenthesis; the others guard the usual ways a scan goes wrong. At
# this size a quadratic scan takes from tens of seconds to hours and a linear one well under a
# second, so the CPU they take tells the two apart on any machine (`linear`).
ADVERSARIAL_EXPRESSIONS = {
    "digits": ("1" * 200_000 + "x", None),
    "open parentheses": ("(" * 100_000, None),
    "open parentheses then arithmetic": ("(" * 200_000 + "1+1", "1+1"),
    "dangling operators": ("1+" * 100_000, "1+" * 99_999 + "1"),
    "numbers and spaces": ("1 " * 100_000 + "+", None),
    "spaces": (" " * 200_000, None),
    "dotted digits": ("1." * 100_000, None),
}
ADVERSARIAL_PERCENTAGES = {
    "digits": ("1" * 200_000 + "%", None),
    "shares of shares": ("1 % of " * 50_000, "1 * 1 / 100"),
    "shares of nothing": ("1 % of x " * 40_000, None),
    "thousands that never end": ("1" + ",000" * 50_000 + "1", None),
    "a number then spaces": ("1" + " " * 200_000 + "x", None),
    "a share then spaces": ("1 %" + " " * 200_000, None),
    "dotted digits": ("1." * 100_000, None),
    "commas": ("1," * 100_000, None),
}
ADVERSARIAL_TIMEZONES = {
    "region names": ("Europe/" * 50_000, "Europe/Europe/Europe"),
    "names and dashes": ("Europe/a-" * 50_000, "Europe/a-Europe/a-Europe"),
    "a name that never ends on a word boundary": ("Europe/" + "a" * 200_000 + "1", "UTC"),
    "places": ("in A " * 50_000, "UTC"),
    "a place that never ends": ("in " + "A" * 200_000 + "1", "UTC"),
    "a place then spaces": ("in Tokyo" + " " * 200_000 + "x", "UTC"),
    "a place, then spaces to the end": ("in Tokyo" + " " * 200_000, "Asia/Tokyo"),
}


@pytest.mark.usefixtures("linear")
@pytest.mark.parametrize(
    ("text", "expression"),
    list(ADVERSARIAL_EXPRESSIONS.values()),
    ids=list(ADVERSARIAL_EXPRESSIONS),
)
def test_finding_arithmetic_is_linear(text: str, expression: str | None) -> None:
    assert _find_expression(text) == expression


@pytest.mark.usefixtures("linear")
@pytest.mark.parametrize(
    ("text", "expression"),
    list(ADVERSARIAL_PERCENTAGES.values()),
    ids=list(ADVERSARIAL_PERCENTAGES),
)
def test_finding_a_percentage_is_linear(text: str, expression: str | None) -> None:
    assert _find_percentage(text) == expression


@pytest.mark.usefixtures("linear")
@pytest.mark.parametrize(
    ("text", "timezone"), list(ADVERSARIAL_TIMEZONES.values()), ids=list(ADVERSARIAL_TIMEZONES)
)
def test_finding_a_timezone_is_linear(text: str, timezone: str) -> None:
    assert _find_timezone(text) == timezone


@pytest.mark.usefixtures("linear")
@pytest.mark.parametrize(
    "text",
    [text for text, _ in [*ADVERSARIAL_EXPRESSIONS.values(), *ADVERSARIAL_TIMEZONES.values()]]
    + [text for text, _ in ADVERSARIAL_PERCENTAGES.values()],
    ids=[*ADVERSARIAL_EXPRESSIONS, *ADVERSARIAL_TIMEZONES, *ADVERSARIAL_PERCENTAGES],
)
async def test_routing_and_answering_are_linear(text: str) -> None:
    question = f"What time is it? {text}"
    routed = await DemoChatModel().bind_tools(ALL_TOOLS).ainvoke(question)
    assert calls(routed)[0][0] == "get_time"

    # The answer quotes the question and reports tool results that carry the text too.
    history: list[BaseMessage] = [
        HumanMessage(question),
        AIMessage("", tool_calls=[{"name": "calculator", "args": {"expression": text}, "id": "c"}]),
        ToolMessage(text + " " * 100_000, tool_call_id="c"),
    ]
    answer = await DemoChatModel(token_delay_s=0).ainvoke(history)
    assert str(answer.content).endswith(DEMO_NOTICE)


@pytest.mark.usefixtures("linear")
def test_splitting_whitespace_into_tokens_is_linear() -> None:
    assert _split_tokens(" " * 200_000) == [" " * 200_000]


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("", []),
        ("one", ["one"]),
        ("  one two\n three", ["  one", " two", "\n three"]),
        ("one two ", ["one", " two", " "]),
    ],
)
def test_tokens_are_words_with_the_whitespace_before_them(text: str, tokens: list[str]) -> None:
    assert _split_tokens(text) == tokens


# -- call parameters -----------------------------------------------------------------------------

QUESTION = "What's up?"
ANSWER = str(DemoChatModel().invoke(QUESTION).content)
ANSWER_TOKENS = _split_tokens(ANSWER)


async def streamed(model: Any, **kwargs: Any) -> tuple[list[str], AIMessageChunk]:
    """The text chunks `model` streams for QUESTION, and all its chunks added up."""
    chunks = [c async for c in model.astream(QUESTION, **kwargs)]
    total = reduce(operator.add, chunks)
    assert isinstance(total, AIMessageChunk)
    return [str(c.content) for c in chunks if c.content], total


def assert_answer(message: BaseMessage, content: str, finish_reason: str) -> None:
    assert isinstance(message, AIMessage)
    assert message.content == content
    assert message.response_metadata["finish_reason"] == finish_reason
    usage = message.usage_metadata
    assert usage is not None
    assert usage["output_tokens"] == len(_split_tokens(content))
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


@pytest.mark.parametrize("max_tokens", [0, 1, 5, len(ANSWER_TOKENS) - 1])
async def test_max_tokens_cuts_the_answer_with_finish_reason_length(max_tokens: int) -> None:
    model = DemoChatModel(token_delay_s=0)
    expected = "".join(ANSWER_TOKENS[:max_tokens])

    texts, total = await streamed(model, max_tokens=max_tokens)
    assert texts == ANSWER_TOKENS[:max_tokens]
    assert_answer(total, expected, "length")
    assert total.usage_metadata is not None
    assert total.usage_metadata["output_tokens"] == max_tokens

    assert_answer(await model.ainvoke(QUESTION, max_tokens=max_tokens), expected, "length")


@pytest.mark.parametrize("max_tokens", [len(ANSWER_TOKENS), 10_000, None])
async def test_max_tokens_that_fit_the_answer_change_nothing(max_tokens: int | None) -> None:
    model = DemoChatModel(token_delay_s=0)
    texts, total = await streamed(model, max_tokens=max_tokens)
    assert texts == ANSWER_TOKENS
    assert_answer(total, ANSWER, "stop")
    assert_answer(await model.ainvoke(QUESTION, max_tokens=max_tokens), ANSWER, "stop")


@pytest.mark.parametrize(
    ("stop", "expected"),
    [
        (["demo"], ANSWER[: ANSWER.index("demo")]),
        (["demo", "said"], "You "),
        (["said", "demo"], "You "),
        (['up?"'], "You said: \"What's "),
        (["not in the answer"], ANSWER),
        (["", "demo"], ANSWER[: ANSWER.index("demo")]),
        (["You"], ""),
    ],
)
async def test_stop_cuts_the_answer_before_the_first_stop_string(
    stop: list[str], expected: str
) -> None:
    model = DemoChatModel(token_delay_s=0)

    texts, total = await streamed(model, stop=stop)
    assert "".join(texts) == expected
    assert_answer(total, expected, "stop")

    assert_answer(await model.ainvoke(QUESTION, stop=stop), expected, "stop")


async def test_the_earlier_of_stop_and_max_tokens_ends_the_answer() -> None:
    model = DemoChatModel(token_delay_s=0)
    cut = ANSWER[: ANSWER.index("demo")]
    cut_tokens = _split_tokens(cut)

    early_stop = await model.ainvoke(QUESTION, stop=["demo"], max_tokens=len(cut_tokens))
    assert_answer(early_stop, cut, "stop")
    early_length = await model.ainvoke(QUESTION, stop=["demo"], max_tokens=len(cut_tokens) - 1)
    assert_answer(early_length, "".join(cut_tokens[:-1]), "length")


def test_sync_stream_and_invoke_honour_stop_and_max_tokens() -> None:
    model = DemoChatModel(token_delay_s=0)
    streamed_total = reduce(operator.add, model.stream(QUESTION, stop=["said"], max_tokens=3))
    assert isinstance(streamed_total, AIMessageChunk)
    assert_answer(streamed_total, "You ", "stop")
    assert_answer(model.invoke(QUESTION, max_tokens=2), "".join(ANSWER_TOKENS[:2]), "length")


async def test_sampling_parameters_are_accepted_and_ignored() -> None:
    model = DemoChatModel(token_delay_s=0)
    sampling: dict[str, Any] = {
        "temperature": 0.2,
        "top_p": 0.9,
        "seed": 7,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "user": "user-1",
    }
    texts, total = await streamed(model, **sampling)
    assert texts == ANSWER_TOKENS
    assert_answer(total, ANSWER, "stop")
    assert_answer(await model.ainvoke(QUESTION, **sampling), ANSWER, "stop")


async def test_tool_call_answers_ignore_stop_and_max_tokens() -> None:
    model = DemoChatModel(token_delay_s=0).bind_tools(ALL_TOOLS)
    question = "What time is it in Europe/Paris?"
    plain = await model.ainvoke(question)
    limited = await model.ainvoke(question, stop=["Europe", "time"], max_tokens=1, seed=1)
    assert (
        calls(limited)
        == calls(plain)
        == [("get_time", {"timezone": "Europe/Paris"}, "call_demo_1")]
    )
    assert limited.response_metadata["finish_reason"] == "tool_calls"
    assert limited.usage_metadata == plain.usage_metadata
    total = reduce(operator.add, [c async for c in model.astream(question, max_tokens=1)])
    assert calls(total) == calls(plain)


# -- tools it has no rule for: the client's, an MCP server's ----------------------------------


def function(name: str, properties: dict[str, Any], required: Sequence[str] = ()) -> dict[str, Any]:
    """A function tool as a client sends it (the OpenAI shape)."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name.replace('_', ' ')} tool.",
            "parameters": {"type": "object", "properties": properties, "required": [*required]},
        },
    }


STRING = {"type": "string"}
GET_WEATHER = function("get_weather", {"city": STRING}, ["city"])
READ_FILE = function("files__read_file", {"name": STRING}, ["name"])
DELETE_FILE = function("files__delete_file", {"name": STRING}, ["name"])
GET_LIGHT = function("home__get_light", {"entity": STRING}, ["entity"])
SET_LIGHT = function(
    "home__set_light",
    {"entity": STRING, "brightness": {"type": "integer"}},
    ["entity", "brightness"],
)
UNITS = function("set_units", {"units": {"type": "string", "enum": ["metric", "imperial"]}})
DICE = function(
    "roll_dice",
    {"sides": {"type": "integer"}, "count": {"type": "integer", "default": 1}},
    ["sides"],
)
TRANSLATE = function("translate_text", {"text": STRING, "language": STRING}, ["text", "language"])
ARCHIVE = function(
    "archive_mail",
    {
        "folders": {"type": "array", "items": STRING},
        "dry_run": {"type": "boolean"},
        "note": {"anyOf": [STRING, {"type": "null"}], "default": None},
    },
    ["folders", "dry_run"],
)
CLIENT_WEATHER = function("weather", {"city": STRING}, ["city"])
FOREIGN = [
    GET_WEATHER,
    READ_FILE,
    DELETE_FILE,
    GET_LIGHT,
    SET_LIGHT,
    UNITS,
    DICE,
    TRANSLATE,
    ARCHIVE,
]


@pytest.mark.parametrize("streamed", [False, True], ids=["invoked", "streamed"])
@pytest.mark.parametrize(
    ("question", "tools", "expected"),
    [
        # Before the demo's own weather rule: the client's tool is named by the words.
        ("What is the weather in Oslo?", [weather, GET_WEATHER], ("get_weather", {"city": "Oslo"})),
        ("Read the file notes.txt", FOREIGN, ("files__read_file", {"name": "notes.txt"})),
        ("Please delete the file todo.txt.", FOREIGN, ("files__delete_file", {"name": "todo.txt"})),
        (
            "Set the porch light to 40",
            FOREIGN,
            ("home__set_light", {"entity": "porch", "brightness": 40}),
        ),
        ("How bright is the porch light?", FOREIGN, ("home__get_light", {"entity": "porch"})),
        ("Switch the units to imperial", FOREIGN, ("set_units", {"units": "imperial"})),
        ("Roll a dice with 20 sides", FOREIGN, ("roll_dice", {"sides": 20})),
        ("roll 3 dice of 6", FOREIGN, ("roll_dice", {"sides": 3, "count": 6})),
        (
            'Translate "good morning" to French',
            FOREIGN,
            ("translate_text", {"text": "good morning", "language": "French"}),
        ),
        ("Archive my mail", FOREIGN, ("archive_mail", {"folders": [], "dry_run": False})),
        # A client's tool named like one of the demo's rules gets arguments from its schema.
        ("What's the weather in Lyon?", [CLIENT_WEATHER], ("weather", {"city": "Lyon"})),
    ],
)
async def test_calls_a_tool_the_words_name_with_arguments_from_its_schema(
    question: str, tools: list[Any], expected: tuple[str, dict[str, Any]], streamed: bool
) -> None:
    model = DemoChatModel(token_delay_s=0).bind_tools([*tools, *([] if streamed else [respond])])
    if streamed:
        message: BaseMessage = reduce(operator.add, [c async for c in model.astream(question)])
    else:
        message = await model.ainvoke(question)
    assert [(name, args) for name, args, _ in calls(message)] == [expected]


@pytest.mark.parametrize(
    ("question", "tools"),
    [
        ("Set a timer for 5 minutes", [*HOUSEHOLD_TOOLS, SET_LIGHT]),  # "set" names no tool
        ("Remember that the file is in the drawer", [save_note, READ_FILE]),  # a rule first
        ("What time is it now?", [get_time, function("plex_now_playing", {})]),
    ],
)
async def test_a_common_word_or_a_rule_comes_before_a_tool_the_words_barely_name(
    question: str, tools: list[Any]
) -> None:
    message = await DemoChatModel().bind_tools(tools).ainvoke(question)
    assert [name for name, _, _ in calls(message)] == [
        {"Set": "set_timer", "Rem": "save_note", "Wha": "get_time"}[question[:3]]
    ]


PLEX_SEARCH = function("plex_search", {"query": STRING}, ["query"])
NOTION_PAGE = function("notion__create_page", {"title": STRING}, ["title"])


@pytest.mark.parametrize(
    ("question", "tools", "called"),
    [
        # More of the words name web_search ("web", "search") than plex_search ("search").
        ("Search the web for this week's Debian news", [web_search, PLEX_SEARCH], "web_search"),
        ("Search Plex for Alien", [web_search, PLEX_SEARCH], "plex_search"),
        # As many words name each: the tool with no rule of its own.
        ("Search the web with Plex", [web_search, PLEX_SEARCH], "plex_search"),
        # The words name save_note better, but no rule calls it: the tool they name is called.
        ("Save this note to Notion", [save_note, NOTION_PAGE], "notion__create_page"),
    ],
)
async def test_a_tool_with_a_rule_that_more_words_name_comes_first(
    question: str, tools: list[Any], called: str
) -> None:
    message = await DemoChatModel().bind_tools(tools).ainvoke(question)
    assert [name for name, _, _ in calls(message)] == [called]


@pytest.mark.parametrize(
    ("choice", "question", "expected"),
    [
        ("get_weather", "How is it in Oslo today?", ("get_weather", {"city": "Oslo"})),
        (
            {"type": "function", "function": {"name": "get_weather"}},
            "And in Bergen?",
            ("get_weather", {"city": "Bergen"}),
        ),
        ("roll_dice", "Go on, 12 this time", ("roll_dice", {"sides": 12})),
        ("get_time", "What time is it in Asia/Tokyo?", ("get_time", {"timezone": "Asia/Tokyo"})),
        # "required": the tool the words name, else the first offered.
        ("required", "Read the file notes.txt", ("files__read_file", {"name": "notes.txt"})),
        ("any", "Tell me a joke", ("get_weather", {"city": "joke"})),
    ],
)
async def test_a_forced_tool_gets_arguments_from_its_schema(
    choice: Any, question: str, expected: tuple[str, dict[str, Any]]
) -> None:
    model = DemoChatModel().bind_tools([*FOREIGN, get_time], tool_choice=choice)
    message = await model.ainvoke(question)
    assert [(name, args) for name, args, _ in calls(message)] == [expected]


@pytest.mark.usefixtures("linear")
@pytest.mark.parametrize(
    "question",
    [
        "file " * 50_000,
        '"' * 100_000,
        "'a' " * 50_000,
        '"a" ' * 50_000,
        "1 " * 100_000 + "dice",
        "roll dice " + "x" * 200_000,
        "the " * 50_000 + "light",
        "What is my " + "name " * 50_000,
    ],
)
async def test_matching_a_tool_and_its_arguments_is_linear(question: str) -> None:
    await DemoChatModel().bind_tools([*FOREIGN, respond]).ainvoke(question)
    await DemoChatModel().bind_tools([*FOREIGN], tool_choice="translate_text").ainvoke(question)


@pytest.mark.usefixtures("linear")
def test_answering_with_long_results_is_linear() -> None:
    history: list[BaseMessage] = [
        HumanMessage("turn on the " + "kitchen " * 10_000 + "light"),
        AIMessage("", tool_calls=[{"name": "ha_list_entities", "args": {}, "id": "c"}]),
        ToolMessage(
            "".join(f"- light.l{i} “L {i}”: off\n" for i in range(20_000))
            + "a_b; " * 20_000
            + "x: ha_get_state; " * 10_000,
            tool_call_id="c",
        ),
    ]
    assert str(DemoChatModel().invoke(history).content).endswith(DEMO_NOTICE)


# -- through the API, on the demo model ---------------------------------------------------------


def on_the_demo(**overrides: Any) -> Config:
    """A stack's settings with no upstream (the offline demo model) and `overrides`."""
    config = make_config(None, openai_base_url=None, openai_api_key=None, **overrides)
    assert config.settings.demo_mode
    return config


async def answer_to(stack: Stack, question: str, **extra: Any) -> tuple[str, list[Frame]]:
    """The streamed chat completion's text for `question`, and its frames."""
    body = {
        "model": "bernard-v1",
        "messages": [{"role": "user", "content": question}],
        "stream": True,
        "stream_options": {"tool_events": "bernard"},
        **extra,
    }
    got = await collect(stack.client, "POST", "/v1/chat/completions", json=body)
    return text_of(got), got


async def test_will_it_rain_offline_says_the_weather_service_cannot_be_reached() -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    config = on_the_demo(open_meteo_url=nowhere, open_meteo_geocoding_url=nowhere)
    async with config.stack() as stack:
        said, got = await answer_to(stack, "Will it rain in Paris tomorrow?")
    (call,) = [f.bernard for f in got if f.bernard and f.bernard["type"] == "tool_call"]
    assert (call["name"], json.loads(call["arguments"])) == ("weather", {"location": "Paris"})
    assert said.startswith(
        'You said: "Will it rain in Paris tomorrow?" The weather tool reported a problem: '
        "Error: could not reach the weather service (Open-Meteo): "
    )
    assert said.endswith(DEMO_NOTICE)


async def test_will_it_rain_reads_the_forecast() -> None:
    async with FakeOpenMeteo() as meteo:
        config = on_the_demo(open_meteo_url=meteo.base_url, open_meteo_geocoding_url=meteo.base_url)
        async with config.stack() as stack:
            said, _ = await answer_to(stack, "Will it rain in Berlin tomorrow?")
    assert said == (
        'You said: "Will it rain in Berlin tomorrow?" Weather for Berlin, Germany '
        "(Europe/Berlin): Now (2024-06-01 14:15): 21.3°C, partly cloudy, wind 12.4 km/h, "
        "humidity 48%; Sat 2024-06-01: partly cloudy, 14.2°C to 23.1°C, precipitation 0 mm; "
        "Sun 2024-06-02: slight rain, 13.5°C to 19.8°C, precipitation 4.6 mm; "
        f"Mon 2024-06-03: thunderstorm, 11.9°C to 17.2°C, precipitation 12.3 mm. {DEMO_NOTICE}"
    )


async def test_what_is_my_name_is_answered_from_the_conversation_in_the_responses_api() -> None:
    async with on_the_demo().stack() as stack:
        client = stack.openai()
        first = await client.responses.create(model="bernard-v1", input="My name is Ann.")
        async with client.responses.stream(
            model="bernard-v1", input="What is my name?", previous_response_id=first.id
        ) as stream:
            final = await stream.get_final_response()
    assert first.output_text == f'You said: "My name is Ann." Nice to meet you, Ann. {DEMO_NOTICE}'
    assert final.output_text == f'You said: "What is my name?" Your name is Ann. {DEMO_NOTICE}'


GET_WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city now.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.mark.parametrize(
    ("question", "choice", "arguments"),
    [
        ("What is the weather in Oslo?", None, {"city": "Oslo"}),
        (
            "And in Bergen?",
            {"type": "function", "function": {"name": "get_weather"}},
            {"city": "Bergen"},
        ),
    ],
)
async def test_the_clients_own_tool_is_called_with_arguments_from_its_schema(
    question: str, choice: dict[str, Any] | None, arguments: dict[str, str]
) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    # Bernard's own weather tool is on too: the client's, which the words name, is called.
    config = on_the_demo(open_meteo_url=nowhere, open_meteo_geocoding_url=nowhere)
    extra: dict[str, Any] = {"tools": [GET_WEATHER_TOOL]}
    if choice is not None:
        extra["tool_choice"] = choice
    async with config.stack() as stack:
        offered = (await stack.client.get("/v1/tools")).json()["data"]
        assert "weather" in [tool["name"] for tool in offered]
        _, got = await answer_to(stack, question, **extra)
    handed = [
        c
        for f in got
        if not f.done
        for c in (f.json["choices"] or [{}])[0].get("delta", {}).get("tool_calls") or []
    ]
    assert [c["function"]["name"] for c in handed if c["function"].get("name")] == ["get_weather"]
    assert json.loads("".join(c["function"].get("arguments") or "" for c in handed)) == arguments
    finish = [
        f.json["choices"][0]["finish_reason"] for f in got if not f.done and f.json["choices"]
    ]
    assert finish[-1] == "tool_calls"
