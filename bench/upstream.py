"""The benchmark's model: the tests' scripted OpenAI-compatible upstream, in its own process.

`python -m bench.upstream` serves `tests.upstream.ScriptedUpstream` on a free loopback
port, prints `{"port": N}` on its first stdout line and runs until stdin closes or it is
signalled. It runs in its own process so that the thousands of token chunks it sends do
not share an event loop with the benchmark's client, whose receive timestamps must stay
honest.

What each request gets is steered by its last user message, so the benchmark needs no
side channel to script replies (see `directive`):

    "bench t=<tag> mode=echo n=200 d=0"   200 deterministic tokens (`echo_tokens` of the
                                          message), `d` milliseconds apart
    "bench t=<tag> mode=slow d=10"        " tick" every 10 ms until the client goes away
    "bench t=<tag> mode=hold"             one token, then hold until the client goes away

A router call (a request offering the `respond` tool) is answered with a `respond` tool
call, so the turn goes straight on to the response model. A summary call (the worker's
summary prompt) whose messages carry `SLOW_SUMMARY` is answered after `SLOW_SUMMARY_S`,
as a slow upstream would (the noisy-neighbour measurement); any other at once.

Besides the OpenAI routes it answers `GET /bench/exchange?tag=<tag>&wait=<s>`: the timings
of the latest streamed exchange whose message carries the tag, and of its router call
(monotonic clock, which on Linux is system-wide, so the benchmark process can compare it
with its own), waiting up to `wait` seconds for the streamed exchange to end; and
`POST /bench/reset`: forget the exchanges that ended, and take the full collection the
process holds while it serves (bench/gc_hold.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from bench.gc_hold import collect_held, hold_full_collections
from tests.upstream import (
    Body,
    Exchange,
    Reply,
    ScriptedUpstream,
    echo_tokens,
    last_user_text,
    tool_names,
)
from worker.summaries import SUMMARY_PROMPT

_FIELD = re.compile(r"\b([a-z]+)=(\S+)")
# A summary call whose transcript holds this word takes `SLOW_SUMMARY_S` to answer.
SLOW_SUMMARY = "slow-summary"
SLOW_SUMMARY_S = 10.0


@dataclass(frozen=True, slots=True)
class Directive:
    """What the benchmark asks of the upstream for one turn."""

    tag: str
    mode: str = "echo"
    tokens: int = 200
    delay_ms: float = 0.0

    def message(self) -> str:
        """The user message that carries this directive."""
        return f"bench t={self.tag} mode={self.mode} n={self.tokens} d={self.delay_ms:g}"

    def expected_tokens(self) -> list[str]:
        """The tokens an `echo` reply streams for this directive, in order."""
        return echo_tokens(self.message(), self.tokens)


def directive(text: str) -> Directive | None:
    """Parse a directive out of a user message; None when it carries none."""
    if not text.startswith("bench "):
        return None
    fields = dict(_FIELD.findall(text))
    return Directive(
        tag=fields.get("t", ""),
        mode=fields.get("mode", "echo"),
        tokens=int(fields.get("n", "200")),
        delay_ms=float(fields.get("d", "0")),
    )


def respond(body: Body) -> Reply:
    """The scripted answer to one chat-completion request."""
    if "respond" in tool_names(body):
        return Reply.tool_calls([("respond", {})])
    messages = body.get("messages") or []
    if messages and messages[0].get("content") == SUMMARY_PROMPT:
        reply = Reply.text(["They", " talked."], block_after=0)
        slow = SLOW_SUMMARY in str(messages[-1].get("content"))
        asyncio.get_running_loop().call_later(SLOW_SUMMARY_S if slow else 0, reply.release)
        return reply
    text = last_user_text(body)
    wanted = directive(text)
    if wanted is None:
        return Reply.text(echo_tokens(text, 200))
    if wanted.mode == "slow":
        return Reply.slow(interval=max(wanted.delay_ms, 1.0) / 1000)
    if wanted.mode == "hold":
        return Reply.text([" held", " never"], block_after=1)
    return Reply.text(wanted.expected_tokens(), chunk_delay=wanted.delay_ms / 1000)


def _exchange_json(ex: Exchange) -> dict[str, Any]:
    return {
        "index": ex.index,
        "started_at": ex.started_at,
        "first_chunk_at": ex.first_chunk_at,
        "completed_at": ex.completed_at,
        "disconnected_at": ex.disconnected_at,
        "failed_at": ex.failed_at,
        "chunks_sent": ex.chunks_sent,
    }


class BenchUpstream:
    """A `ScriptedUpstream` answering by directive, plus the `/bench` inspection route."""

    def __init__(self) -> None:
        self.upstream = ScriptedUpstream(responder=respond)
        inner = self.upstream.app
        self.upstream.app = Starlette(
            routes=[
                Route("/bench/exchange", self._exchange, methods=["GET"]),
                Route("/bench/reset", self._reset, methods=["POST"]),
                *inner.routes,
            ]
        )
        self._by_tag: dict[str, Exchange] = {}
        self._router_by_tag: dict[str, Exchange] = {}
        self._indexed = 0
        self._rindexed = 0

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[ScriptedUpstream]:
        """Serve on a free loopback port, full collections held: each reset takes one."""
        async with self.upstream as upstream:
            hold_full_collections()
            yield upstream

    def _index(self) -> None:
        for log, by_tag, done in (
            (self.upstream.exchanges, self._by_tag, "_indexed"),
            (getattr(self.upstream, "router_exchanges", []), self._router_by_tag, "_rindexed"),
        ):
            for ex in log[getattr(self, done) :]:
                wanted = directive(last_user_text(ex.body))
                if wanted is not None:
                    # The router's request is not streamed; the response model's is.
                    (by_tag if ex.stream else self._router_by_tag)[wanted.tag] = ex
            setattr(self, done, len(log))

    def _find(self, tag: str) -> Exchange | None:
        self._index()
        return self._by_tag.get(tag)

    async def _exchange(self, request: Request) -> Response:
        """`{"stream": ..., "router": ...}`: the tag's streamed exchange and its router call."""
        tag = request.query_params.get("tag", "")
        wait_s = float(request.query_params.get("wait", "0"))

        def ended() -> Exchange | None:
            ex = self._find(tag)
            return ex if ex is not None and ex.ended else None

        found: Exchange | None
        try:
            found = await self.upstream._wait(ended, wait_s) if wait_s > 0 else self._find(tag)
        except TimeoutError:
            found = self._find(tag)
        router = self._router_by_tag.get(tag)
        body = {
            "stream": _exchange_json(found) if found else None,
            "router": _exchange_json(router) if router else None,
        }
        return Response(orjson.dumps(body), media_type="application/json")

    async def _reset(self, request: Request) -> Response:
        """Forget recorded exchanges, so a long run does not keep them all, and take the
        full collection that was held (bench/gc_hold.py): the load generator asks between
        measurements."""
        for log in (self.upstream.exchanges, getattr(self.upstream, "router_exchanges", [])):
            log[:] = [ex for ex in log if not ex.ended]
        self._by_tag = {}
        self._router_by_tag = {}
        self._indexed = self._rindexed = 0
        collect_held()
        return Response(b"{}", media_type="application/json")


async def _serve(stop: Callable[[], Awaitable[None]]) -> None:
    async with BenchUpstream().serving() as upstream:
        port = upstream.base_url.rsplit(":", 1)[1].split("/", 1)[0]
        sys.stdout.write(orjson.dumps({"port": int(port)}).decode() + "\n")
        sys.stdout.flush()
        await stop()


async def _until_stopped() -> None:
    loop = asyncio.get_running_loop()
    stopped = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopped.set)
    # Also stop when the parent goes away (its end of our stdin closes).
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    eof = asyncio.create_task(reader.read())
    waiter = asyncio.create_task(stopped.wait())
    await asyncio.wait([eof, waiter], return_when=asyncio.FIRST_COMPLETED)
    for task in (eof, waiter):
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def main() -> None:
    """Entry point of `python -m bench.upstream`."""
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    try:
        import uvloop

        uvloop.run(_serve(_until_stopped))
    except ImportError:  # pragma: no cover - uvloop ships with uvicorn[standard]
        asyncio.run(_serve(_until_stopped))


if __name__ == "__main__":
    main()
