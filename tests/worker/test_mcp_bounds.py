"""What one MCP server may publish (worker/tools/mcp/bounds.py): each tool's description and
input schema, its count of tools and their total, a tool over any of them left out."""

from __future__ import annotations

from typing import Any

from mcp.types import Tool

from worker.tools.mcp.bounds import Bounds, Listing, size


def tool(name: str, schema_bytes: int = 0, description: str = "Does it.") -> Tool:
    """A tool whose input schema, as JSON, is about `schema_bytes` long (its one property's
    description fills it)."""
    schema: dict[str, Any] = {"type": "object", "properties": {}}
    if schema_bytes:
        schema["properties"]["text"] = {"type": "string", "description": "d" * schema_bytes}
    return Tool(name=name, description=description, inputSchema=schema)


def names(listing: Listing) -> list[str]:
    return [t.name for t in listing.tools]


def test_a_tools_size_is_its_description_as_offered_and_its_schema_as_json() -> None:
    small = tool("small")
    # '{"type":"object","properties":{}}' (34) and "Does it. (from the MCP server “files”)"
    # (37 characters, the quotes 3 bytes each: 41).
    assert size(small, "files") == 34 + 41
    # A description is offered cut at 1,000 characters: what is cut costs nothing.
    assert size(tool("long", description="word " * 100_000), "files") < 1_100


def test_a_tool_over_its_bound_is_left_out_and_the_others_are_offered() -> None:
    listing = Listing(Bounds(tool_max_bytes=1_000), "files")
    listing.add([tool("a"), tool("huge", 5_000), tool("b", 800), tool("vast", 2_000_000)])
    assert names(listing) == ["a", "b"]
    huge, vast = size(tool("huge", 5_000), "files"), size(tool("vast", 2_000_000), "files")
    assert listing.warnings() == [
        "2 tools left out, each over BERNARD_MCP_TOOL_MAX_BYTES (1000 bytes of description "
        f"and input schema): huge ({huge} bytes), vast ({vast} bytes)"
    ]


def test_a_server_publishes_at_most_its_count_of_tools_and_its_total_of_bytes() -> None:
    each = size(tool("t00", 500), "files")
    assert each == 616
    listing = Listing(Bounds(tool_max_bytes=1_000, max_tools=8, max_bytes=3 * each + 100), "files")
    # Pages as they come: the bounds hold across them.
    listing.add([tool(f"t{n:02d}", 500) for n in range(2)])
    listing.add([tool(f"t{n:02d}", 500) for n in range(2, 5)] + [tool("tiny")])
    assert names(listing) == ["t00", "t01", "t02", "tiny"]
    assert listing.warnings() == [
        "2 tools left out past BERNARD_MCP_SERVER_MAX_BYTES (1948 bytes of descriptions and "
        "input schemas in all): t03, t04"
    ]
    counted = Listing(Bounds(max_tools=3), "files")
    counted.add([tool(f"t{n:02d}") for n in range(12)])
    assert names(counted) == ["t00", "t01", "t02"]
    assert counted.warnings() == [
        "9 tools left out past BERNARD_MCP_SERVER_MAX_TOOLS (3 tools): t03, t04, t05, t06, "
        "t07 and 4 more"
    ]


def test_within_every_bound_nothing_is_said() -> None:
    listing = Listing(Bounds(), "files")
    listing.add([tool("a", 1_000), tool("b")])
    assert (names(listing), listing.warnings()) == (["a", "b"], [])
