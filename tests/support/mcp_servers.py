"""Two real MCP servers, built with the official SDK, for the MCP client's tests
(tests/test_mcp.py):

- `home`, over streamable HTTP behind a bearer token, speaking the 2025 protocol (the
  initialize handshake; `server/discover` is an unknown method to it) as Home Assistant's
  MCP server does: lights to read and set, a door to unlock, progress while it counts
  (and as fast as it can), an error result, a call that waits (and says when it was
  cancelled), an event log as long as asked for, and a tool that adds a tool
  (`notifications/tools/list_changed`).
- `files`, over stdio (a child of the worker), on the SDK's defaults (it speaks the 2026
  protocol too; its tool list changes reach `subscriptions/listen`): files to read (with
  progress) and delete, a file as long as asked for, a wait, the process id, and a tool
  that crashes the process mid-call.

Each server appends every call it runs, as a JSON line `{"tool": ..., "arguments": ...,
"pid": ...}`, to the file `--seen` names, so a test can tell what reached it and when. `home`
can also run inside the test's own loop (`home(seen).streamable_http_app()`).

    python tests/support/mcp_servers.py http --port 8123 --token secret --seen /tmp/seen.jsonl
    python tests/support/mcp_servers.py stdio --seen /tmp/seen.jsonl [--stay-down]
"""

from __future__ import annotations

import argparse
import json
import os
import zlib
from pathlib import Path
from typing import Any

import anyio
import uvicorn
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp.types import METHOD_NOT_FOUND, ToolAnnotations
from starlette.types import ASGIApp, Receive, Scope, Send

READ = ToolAnnotations(readOnlyHint=True)
WRITE = ToolAnnotations(readOnlyHint=False, destructiveHint=False)
DESTRUCTIVE = ToolAnnotations(readOnlyHint=False, destructiveHint=True)


class Seen:
    """The file each call is written to, one JSON line per call, before it runs."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def __call__(self, tool: str, **arguments: Any) -> None:
        line = json.dumps({"tool": tool, "arguments": arguments, "pid": os.getpid()})
        with self.path.open("a") as out:
            out.write(line + "\n")


def read_seen(path: Path) -> list[dict[str, Any]]:
    """Every call a server wrote to `path` (none when it has written nothing)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


class LegacyOnly:
    """Answers `server/discover` as a server of the 2025 protocol does: an unknown method."""

    async def __call__(self, ctx: ServerRequestContext[Any], call_next: CallNext) -> HandlerResult:
        if ctx.method == "server/discover":
            raise MCPError(code=METHOD_NOT_FOUND, message="Method not found")
        return await call_next(ctx)


def home(seen: Seen) -> MCPServer:
    mcp = MCPServer("home", middleware=[LegacyOnly()])
    lights = {"light.kitchen": 0, "light.porch": 0}

    @mcp.tool(annotations=READ)
    def get_light(entity: str) -> str:
        """The brightness of a light (0 is off)."""
        seen("get_light", entity=entity)
        if entity not in lights:
            raise ValueError(f"no light called {entity}")
        return f"{entity} is at {lights[entity]} %"

    @mcp.tool(annotations=WRITE)
    def set_light(entity: str, brightness: int) -> str:
        """Set a light's brightness, 0 to 100."""
        seen("set_light", entity=entity, brightness=brightness)
        lights[entity] = brightness
        return f"{entity} is now at {brightness} %"

    @mcp.tool(annotations=DESTRUCTIVE)
    def unlock_door(door: str) -> str:
        """Unlock a door of the house."""
        seen("unlock_door", door=door)
        return f"The {door} door is unlocked."

    @mcp.tool(annotations=READ)
    async def count_lights(ctx: Context) -> str:
        """Count the lights, one at a time."""
        seen("count_lights")
        for done, entity in enumerate(lights, 1):
            await ctx.report_progress(done, len(lights), f"Looked at {entity}")
            await anyio.sleep(0.05)
        return f"{len(lights)} lights"

    @mcp.tool(annotations=READ)
    async def chatter(times: int, ctx: Context) -> str:
        """Report progress `times` times, as fast as it can."""
        seen("chatter", times=times)
        for done in range(1, times + 1):
            await ctx.report_progress(done, times)
        return f"reported {times} times"

    @mcp.tool(annotations=READ)
    def broken() -> str:
        """Always fails."""
        seen("broken")
        raise ToolError("the light bridge is unplugged")

    @mcp.tool(annotations=READ)
    async def wait(seconds: float) -> str:
        """Wait, then say so."""
        seen("wait", seconds=seconds)
        try:
            await anyio.sleep(seconds)
        except anyio.get_cancelled_exc_class():
            seen("wait cancelled")
            raise
        return f"waited {seconds:g}s"

    @mcp.tool(annotations=READ)
    async def history(lines: int, ctx: Context) -> str:
        """The house's event log, `lines` lines of it (a result as long as one likes, after
        a progress message as long)."""
        seen("history", lines=lines)
        await ctx.report_progress(0, lines, "Reading the event log, line by line; " * 20)
        return "\n".join(f"event {n:06d}: light.porch turned on" for n in range(lines))

    @mcp.tool(annotations=READ)
    async def add_scene(ctx: Context) -> str:
        """Add the tool `movie_scene`."""
        seen("add_scene")

        def movie_scene() -> str:
            """Dim every light for a movie."""
            return "Movie scene on."

        mcp.add_tool(movie_scene, annotations=WRITE)
        await ctx.request_context.session.send_tool_list_changed()
        return "added movie_scene"

    return mcp


def files(seen: Seen) -> MCPServer:
    mcp = MCPServer("files")
    stored = {"notes.txt": "buy milk", "todo.txt": "fix the porch light"}

    @mcp.tool(annotations=READ)
    async def read_file(name: str, ctx: Context) -> str:
        """Read a file."""
        seen("read_file", name=name)
        await ctx.report_progress(1, 2, f"Opening {name}")
        await ctx.report_progress(2, 2, f"Read {name}")
        return stored[name]

    @mcp.tool(annotations=DESTRUCTIVE)
    def delete_file(name: str) -> str:
        """Delete a file."""
        seen("delete_file", name=name)
        del stored[name]
        return f"Deleted {name}."

    @mcp.tool(annotations=READ)
    def pid() -> str:
        """This server's process id."""
        seen("pid")
        return str(os.getpid())

    @mcp.tool(annotations=READ)
    def dump(chars: int) -> str:
        """A file `chars` characters long (an answer one line as long)."""
        seen("dump", chars=chars)
        return "x" * chars

    @mcp.tool(annotations=READ)
    async def nap(seconds: float) -> str:
        """Wait, then say so."""
        seen("nap", seconds=seconds)
        await anyio.sleep(seconds)
        return f"napped {seconds:g}s"

    @mcp.tool(annotations=READ)
    def crash() -> str:
        """Stop this server's process at once."""
        seen("crash")
        os._exit(3)

    @mcp.tool(annotations=READ)
    async def add_tool(ctx: Context) -> str:
        """Add the tool `word_count`."""
        seen("add_tool")

        def word_count(name: str) -> int:
            """How many words a file has."""
            return len(stored[name].split())

        mcp.add_tool(word_count, annotations=READ)
        await ctx.notify_tools_changed()
        return "added word_count"

    return mcp


class BearerToken:
    """Refuses every request without `Authorization: Bearer <token>` (401)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != (
            self.expected
        ):
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"unauthorized"})
            return
        await self.app(scope, receive, send)


class GzipBomb:
    """Answers each `tools/call` of `history` itself: `decoded` bytes of text compressed with
    gzip (a thousandth of that on the wire), as a JSON body or, with `events`, an event
    stream; every other request reaches `app`."""

    def __init__(self, app: ASGIApp, decoded: int, *, events: bool) -> None:
        self.app = app
        self.decoded = decoded
        self.events = events

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        received = [await receive()]
        while received[-1].get("more_body"):
            received.append(await receive())
        body = b"".join(message.get("body", b"") for message in received)
        request = json.loads(body) if body else None
        if not (
            isinstance(request, dict)
            and request.get("method") == "tools/call"
            and request["params"]["name"] == "history"
        ):
            replayed = iter(received)

            async def again() -> Any:
                return next(replayed, None) or await receive()

            await self.app(scope, again, send)
            return
        payload = gzip_bomb(request["id"], self.decoded, events=self.events)
        kind = b"text/event-stream" if self.events else b"application/json"
        headers = [(b"content-type", kind), (b"content-encoding", b"gzip")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


def gzip_bomb(ident: Any, decoded: int, *, events: bool) -> bytes:
    """A JSON-RPC answer to call `ident`, a text of `decoded` bytes, compressed with gzip."""
    before, after = json.dumps(
        {"jsonrpc": "2.0", "id": ident, "result": {"content": [{"type": "text", "text": "@"}]}}
    ).split("@")
    if events:
        before, after = f"event: message\ndata: {before}", f"{after}\n\n"
    packer = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = b"x" * 2**20
    packed = [packer.compress(before.encode())]
    packed += [packer.compress(block) for _ in range(decoded // len(block))]
    packed += [packer.compress(after.encode()), packer.flush()]
    return b"".join(packed)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("transport", choices=["http", "stdio"])
    parser.add_argument("--seen", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token", default="")
    # Once `crash` ran, refuse to start again (a server that stays down).
    parser.add_argument("--stay-down", action="store_true")
    options = parser.parse_args()
    seen = Seen(options.seen)
    if options.stay_down and any(c["tool"] == "crash" for c in read_seen(seen.path)):
        raise SystemExit("crashed before: staying down")
    if options.transport == "stdio":
        files(seen).run("stdio")
        return
    app = BearerToken(home(seen).streamable_http_app(), options.token)
    uvicorn.run(app, host="127.0.0.1", port=options.port, log_level="warning")


if __name__ == "__main__":
    main()
