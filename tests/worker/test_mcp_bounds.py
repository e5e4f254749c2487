"""What one MCP server may publish (worker/tools/mcp/bounds.py): each tool checked, its
description and parameters as offered, its count of tools and their total, a tool over any
of them left out. The checks' verdicts are given here (shared/schema_checks.py makes them:
tests/shared/test_schema_checks.py)."""

from __future__ import annotations

import pytest
from mcp.types import Tool

from shared.schema_checks import Unusable, Usable
from worker.tools.mcp.bounds import Bounds, Listing, arguments_schema, size


def tool(name: str, description: str = "Does it.") -> Tool:
    return Tool(name=name, description=description, inputSchema={"type": "object"})


def names(listing: Listing) -> list[str]:
    return [t.name for t in listing.tools]


def listed(bounds: Bounds, *tools: tuple[str, int | str]) -> Listing:
    """A listing of tools named with their verdicts: the parameters' bytes, or why unusable."""
    listing = Listing(bounds, "files")
    for name, verdict in tools:
        checked = Unusable(verdict) if isinstance(verdict, str) else Usable(verdict)
        listing.add(tool(name), checked if listing.checking else None)
    return listing


def test_a_tools_size_is_its_description_as_offered_and_its_parameters_as_checked() -> None:
    # "Does it. (from the MCP server “files”)": 38 characters, the quotes 3 bytes each.
    assert size(tool("small"), "files", Usable(34)) == 42 + 34
    # A description is offered cut at 1,000 characters: what is cut costs nothing.
    assert size(tool("long", description="word " * 100_000), "files", Usable(0)) < 1_100


@pytest.mark.parametrize(
    ("given", "offered"),
    [
        ({}, {"type": "object", "properties": {}}),
        (
            {"type": "object", "required": ["a"]},
            {"type": "object", "required": ["a"], "properties": {}},
        ),
    ],
)
def test_a_tools_parameters_are_an_object_whatever_the_server_sent(
    given: dict[str, object], offered: dict[str, object]
) -> None:
    assert arguments_schema(Tool(name="t", inputSchema=given)) == offered


def test_a_tool_over_its_bound_or_unusable_is_left_out_and_the_others_are_offered() -> None:
    listing = listed(
        Bounds(tool_max_bytes=1_000),
        ("a", 34),
        ("huge", 5_000),
        ("broken", "not a schema Bernard can check: Pointer '/$defs/x' does not exist"),
        ("b", 800),
        ("vast", 2_000_000),
    )
    assert names(listing) == ["a", "b"]
    assert listing.warnings() == [
        "1 tool left out, the input schema unusable: broken (not a schema Bernard can check: "
        "Pointer '/$defs/x' does not exist)",
        "2 tools left out, each over BERNARD_MCP_TOOL_MAX_BYTES (1000 bytes of description "
        "and input schema): huge (5042 bytes), vast (2000042 bytes)",
    ]


def test_a_server_publishes_at_most_its_count_of_tools_and_its_total_of_bytes() -> None:
    each = 42 + 575
    bounded = listed(
        Bounds(tool_max_bytes=1_000, max_tools=8, max_bytes=3 * each + 100),
        *[(f"t{n:02d}", 575) for n in range(5)],
        ("tiny", 34),
    )
    assert names(bounded) == ["t00", "t01", "t02", "tiny"]
    assert bounded.warnings() == [
        "2 tools left out past BERNARD_MCP_SERVER_MAX_BYTES (1951 bytes of descriptions and "
        "input schemas in all): t03, t04"
    ]
    counted = listed(Bounds(max_tools=3), *[(f"t{n:02d}", 34) for n in range(12)])
    assert names(counted) == ["t00", "t01", "t02"]
    assert counted.warnings() == [
        "9 tools left out past BERNARD_MCP_SERVER_MAX_TOOLS (3 tools): t03, t04, t05, t06, "
        "t07 and 4 more"
    ]


def test_no_more_than_twice_the_count_of_tools_is_checked() -> None:
    """A server listing thousands of broken tools costs a bounded number of checks."""
    listing = listed(Bounds(max_tools=2), *[(f"b{n}", "broken") for n in range(5)], ("ok", 34))
    assert (names(listing), listing.checked) == ([], 4)
    assert listing.past_count == ["b4", "ok"]


def test_within_every_bound_nothing_is_said() -> None:
    listing = listed(Bounds(), ("a", 1_000), ("b", 34))
    assert (names(listing), listing.warnings()) == (["a", "b"], [])
