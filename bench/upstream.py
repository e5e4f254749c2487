"""The benchmark's model: the tests' scripted OpenAI-compatible upstream, in its own process.

`python -m bench.upstream` serves `tests.support.upstream.ScriptedUpstream` on a free loopback
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
    "bench t=<tag> mode=clock n=20 d=25 f=200 tool=calculator"
                                          a real model's clock: nothing for `f` ms (its
                                          time to first token), then a piece every `d` ms,
                                          text and tool-call arguments alike, about 4
                                          characters each (`clock_reply`)

A router call (a request offering the `respond` tool) is answered with a `respond` tool
call, so the turn goes straight on to the response model (on the clock: with the tool call
beside it when `tool` is set, as a router that follows its prompt does). A summary call (the
worker's summary prompt) whose messages carry `SLOW_SUMMARY` is answered after
`SLOW_SUMMARY_S`, as a slow upstream would (the noisy-neighbour measurement); any other at
once.

Besides the OpenAI routes it answers `GET /bench/calls?tag=<tag>`: how many model calls
carried the tag, and whether one carried tool results; `GET /bench/exchange?tag=<tag>&wait=<s>`:
the timings of the latest streamed exchange whose message carries the tag, and of its router
call (monotonic clock, which on Linux is system-wide, so the benchmark process can compare
it with its own), waiting up to `wait` seconds for the streamed exchange to end; and
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
from tests.support.upstream import (
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
    # On the clock: the time to the first token, and the tool the first call calls.
    first_ms: float = 0.0
    tool: str = ""

    def message(self) -> str:
        """The user message that carries this directive."""
        text = f"bench t={self.tag} mode={self.mode} n={self.tokens} d={self.delay_ms:g}"
        if self.first_ms:
            text += f" f={self.first_ms:g}"
        return f"{text} tool={self.tool}" if self.tool else text

    def expected_tokens(self) -> list[str]:
        """The tokens an `echo` (or `clock`) reply streams for this directive, in order."""
        if self.mode == "clock":
            return clock_tokens(self.tokens)
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
        first_ms=float(fields.get("f", "0")),
        tool=fields.get("tool", ""),
    )


# What a clock turn's tool call asks of the calculator, and how many characters a piece of
# text or of a call's arguments carries (a token of a real model's, about).
CLOCK_ARGUMENTS = {"expression": "6 * 7"}
_CHARS_PER_TOKEN = 4


def clock_tokens(count: int) -> list[str]:
    """The answer a clock reply streams: `count` tokens of 4 characters."""
    return ["Sure"] + [f" t{i % 100:02d}" for i in range(1, count)]


def carries_tool_results(body: Body) -> bool:
    """Whether a request carries tool results after its last user message."""
    messages = body.get("messages") or []
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    return any(m.get("role") == "tool" for m in messages[last_user + 1 :])


def clock_reply(body: Body, wanted: Directive) -> Reply:
    """A real model's answer on its clock: the directive's tool called first when it is
    offered and has not answered yet (with `respond` beside it for a router), then the
    text; a router offered no such tool calls `respond` alone."""
    offered = tool_names(body)
    answered = carries_tool_results(body)
    calls: list[tuple[str, dict[str, Any] | str]] = []
    if wanted.tool in offered and not answered:
        calls.append((wanted.tool, CLOCK_ARGUMENTS))
    if "respond" in offered and (calls or answered or wanted.tool not in offered):
        calls.append(("respond", {}))
    tick = wanted.delay_ms / 1000
    if calls:
        size = len(orjson.dumps(CLOCK_ARGUMENTS))
        reply = Reply.tool_calls(calls, arg_chunks=-(-size // _CHARS_PER_TOKEN), chunk_delay=tick)
    else:
        reply = Reply.text(clock_tokens(wanted.tokens), chunk_delay=tick)
    reply.first_delay = wanted.first_ms / 1000
    if not body.get("stream"):
        # A whole answer comes once the model would have written it all.
        pieces = sum(1 for _ in reply.deltas([""] * len(reply.calls)))
        reply.first_delay += pieces * tick
    return reply


def route(body: Body) -> Reply:
    """The scripted answer to a router's request (one offering `respond`)."""
    wanted = directive(last_user_text(body))
    if wanted is not None and wanted.mode == "clock":
        return clock_reply(body, wanted)
    return Reply.respond()


def respond(body: Body) -> Reply:
    """The scripted answer to any other chat-completion request."""
    wanted = directive(last_user_text(body))
    if wanted is not None and wanted.mode == "clock":
        return clock_reply(body, wanted)
    messages = body.get("messages") or []
    if messages and messages[0].get("content") == SUMMARY_PROMPT:
        reply = Reply.text(["They", " talked."], block_after=0)
        slow = SLOW_SUMMARY in str(messages[-1].get("content"))
        asyncio.get_running_loop().call_later(SLOW_SUMMARY_S if slow else 0, reply.release)
        return reply
    if wanted is None:
        return Reply.text(echo_tokens(last_user_text(body), 200))
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
        self.upstream = ScriptedUpstream(responder=respond, router_responder=route)
        inner = self.upstream.app
        self.upstream.app = Starlette(
            routes=[
                Route("/bench/exchange", self._exchange, methods=["GET"]),
                Route("/bench/calls", self._calls, methods=["GET"]),
                Route("/bench/reset", self._reset, methods=["POST"]),
                *inner.routes,
            ]
        )
        self._by_tag: dict[str, Exchange] = {}
        self._router_by_tag: dict[str, Exchange] = {}
        self._calls_by_tag: dict[str, int] = {}
        self._results_by_tag: set[str] = set()
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
                    self._calls_by_tag[wanted.tag] = self._calls_by_tag.get(wanted.tag, 0) + 1
                    if carries_tool_results(ex.body):
                        self._results_by_tag.add(wanted.tag)
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
            found = await self.upstream.wait_until(ended, wait_s) if wait_s > 0 else self._find(tag)
        except TimeoutError:
            found = self._find(tag)
        router = self._router_by_tag.get(tag)
        body = {
            "stream": _exchange_json(found) if found else None,
            "router": _exchange_json(router) if router else None,
        }
        return Response(orjson.dumps(body), media_type="application/json")

    async def _calls(self, request: Request) -> Response:
        """`{"calls": n, "tool_results": bool}`: the model calls whose last user message
        carries the tag, and whether one of them carried tool results (a tool ran)."""
        self._index()
        tag = request.query_params.get("tag", "")
        found = {
            "calls": self._calls_by_tag.get(tag, 0),
            "tool_results": tag in self._results_by_tag,
        }
        return Response(orjson.dumps(found), media_type="application/json")

    async def _reset(self, request: Request) -> Response:
        """Forget recorded exchanges, so a long run does not keep them all, and take the
        full collection that was held (bench/gc_hold.py): the load generator asks between
        measurements."""
        for log in (self.upstream.exchanges, getattr(self.upstream, "router_exchanges", [])):
            log[:] = [ex for ex in log if not ex.ended]
        self._by_tag = {}
        self._router_by_tag = {}
        self._calls_by_tag = {}
        self._results_by_tag = set()
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
