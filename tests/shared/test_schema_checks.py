"""Schemas from outside, and arguments against them, checked in a child process with a time
bound (shared/schema_checks.py): what each check answers, and that a check that takes the
child its whole time holds no loop.

The child is real (`python -m shared.schema_checks`), one per test module."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from shared.schema_checks import Invalid, SchemaChecks, Unusable, Usable, where

# One child for the module's checks (it takes about 0.6 s to start).
module_loop = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def checks() -> AsyncIterator[SchemaChecks]:
    made = SchemaChecks()
    try:
        yield made
    finally:
        await made.close()


def deep(depth: int) -> Any:
    """A value nested `depth` lists deep."""
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    return value


def doubling(depth: int) -> dict[str, Any]:
    """A schema of 2 KB whose `$ref`s LangChain inlines to 2^depth copies of a leaf."""
    defs: dict[str, Any] = {"A0": {"type": "string"}}
    for n in range(1, depth + 1):
        child = {"$ref": f"#/$defs/A{n - 1}"}
        defs[f"A{n}"] = {"type": "object", "properties": {"x": child, "y": child}}
    return {"type": "object", "properties": {"a": {"$ref": f"#/$defs/A{depth}"}}, "$defs": defs}


# Each branch fails and both are tried, at every level: 2^depth steps.
BRANCHING = {
    "$defs": {
        "S": {
            "anyOf": [
                {"type": "array", "items": {"$ref": "#/$defs/S"}},
                {"type": "array", "items": {"$ref": "#/$defs/S"}, "minItems": 0},
            ]
        }
    },
    "$ref": "#/$defs/S",
}
TOOK_TOO_LONG = Unusable("checking it took over 1 s")
TOOK_TOO_MUCH = Unusable("the process checking it ended (it needed too much memory)")
CANNOT = "not a schema Bernard can check: "

SCHEMAS: list[tuple[Any, Unusable | None]] = [
    ({"type": "object", "properties": {"a": {"type": "string"}}}, None),
    (True, None),
    (
        {"type": "object", "properties": {"a": {"$ref": "#/$defs/nothing"}}},
        Unusable(CANNOT + "Pointer '/$defs/nothing' does not exist"),
    ),
    (
        {"properties": {"a": {"$ref": "https://example.com/a.json"}}},
        Unusable(
            CANNOT + "Resource 'https://example.com/a.json' is not present in a registry and "
            "retrieving it failed: Retrieval is disabled, cannot fetch https://example.com/a.json"
        ),
    ),
    (
        {"properties": {"a": {"$ref": "file:///etc/passwd"}}},
        Unusable(
            CANNOT + "Resource 'file:///etc/passwd' is not present in a registry and retrieving "
            "it failed: Retrieval is disabled, cannot fetch file:///etc/passwd"
        ),
    ),
    (
        {"type": "strng"},
        Unusable(
            CANNOT + "\"strng\" is not valid under any of the schemas listed in the 'anyOf' keyword"
        ),
    ),
    ({"type": "string", "pattern": "(a"}, Unusable(CANNOT + '"(a" is not a "regex"')),
    ('{"type": "object"}', Unusable(CANNOT + "a schema is a JSON object (or true or false)")),
]


@pytest.mark.parametrize(("schema", "verdict"), SCHEMAS)
@module_loop
async def test_a_schema_is_usable_when_it_compiles_with_every_ref_found_in_it(
    checks: SchemaChecks, schema: Any, verdict: Unusable | None
) -> None:
    assert await checks.schema(schema) == verdict


TOOLS: list[tuple[dict[str, Any], Usable | Unusable]] = [
    # '{"type":"object","properties":{"a":{"type":"string"}}}': titles go, as LangChain
    # offers a schema, and so do `$defs` once inlined.
    ({"type": "object", "properties": {"a": {"type": "string", "title": "A"}}}, Usable(54)),
    (
        {
            "type": "object",
            "properties": {"a": {"$ref": "#/$defs/s"}},
            "$defs": {"s": {"type": "string"}},
        },
        Usable(54),
    ),
    # A `$ref` jsonschema-rs resolves and LangChain does not.
    (
        {
            "type": "object",
            "properties": {"a": {"$ref": "#/$defs/a~1b"}},
            "$defs": {"a/b": {"type": "string"}},
        },
        Unusable("the router cannot offer it: KeyError: \"Reference '#/$defs/a~1b' not found.\""),
    ),
    (
        {"type": "object", "properties": {"a": {"$ref": "#/$defs/x"}}},
        Unusable(CANNOT + "Pointer '/$defs/x' does not exist"),
    ),
    # 1,307 bytes as the server sent it, 60,411 as the model would be offered it.
    (doubling(10), Usable(60_411)),
]


@pytest.mark.parametrize(("schema", "verdict"), TOOLS)
@module_loop
async def test_a_tool_is_checked_as_a_model_is_offered_it(
    checks: SchemaChecks, schema: dict[str, Any], verdict: Usable | Unusable
) -> None:
    assert await checks.tool("t", "Does it.", schema) == verdict


def patterned(pattern: str) -> dict[str, Any]:
    return {"type": "object", "properties": {"a": {"type": "string", "pattern": pattern}}}


ARGUMENTS: list[tuple[Any, Any, Invalid | Unusable | None]] = [
    (
        {"type": "object", "properties": {"entity": {"type": "string"}}},
        {"entity": 7},
        Invalid(("entity",), '7 is not of type "string"'),
    ),
    (
        {"type": "object", "properties": {"n": {"type": "array", "items": {"type": "integer"}}}},
        {"n": [1, "two"]},
        Invalid(("n", 1), '"two" is not of type "integer"'),
    ),
    ({"type": "object", "required": ["a"]}, {}, Invalid((), '"a" is a required property')),
    (patterned("^light\\.[a-z_]+$"), {"a": "light.porch"}, None),
    # Catastrophic for a backtracking engine (2^41 steps), linear here.
    (
        patterned("^(a+)+$"),
        {"a": "a" * 40 + "!"},
        Invalid(("a",), f'"{"a" * 40}!" does not match "^(a+)+$"'),
    ),
    # A lookahead backtracks within jsonschema-rs's limit, then is refused saying so.
    (
        patterned("^(a|aa)+(?=!)$"),
        {"a": "a" * 60 + "?"},
        Invalid(("a",), "Error executing regex: Max limit for backtracking count exceeded"),
    ),
    # A long value is quoted cut.
    (
        {"type": "object", "properties": {"a": {"type": "integer"}}},
        {"a": "b" * 1000},
        Invalid(("a",), '"' + "b" * 298 + "…"),
    ),
    ({"$ref": "#/$defs/x"}, {}, Unusable(CANNOT + "Pointer '/$defs/x' does not exist")),
    # A model's arguments may nest deeper than a request's body may.
    (True, deep(300), Unusable("it cannot be written as JSON: Recursion limit reached")),
]


@pytest.mark.parametrize(("schema", "arguments", "verdict"), ARGUMENTS)
@module_loop
async def test_arguments_are_checked_against_a_schema_within_the_time_bound(
    checks: SchemaChecks, schema: Any, arguments: Any, verdict: Invalid | Unusable | None
) -> None:
    assert await checks.arguments(schema, arguments) == verdict


@pytest.mark.parametrize(
    ("path", "said"),
    [
        ((), "arguments"),
        (("lights", 2, "name"), "arguments.lights[2].name"),
        ((0,), "arguments[0]"),
    ],
)
def test_where_names_a_place_inside_the_arguments(path: tuple[str | int, ...], said: str) -> None:
    assert where(path) == said


@module_loop
async def test_arguments_whose_errors_branch_without_end_are_refused_within_the_bound(
    checks: SchemaChecks,
) -> None:
    """Gathering the errors of 2^30 branches: the child runs out of its time or of its
    memory, whichever comes first, and the next check is answered by a child afresh."""
    started = time.monotonic()
    verdict = await checks.arguments(BRANCHING, deep(30))
    assert verdict in (TOOK_TOO_LONG, TOOK_TOO_MUCH)
    assert time.monotonic() - started < 2.0
    again = await checks.arguments(patterned("^a$"), {"a": "b"})
    assert again == Invalid(("a",), '"b" does not match "^a$"')


@module_loop
async def test_a_check_that_takes_its_whole_time_holds_no_loop(checks: SchemaChecks) -> None:
    """The child inlines a schema's `$ref`s to 2^18 copies for 1 s and is killed; the loop
    ticks every 10 ms meanwhile."""
    await checks.schema(True)  # the child is up
    gaps: list[float] = []

    async def tick() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticking = asyncio.create_task(tick())
    started = time.monotonic()
    try:
        verdict = await checks.tool("deep", "Does it.", doubling(18))
    finally:
        took = time.monotonic() - started
        ticking.cancel()
    assert verdict == TOOK_TOO_LONG
    assert 1.0 <= took < 2.0
    assert max(gaps) < 0.2, f"the loop stalled {max(gaps) * 1000:.0f} ms"


@module_loop
async def test_a_cancelled_check_leaves_the_next_one_its_own_answer(checks: SchemaChecks) -> None:
    slow = asyncio.create_task(checks.arguments(BRANCHING, deep(30)))
    await asyncio.sleep(0.3)
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await slow
    assert await checks.arguments(patterned("^a$"), {"a": "a"}) is None
