"""The built-in tools (`calculator`, `get_time`) and the progress reporting they use."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from langchain_core.messages import ToolMessage
from langchain_core.tools import ToolException
from langchain_core.utils.function_calling import convert_to_openai_tool

from shared.events import ToolProgress
from worker.tools import default_tools
from worker.tools.calculator import (
    MAX_EXPRESSION_CHARS,
    CalculatorError,
    calculator,
    evaluate,
    format_number,
)
from worker.tools.progress import ProgressReporter, get_reporter, progress_config
from worker.tools.texts import folded_text
from worker.tools.time import (
    UnknownTimezoneError,
    current_time,
    get_time,
    resolve_timezone,
    zone_for_place,
)

# --- calculator -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("1 + 2", 3),
        ("7 - 10", -3),
        ("6 * 7", 42),
        ("7 / 2", 3.5),
        ("7 // 2", 3),
        ("-7 // 2", -4),
        ("7 % 3", 1),
        ("2 ** 10", 1024),
        ("2 ** -1", 0.5),
        ("-3", -3),
        ("+3", 3),
        ("--3", 3),
        ("-2 ** 2", -4),
        ("(1 + 2) * 3", 9),
        ("((2))", 2),
        ("2 + 3 * 4", 14),
        ("1.5 * 2", 3.0),
        ("1e3 + 1", 1001.0),
        ("0.1 + 0.2", 0.1 + 0.2),
        ("10 ** 100", 10**100),
        ("  12  ", 12),
    ],
)
def test_calculator_evaluates_arithmetic(expression: str, expected: float) -> None:
    assert evaluate(expression) == expected


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("__import__('os')", "function call"),
        ("__import__('os').system('true')", "function call"),
        ("os", "name 'os'"),
        ("x + 1", "name 'x'"),
        ("(1).__class__", "attribute '__class__'"),
        ("[1, 2][0]", "Subscript"),
        ("'a' * 3", "unsupported value 'a'"),
        ("True + 1", "unsupported value True"),
        ("1j * 1j", "unsupported value 1j"),
        ("1 < 2", "operator Lt"),
        ("1 and 2", "operator And"),
        ("1 << 100", "operator LShift"),
        ("~1", "operator Invert"),
        ("2 ^ 3", "use '**' for powers"),
        ("lambda: 1", "Lambda"),
        ("1 if 1 else 2", "IfExp"),
        ("1 +", "not a valid arithmetic expression"),
        ("x = 1", "not a valid arithmetic expression"),
        ("", "empty expression"),
        ("   ", "empty expression"),
        ("1 / 0", "division by zero"),
        ("1 // 0", "division by zero"),
        ("1 % 0", "division by zero"),
        ("1.0 / 0.0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("9 ** 9 ** 9", "exponent larger than"),
        ("2 ** 100000", "exponent larger than"),
        ("10 ** 9999", "result too large"),
        ("(2 ** 9000) * (2 ** 9000)", "result too large"),
        ("10.0 ** 400", "result too large"),
        ("1e308 * 10", "result too large"),
        ("(-8) ** 0.5", "not a real number"),
        ("1" + "+1" * MAX_EXPRESSION_CHARS, "longer than"),
    ],
)
def test_calculator_rejects_with_a_clear_reason(expression: str, reason: str) -> None:
    with pytest.raises(CalculatorError, match=reason.replace("(", r"\(").replace("*", r"\*")):
        evaluate(expression)


def test_calculator_refuses_a_huge_power_without_computing_it() -> None:
    started = time.perf_counter()
    with pytest.raises(CalculatorError):
        evaluate("999999 ** 9999")
    assert time.perf_counter() - started < 0.5


@pytest.mark.parametrize(
    ("value", "text"),
    [(3, "3"), (3.5, "3.5"), (0.1 + 0.2, "0.3"), (2.0, "2"), (1e20, "1e+20"), (-0.25, "-0.25")],
)
def test_numbers_are_formatted_for_the_model(value: float, text: str) -> None:
    assert format_number(value) == text


async def test_calculator_tool_returns_the_value_as_a_tool_message() -> None:
    call = {"name": "calculator", "args": {"expression": "6 * 7"}, "id": "c1", "type": "tool_call"}

    message = await calculator.ainvoke(call)

    assert isinstance(message, ToolMessage)
    assert message.content == "42"
    assert message.tool_call_id == "c1"
    assert message.status == "success"


async def test_calculator_tool_turns_a_rejected_expression_into_an_error_result() -> None:
    call = {
        "name": "calculator",
        "args": {"expression": "__import__('os')"},
        "id": "c2",
        "type": "tool_call",
    }

    message = await calculator.ainvoke(call)

    assert message.status == "error"
    assert message.content.startswith("Error: unsupported syntax: function call")


def test_calculator_tool_runs_without_a_reporter() -> None:
    assert calculator.invoke({"expression": "1 / 4"}) == "0.25"


def test_calculator_tool_schema_shows_only_the_expression_to_the_model() -> None:
    schema = convert_to_openai_tool(calculator)["function"]

    assert schema["name"] == "calculator"
    assert set(schema["parameters"]["properties"]) == {"expression"}


# --- progress ---------------------------------------------------------------------------


async def test_calculator_reports_progress_before_its_result() -> None:
    events: list[ToolProgress] = []
    reporter = ProgressReporter(events.append, tool_call_id="c3", tool="calculator")
    call = {"name": "calculator", "args": {"expression": "2 + 2"}, "id": "c3", "type": "tool_call"}

    message = await calculator.ainvoke(call, config=progress_config(reporter))

    assert message.content == "4"
    assert [(e.phase, e.message) for e in events] == [
        ("step", "Evaluating 2 + 2"),
        ("complete", "2 + 2 = 4"),
    ]
    assert all(e.tool_call_id == "c3" and e.tool == "calculator" for e in events)


async def test_calculator_reports_an_error_phase_when_it_rejects_the_expression() -> None:
    events: list[ToolProgress] = []
    reporter = ProgressReporter(events.append, tool_call_id="c4", tool="calculator")

    await calculator.ainvoke({"expression": "1 / 0"}, config=progress_config(reporter))

    assert [(e.phase, e.message) for e in events] == [
        ("step", "Evaluating 1 / 0"),
        ("error", "division by zero"),
    ]


@pytest.mark.parametrize("length", [MAX_EXPRESSION_CHARS + 1, 1_000_000])
async def test_an_over_long_expression_is_not_copied_into_progress(length: int) -> None:
    events: list[ToolProgress] = []
    reporter = ProgressReporter(events.append, tool_call_id="c8", tool="calculator")
    expression = ("1+" * length)[:length]

    message = await calculator.ainvoke(
        {"name": "calculator", "args": {"expression": expression}, "id": "c8", "type": "tool_call"},
        config=progress_config(reporter),
    )

    assert message.status == "error"
    assert [(e.phase, e.message) for e in events] == [
        ("error", f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    ]
    assert all(len(e.message) < 100 for e in events)
    assert len(message.content) < 100


async def test_reporter_methods_produce_tool_progress_events() -> None:
    events: list[ToolProgress] = []
    reporter = ProgressReporter(events.append, tool_call_id="c5", tool="search")

    reporter.step("Searching")
    reporter.progress(1, 3)
    reporter.progress(2, 3, "Fetched page 2")
    reporter.complete("Done")
    reporter.error("Timed out")

    assert events == [
        ToolProgress(tool_call_id="c5", tool="search", phase="step", message="Searching"),
        ToolProgress(
            tool_call_id="c5", tool="search", phase="progress", message="1/3", current=1, total=3
        ),
        ToolProgress(
            tool_call_id="c5",
            tool="search",
            phase="progress",
            message="Fetched page 2",
            current=2,
            total=3,
        ),
        ToolProgress(tool_call_id="c5", tool="search", phase="complete", message="Done"),
        ToolProgress(tool_call_id="c5", tool="search", phase="error", message="Timed out"),
    ]


async def test_reporting_from_another_thread_is_delivered_on_the_routers_loop() -> None:
    loop_thread = threading.get_ident()
    delivered_on: list[int] = []

    def sink(event: ToolProgress) -> None:
        delivered_on.append(threading.get_ident())

    reporter = ProgressReporter(sink, tool_call_id="c6", tool="slow")
    await asyncio.to_thread(reporter.step, "working")
    await asyncio.sleep(0)

    assert delivered_on == [loop_thread]


def test_get_reporter_returns_a_silent_reporter_when_none_was_passed() -> None:
    configs: list[dict[str, Any] | None] = [
        None,
        {},
        {"configurable": {}},
        {"configurable": {"progress": "not one"}},
    ]
    for config in configs:
        reporter = get_reporter(config)
        assert not reporter.enabled
        reporter.step("ignored")


def test_progress_config_keeps_the_callers_other_settings() -> None:
    reporter = ProgressReporter.noop()

    config = progress_config(reporter, {"tags": ["t"], "configurable": {"thread_id": "x"}})

    assert config["tags"] == ["t"]
    assert config["configurable"] == {"thread_id": "x", "progress": reporter}
    assert get_reporter(config) is reporter


# --- get_time ---------------------------------------------------------------------------

MOMENT = datetime(2024, 7, 1, 12, 30, 5, tzinfo=UTC)


@pytest.mark.parametrize(
    ("timezone", "expected"),
    [
        ("UTC", "2024-07-01T12:30:05+00:00 (Monday, UTC)"),
        ("utc", "2024-07-01T12:30:05+00:00 (Monday, UTC)"),
        ("GMT", "2024-07-01T12:30:05+00:00 (Monday, UTC)"),
        ("Etc/UTC", "2024-07-01T12:30:05+00:00 (Monday, Etc/UTC, UTC)"),
        ("EST", "2024-07-01T07:30:05-05:00 (Monday, EST)"),
        ("Europe/Paris", "2024-07-01T14:30:05+02:00 (Monday, Europe/Paris, CEST)"),
        ("europe/paris", "2024-07-01T14:30:05+02:00 (Monday, Europe/Paris, CEST)"),
        ("Asia/Tokyo", "2024-07-01T21:30:05+09:00 (Monday, Asia/Tokyo, JST)"),
        ("America/Los_Angeles", "2024-07-01T05:30:05-07:00 (Monday, America/Los_Angeles, PDT)"),
    ],
)
def test_current_time_is_given_in_the_requested_zone(timezone: str, expected: str) -> None:
    assert current_time(timezone, now=MOMENT) == expected


@pytest.mark.parametrize(
    "timezone", ["Mars/Olympus_Mons", "", "../../etc/passwd", "America", "x" * 200]
)
def test_an_unknown_timezone_is_rejected(timezone: str) -> None:
    with pytest.raises(UnknownTimezoneError, match="unknown time zone"):
        resolve_timezone(timezone)


@pytest.mark.parametrize(
    ("place", "zone"),
    [
        ("Tokyo", "Asia/Tokyo"),
        ("tokyo", "Asia/Tokyo"),
        ("New York", "America/New_York"),
        ("new  york", "America/New_York"),
        ("New_York", "America/New_York"),
        ("Port-au-Prince", "America/Port-au-Prince"),
        ("Reykjavik", "Atlantic/Reykjavik"),
        # A place with two names in the database gets the shorter: the same clock.
        ("Buenos Aires", "America/Buenos_Aires"),
        ("Indianapolis", "America/Indianapolis"),
        # Not places: a zone of another area, an offset, an area, nothing.
        ("Japan", None),
        ("Pacific", None),
        ("GMT+5", None),
        ("Europe", None),
        ("Atlantis", None),
        ("", None),
    ],
)
def test_a_zone_is_found_by_the_place_it_is_named_after(place: str, zone: str | None) -> None:
    assert zone_for_place(place) == zone


async def test_get_time_tool_defaults_to_utc_now() -> None:
    before = datetime.now(UTC).replace(microsecond=0)

    text = await get_time.ainvoke({})

    stamp = datetime.fromisoformat(text.split(" ")[0])
    assert text.endswith(", UTC)")
    assert "UTC, UTC" not in text
    assert before <= stamp <= datetime.now(UTC)


async def test_get_time_tool_returns_a_clear_error_for_a_bad_timezone() -> None:
    call = {
        "name": "get_time",
        "args": {"timezone": "Nowhere/City"},
        "id": "t1",
        "type": "tool_call",
    }

    message = await get_time.ainvoke(call)

    assert message.status == "error"
    assert "unknown time zone 'Nowhere/City'" in message.content


def test_default_tools_need_no_other_service() -> None:
    tools = default_tools()

    assert [t.name for t in tools] == [
        "calculator",
        "get_time",
        "save_note",
        "list_notes",
        "delete_note",
        "set_timer",
        "list_timers",
        "cancel_timer",
    ]
    assert default_tools() is not tools


# -- a free-text argument (worker/tools/texts.py) ----------------------------------------------


def test_a_text_argument_is_folded_and_kept_within_its_bound() -> None:
    assert folded_text("  Ada \n\t Lovelace ", "the query", 12) == "Ada Lovelace"
    with pytest.raises(ToolException) as empty:
        folded_text(" \n ", "the query", 12)
    assert str(empty.value) == "Error: the query is empty"
    with pytest.raises(ToolException) as long:
        folded_text("Ada  Lovelace!", "the search", 12)
    assert str(long.value) == "Error: the search is longer than 12 characters"
