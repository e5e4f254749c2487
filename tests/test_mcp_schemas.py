"""An MCP server's tool schemas are anyone's: a schema the router cannot bind costs its own
tool alone, and no pattern of one holds a loop, in the worker (the router's arguments) or in
the API (a user's edited arguments). A real API and worker, and a real MCP server (`shady`,
built with the official SDK) whose tools' schemas are made to be bad.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

import httpx
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations
from pydantic import Field

from cli.client import Api
from cli.doctor import run_checks
from shared.settings import Settings
from tests.support.serving import serve
from tests.support.sse import frames, of
from tests.support.stack import Stack, make_settings, run_stack
from tests.support.upstream import Reply, ScriptedUpstream, last_user_text
from tests.support.users import ALICE, BOB, keys_for_two
from tests.test_mcp import offered, servers_in
from tests.worker.test_plex import ask, chat, paused

CHAT = "/v1/chat/completions"

READ = ToolAnnotations(readOnlyHint=True)
WRITE = ToolAnnotations(readOnlyHint=False, destructiveHint=False)
# Backtracking makes each character more double the time `re` takes to refuse a string of
# a's and one other character: 26 of them took about 2 s of a loop.
CATASTROPHIC = r"^(a+)+$"
BAD = "a" * 26 + "!"
# The schemas `shady` lists for two of its tools instead of the SDK's own: a `$ref` that
# names nothing, and one that names another document.
BROKEN = {
    "lookup": {"type": "object", "properties": {"where": {"$ref": "#/$defs/nothing"}}},
    "fetch": {"type": "object", "properties": {"where": {"$ref": "https://example.com/a.json"}}},
}


class ListedSchemas:
    """A server middleware listing `schemas` as the input schemas of the tools they name."""

    def __init__(self, schemas: dict[str, dict[str, Any]]) -> None:
        self.schemas = schemas

    async def __call__(self, ctx: ServerRequestContext[Any], call_next: CallNext) -> HandlerResult:
        result = await call_next(ctx)
        if ctx.method == "tools/list" and isinstance(result, dict):
            for tool in result.get("tools", []):
                tool["inputSchema"] = self.schemas.get(tool["name"], tool["inputSchema"])
        return result


def shady(listed: dict[str, dict[str, Any]]) -> MCPServer:
    """`lamp`, `lookup` and `fetch` that read, `tag` that reads and `rename` that writes (a
    label matching `CATASTROPHIC`), each listed with the SDK's schema or its own in `listed`."""
    mcp = MCPServer("shady", middleware=[ListedSchemas(listed)])

    @mcp.tool(annotations=READ)
    def lamp() -> str:
        """Turn the lamp on."""
        return "on"

    @mcp.tool(annotations=READ)
    def lookup(where: str) -> str:
        """Look a place up."""
        return where

    @mcp.tool(annotations=READ)
    def fetch(where: str) -> str:
        """Fetch a place."""
        return where

    @mcp.tool(annotations=READ)
    def tag(label: Annotated[str, Field(pattern=CATASTROPHIC)]) -> str:
        """Tag the lamp."""
        return f"tagged {label}"

    @mcp.tool(annotations=WRITE)
    def rename(label: Annotated[str, Field(pattern=CATASTROPHIC)]) -> str:
        """Rename the lamp."""
        return f"renamed {label}"

    return mcp


def settings_for(tmp_path: Path, upstream: ScriptedUpstream, port: int) -> Settings:
    path = tmp_path / f"mcp-{uuid.uuid4().hex[:6]}.json"
    server = {"url": f"http://127.0.0.1:{port}/mcp", "trust_hints": True}
    path.write_text(json.dumps({"mcpServers": {"shady": server}}))
    return make_settings(upstream, mcp_config=str(path), api_keys=keys_for_two())


@contextlib.asynccontextmanager
async def shady_stack(
    tmp_path: Path, upstream: ScriptedUpstream, listed: dict[str, dict[str, Any]] | None = None
) -> AsyncIterator[Stack]:
    """Alice's and bob's stack with `shady` (its tools listed with the schemas of `listed`,
    or its own) as its one MCP server."""
    async with (
        serve(shady(listed or {}).streamable_http_app()) as port,
        run_stack(settings_for(tmp_path, upstream, port)) as stack,
    ):
        await offered(stack, "shady__lamp")
        yield stack


UNUSABLE = (
    "2 tools left out, the input schema unusable: lookup (not a schema Bernard can check: "
    "Pointer '/$defs/nothing' does not exist), fetch (not a schema Bernard can check: "
    "Resource 'https://example.com/a.json' is not present in a registry and retrieving it "
    "failed: Retrieval is disabled, cannot fetch https://example.com/a.json)"
)


async def test_a_tool_whose_schema_the_router_cannot_bind_is_left_out_alone_saying_so(
    tmp_path: Path, upstream: ScriptedUpstream
) -> None:
    """Before, the router bound every tool and LangChain's `dereference_refs` raised for the
    whole request: every turn of every user ended `internal_error`."""
    async with shady_stack(tmp_path, upstream, BROKEN) as stack:
        tools = await offered(stack, "shady__lamp")
        (health,) = await servers_in(stack, "ready", "shady")
        status = (await stack.client.get("/v1/status", headers=ALICE)).json()
        api = Api(stack.base_url, "key-alice")
        try:
            checks = await asyncio.to_thread(run_checks, api, None, None, lambda _: None)
        finally:
            api.http.close()
        upstream.script_router(Reply.tool_calls([("shady__lamp", {})]))
        upstream.script(Reply.text("The lamp is on."))
        events, said = await ask(stack, "chat", "lamp on, please")
    assert sorted(name for name in tools if name.startswith("shady__")) == [
        "shady__lamp",
        "shady__rename",
        "shady__tag",
    ]
    assert health["warnings"] == [UNUSABLE]
    assert status["mcp_servers"][0]["warnings"] == [UNUSABLE]
    (doctor,) = [(c.status, c.detail) for c in checks if c.name == "MCP shady"]
    assert doctor == ("warn", f"ready on 1 worker: 3 tools; {UNUSABLE}")
    (result,) = of(events, "tool_result")
    assert (result["content"], result["is_error"]) == ("on", False)
    assert said == "The lamp is on."
    bound = [t["function"]["name"] for t in upstream.router_requests[0]["tools"]]
    assert "shady__lamp" in bound and "shady__lookup" not in bound


async def round_trips(client: httpx.AsyncClient, until: asyncio.Task[Any]) -> list[float]:
    """`/healthz`'s round trips one after the other, 10 ms apart, until `until` is done: each
    with the pause after it, so that a loop held during a pause counts too."""
    took: list[float] = []
    while not until.done():
        started = time.monotonic()
        assert (await client.get("/healthz")).status_code == 200
        await asyncio.sleep(0.01)
        took.append(time.monotonic() - started)
    return took


async def test_edited_arguments_against_a_catastrophic_pattern_hold_no_neighbour(
    tmp_path: Path, upstream: ScriptedUpstream
) -> None:
    """The API checks a user's edited arguments against the tool's schema off its loop:
    `/healthz` answers as it does at rest while they are checked (2.2 s on the loop
    before, each character more doubling it)."""
    async with shady_stack(tmp_path, upstream) as stack:
        upstream.script_router(Reply.tool_calls([("shady__rename", {"label": "aaa"})]))
        conversation_id, proposal = await paused(stack, "conversation", "rename the lamp")
        body = {
            "confirmation_id": proposal["confirmation_id"],
            "decision": "approve",
            "arguments": {"label": BAD},
        }
        url = f"/v1/conversations/{conversation_id}/resume"
        resumed = asyncio.create_task(stack.client.post(url, json=body, headers=ALICE))
        took = await round_trips(stack.client, resumed)
        refused = await resumed
    print(f"\n/healthz beside the edit's check: max {max(took) * 1000:.0f} ms of {len(took)}")
    assert max(took) < 0.5
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == (
        f'arguments.label: "{BAD}" does not match "^(a+)+$"'
    )


async def first_and_gaps(
    client: httpx.AsyncClient, started: asyncio.Event
) -> tuple[float, list[float]]:
    """Bob's streamed turn: his first token's time, and the gaps between his tokens after
    it (`started` is set once it came)."""
    began = time.monotonic()
    came: list[float] = []
    async with client.stream("POST", CHAT, json=chat("bob streams"), headers=BOB) as response:
        assert response.status_code == 200, await response.aread()
        async for frame in frames(response):
            if frame.content:
                came.append(time.monotonic())
                started.set()
    return came[0] - began, [b - a for a, b in itertools.pairwise(came)]


async def test_the_routers_arguments_against_a_catastrophic_pattern_hold_no_neighbour(
    tmp_path: Path, upstream: ScriptedUpstream
) -> None:
    """The worker checks the router's arguments off its loop: bob's tokens, paced 20 ms,
    keep coming while alice's call is checked (2.2 s apart before)."""
    paced = Reply.text(["tick"] * 100, chunk_delay=0.02)
    upstream.responder = lambda body: paced if "bob" in last_user_text(body) else upstream.default
    async with shady_stack(tmp_path, upstream) as stack:
        bobs_first = asyncio.Event()
        bob = asyncio.create_task(first_and_gaps(stack.client, bobs_first))
        await asyncio.wait_for(bobs_first.wait(), 10)
        upstream.script_router(Reply.tool_calls([("shady__tag", {"label": BAD})]))
        events, _ = await ask(stack, "chat", "tag the lamp")
        first, gaps = await bob
    print(
        f"\nbob beside alice's check: first token {first * 1000:.0f} ms, max gap "
        f"{max(gaps) * 1000:.0f} ms"
    )
    assert max(gaps) < 0.5
    (result,) = of(events, "tool_result")
    assert (result["content"], result["is_error"]) == (
        f"Error: invalid arguments for tool 'shady__tag': arguments.label: \"{BAD}\" does not "
        'match "^(a+)+$"',
        True,
    )


async def test_a_clients_function_with_a_ref_that_names_nothing_is_a_400(
    tmp_path: Path, upstream: ScriptedUpstream
) -> None:
    """Before, the turn was admitted and its model refused the tools mid-way."""
    async with shady_stack(tmp_path, upstream) as stack:
        tool = {"type": "function", "function": {"name": "find", "parameters": BROKEN["lookup"]}}
        body = {"model": "bernard-v1", "messages": [{"role": "user", "content": "hi"}]}
        chat_refused = await stack.client.post(CHAT, json={**body, "tools": [tool]}, headers=ALICE)
        responses_refused = await stack.client.post(
            "/v1/responses",
            json={
                "model": "bernard-v1",
                "input": "hi",
                "tools": [{"type": "function", "name": "find", "parameters": BROKEN["fetch"]}],
            },
            headers=ALICE,
        )
    assert chat_refused.status_code == 400
    assert chat_refused.json()["error"]["message"] == (
        "function 'find': not a schema Bernard can check: Pointer '/$defs/nothing' does not exist"
    )
    assert chat_refused.json()["error"]["param"] == "tools[0].function.parameters"
    assert responses_refused.status_code == 400
    assert responses_refused.json()["error"]["param"] == "tools[0].parameters"
    assert upstream.requests == [] and upstream.router_requests == []
