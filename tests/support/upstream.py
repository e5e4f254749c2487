"""A scripted OpenAI-compatible Chat Completions server for tests.

`ScriptedUpstream` serves the real wire format (JSON and SSE, text and tool calls) over real
HTTP on loopback, inside the test's own event loop, so a test can point `ChatOpenAI` at it and
steer it with asyncio primitives::

    async with ScriptedUpstream() as upstream:
        upstream.script(Reply.text("Hello world"))
        gate = upstream.script(Reply.text("first second", block_after=1))
        llm = ChatOpenAI(base_url=upstream.base_url, api_key="test", stream_usage=True)
        ...
        await gate.wait_blocked()  # the server has sent "first" and is holding the rest
        gate.release()

Replies are consumed one per chat-completion request, FIFO; with none queued the `responder`
(if any) decides, else the `default` reply answers. Every request is recorded as an `Exchange`
with its body and timings, including when its client disconnected before the stream ended.

Bernard's router is a second caller with its own script: a request offering the `respond`
tool (or opening with the router's prompt) is answered from `script_router()` replies, then
by `router_responder`, and by default with a `respond` call that reports zero tokens. So a
test about the answer scripts only the answer, and its token counts are the answer's. Router
requests are logged apart, in `router_exchanges` / `router_requests`; `exchanges` and
`requests` hold the others::

    upstream.script_router(Reply.tool_calls([("calculator", {"expression": "6*7"})]))
    upstream.script(Reply.text("It is 42."))  # after the calculator ran, the router responds

The same server speaks Anthropic's Messages API at `POST /v1/messages` (point Anthropic
clients at `anthropic_base_url`): the same scripts, sent as Anthropic's event sequence
(`message_start`, `content_block_start`, `content_block_delta` with `text_delta` and
`input_json_delta`, `content_block_stop`, `message_delta`, `message_stop`), a tool call's
input split over `arg_chunks` deltas, `max_tokens` honoured with `stop_reason: max_tokens`.
The shape follows Anthropic's streaming documentation
(https://docs.anthropic.com/en/docs/build-with-claude/streaming).

The OpenAI SDK retries 408/409/429/5xx and dropped connections by default: build clients with
`max_retries=0` when scripting errors, or each retry consumes another scripted reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

Body = dict[str, Any]
Responder = Callable[[Body], "Reply"]
# (name, arguments): a dict is sent as its JSON; a string is sent as is (e.g. broken JSON).
ToolCallSpec = tuple[str, dict[str, Any] | str]

ROUTER_TOOL = "respond"

FINGERPRINT = "fp_scripted"


def split_tokens(text: str) -> list[str]:
    """Split text into word tokens with their leading whitespace; joining them gives `text`."""
    tokens = re.findall(r"\s*\S+", text)
    rest = text[len("".join(tokens)) :]
    if rest:
        tokens.append(rest)
    return tokens


def _peer(request: Request) -> str:
    client = request.client
    return f"{client.host}:{client.port}" if client else ""


def last_user_text(body: Body) -> str:
    """The text of the last `user` message in a request body ("" when there is none)."""
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                texts = [p.get("text", "") for p in content if isinstance(p, dict)]
                if not any(texts) and any(p.get("type") == "tool_result" for p in content):
                    continue  # Anthropic's tool results travel as user messages
                return "".join(texts)
            return str(content or "")
    return ""


def requests_for(upstream: ScriptedUpstream, content: str) -> int:
    """How many upstream calls a turn with this prompt has made."""
    return sum(last_user_text(request) == content for request in upstream.requests)


def tool_names(body: Body) -> list[str]:
    """The names of the function tools a request offers (OpenAI's or Anthropic's shape)."""
    tools = body.get("tools") or []
    return [t["function"]["name"] if "function" in t else t.get("name", "") for t in tools]


# How Bernard's router prompt opens (worker/harness/router.py `ROUTER_PROMPT`).
ROUTER_PROMPT_START = "You are the router of Bernard"


def is_router_request(body: Body) -> bool:
    """Whether a request is Bernard's router asking: it offers the `respond` tool, or (when
    a client's `tool_choice: "required"` withholds it) opens with the router's prompt."""
    if ROUTER_TOOL in tool_names(body):
        return True
    system = body.get("system")  # Anthropic's
    if system is None and body.get("messages"):
        first = body["messages"][0]
        system = first.get("content") if first.get("role") == "system" else None
    if isinstance(system, list):
        system = "".join(part.get("text", "") for part in system if isinstance(part, dict))
    return isinstance(system, str) and system.startswith(ROUTER_PROMPT_START)


def _arguments(args: dict[str, Any] | str) -> str:
    return args if isinstance(args, str) else json.dumps(args)


def echo_tokens(text: str, count: int = 200) -> list[str]:
    """`count` tokens derived only from `text`: concurrent streams get distinct, checkable text."""
    words = text.split() or ["echo"]
    return [f"{'' if i == 0 else ' '}{words[i % len(words)]}{i}" for i in range(count)]


def echo_responder(count: int = 200, chunk_delay: float = 0.0) -> Responder:
    """A responder answering each request with `echo_tokens(last user message, count)`."""
    return lambda body: Reply.text(
        echo_tokens(last_user_text(body), count), chunk_delay=chunk_delay
    )


@dataclass(eq=False)
class Reply:
    """One scripted answer; build it with `text`, `tool_calls`, `error` or `slow`.

    `first_delay` is a model's time to its first token: a stream sends nothing for that
    long, and a whole answer comes that much later. `block_after=k` streams k pieces
    (tokens or tool-call fragments) and then holds the stream until `release()`;
    `fail_after=k` drops the connection after k pieces; `end_after=k` ends an OpenAI
    stream cleanly after k pieces, with no finish, usage or `[DONE]`: a body cut at an
    event boundary. A reply is also its own gate: the object `script` returns is the one
    to `release()`.
    """

    tokens: list[str] = field(default_factory=list)
    calls: list[ToolCallSpec] = field(default_factory=list)
    call_ids: list[str] | None = None
    arg_chunks: int = 3
    chunk_delay: float = 0.0
    first_delay: float = 0.0
    status: int = 200
    error_body: Body | None = None
    block_after: int | None = None
    fail_after: int | None = None
    end_after: int | None = None
    forever: bool = False
    usage: tuple[int, int] | None = None
    _gate: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    _blocked: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @classmethod
    def text(
        cls,
        content: str | Sequence[str],
        *,
        chunk_delay: float = 0.0,
        block_after: int | None = None,
        block_after_first: bool = False,
        fail_after: int | None = None,
        end_after: int | None = None,
        usage: tuple[int, int] | None = None,
    ) -> Reply:
        """A text answer; a string is split with `split_tokens`, a sequence is used as is."""
        tokens = split_tokens(content) if isinstance(content, str) else list(content)
        return cls(
            tokens=tokens,
            chunk_delay=chunk_delay,
            block_after=1 if block_after_first else block_after,
            fail_after=fail_after,
            end_after=end_after,
            usage=usage,
        )

    @classmethod
    def tool_calls(
        cls,
        calls: Sequence[ToolCallSpec],
        *,
        content: str = "",
        ids: Sequence[str] | None = None,
        arg_chunks: int = 3,
        chunk_delay: float = 0.0,
        block_after: int | None = None,
        fail_after: int | None = None,
        usage: tuple[int, int] | None = None,
    ) -> Reply:
        """Tool calls (name, arguments), each call's arguments JSON streamed in `arg_chunks`."""
        return cls(
            tokens=split_tokens(content),
            calls=list(calls),
            call_ids=list(ids) if ids is not None else None,
            arg_chunks=max(1, arg_chunks),
            chunk_delay=chunk_delay,
            block_after=block_after,
            fail_after=fail_after,
            usage=usage,
        )

    @classmethod
    def respond(cls, *, usage: tuple[int, int] | None = (0, 0)) -> Reply:
        """The router's "ready to answer" call; by default it reports no tokens."""
        return cls.tool_calls([(ROUTER_TOOL, {})], usage=usage)

    @classmethod
    def error(
        cls, status: int, message: str, *, error_type: str = "server_error", code: str | None = None
    ) -> Reply:
        """An HTTP error with an OpenAI error body, sent before any streaming."""
        error = {"message": message, "type": error_type, "param": None, "code": code}
        return cls(status=status, error_body={"error": error})

    @classmethod
    def slow(cls, interval: float = 0.01, token: str = " tick") -> Reply:
        """Streams `token` every `interval` seconds until the client disconnects."""
        return cls(tokens=[token], chunk_delay=interval, forever=True)

    def release(self) -> None:
        """Let a blocked stream continue (also releases streams that have not blocked yet)."""
        self._gate.set()

    @property
    def blocked(self) -> bool:
        """Whether a stream of this reply has reached its `block_after` point."""
        return self._blocked.is_set()

    async def wait_blocked(self, timeout_s: float = 5.0) -> None:
        """Wait until the server has streamed the first `block_after` pieces and is holding."""
        async with asyncio.timeout(timeout_s):
            await self._blocked.wait()

    @property
    def finish_reason(self) -> str:
        """The finish reason: "tool_calls" when the reply calls tools, else "stop"."""
        return "tool_calls" if self.calls else "stop"

    def deltas(self, ids: Sequence[str]) -> Iterator[Body]:
        """The streamed `delta` objects after the role delta (infinite for `slow`)."""
        tokens: Iterator[str] = itertools.cycle(self.tokens) if self.forever else iter(self.tokens)
        for token in tokens:
            yield {"content": token}
        for index, ((name, args), call_id) in enumerate(zip(self.calls, ids, strict=True)):
            head = {"index": index, "id": call_id, "type": "function"}
            yield {"tool_calls": [{**head, "function": {"name": name, "arguments": ""}}]}
            for fragment in _fragments(_arguments(args), self.arg_chunks):
                yield {"tool_calls": [{"index": index, "function": {"arguments": fragment}}]}


def _fragments(text: str, parts: int) -> list[str]:
    size = max(1, -(-len(text) // parts))
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


class _AbortStream(Exception):
    """Raised mid-stream so uvicorn drops the connection, as a crashed upstream would."""


class _HideAborts(logging.Filter):
    """Keeps uvicorn's traceback for a scripted connection drop out of the test log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], _AbortStream))


@dataclass(eq=False)
class Exchange:
    """One chat-completion request and what the server did with it (monotonic times)."""

    index: int
    body: Body
    reply: Reply
    started_at: float
    # The client's address ("host:port"): the same for calls made over one kept-alive
    # connection.
    peer: str = ""
    chunks_sent: int = 0
    first_chunk_at: float | None = None
    completed_at: float | None = None
    disconnected_at: float | None = None
    failed_at: float | None = None

    @property
    def stream(self) -> bool:
        """Whether the client asked for a stream."""
        return bool(self.body.get("stream"))

    @property
    def model(self) -> str:
        """The model the client asked for."""
        return str(self.body.get("model", ""))

    @property
    def messages(self) -> list[Body]:
        """The request's messages."""
        return list(self.body.get("messages") or [])

    @property
    def tools(self) -> list[Body]:
        """The request's tools ([] without tools)."""
        return list(self.body.get("tools") or [])

    @property
    def ended(self) -> bool:
        """Whether the response is over: completed, dropped by the client, or failed on purpose."""
        return any(t is not None for t in (self.completed_at, self.disconnected_at, self.failed_at))


class _SSEResponse(StreamingResponse):
    """Streams SSE while watching the connection, so a disconnect is seen even mid-block."""

    def __init__(
        self, events: AsyncIterator[bytes], exchange: Exchange, notify: Callable[[], None]
    ) -> None:
        super().__init__(events, media_type="text/event-stream")
        self.exchange = exchange
        self.notify = notify

    def _disconnected(self) -> None:
        ex = self.exchange
        if ex.completed_at is None and ex.failed_at is None and ex.disconnected_at is None:
            ex.disconnected_at = time.monotonic()
            self.notify()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def pump() -> None:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for data in self.body_iterator:
                await send({"type": "http.response.body", "body": data, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            self._disconnected()

        tasks = [asyncio.create_task(pump()), asyncio.create_task(watch())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            outcome = (await asyncio.gather(*tasks, return_exceptions=True))[0]
        if isinstance(outcome, OSError):
            self._disconnected()
        elif isinstance(outcome, Exception):
            raise outcome


class _InLoopServer(uvicorn.Server):
    """A uvicorn server that leaves the process's signal handlers alone."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class ScriptedUpstream:
    """An OpenAI-compatible server on 127.0.0.1 answering from a script; async context manager."""

    def __init__(
        self,
        *,
        default: Reply | None = None,
        responder: Responder | None = None,
        models: Sequence[str] = ("gpt-4o-mini",),
        router_responder: Responder | None = None,
    ) -> None:
        self.default = default or Reply.text("Hello from the scripted upstream.")
        self.responder = responder
        self.router_responder = router_responder
        self.models = list(models)
        self.exchanges: list[Exchange] = []
        self.router_exchanges: list[Exchange] = []
        self._queue: deque[Reply] = deque()
        self._router_queue: deque[Reply] = deque()
        self._call_ids = itertools.count(1)
        self._changed = asyncio.Event()
        self._closing = False
        self._port: int | None = None
        self._server: _InLoopServer | None = None
        self._task: asyncio.Task[None] | None = None
        self._log_filter = _HideAborts()
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/messages", self._messages, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
            ]
        )

    @property
    def base_url(self) -> str:
        """The `base_url` for OpenAI clients, e.g. "http://127.0.0.1:PORT/v1"."""
        if self._port is None:
            raise RuntimeError("ScriptedUpstream is not running")
        return f"http://127.0.0.1:{self._port}/v1"

    @property
    def anthropic_base_url(self) -> str:
        """The `base_url` for Anthropic clients (they add `/v1/messages` themselves)."""
        return self.base_url.removesuffix("/v1")

    @property
    def requests(self) -> list[Body]:
        """Every chat-completion request body received, in arrival order."""
        return [ex.body for ex in self.exchanges]

    @property
    def router_requests(self) -> list[Body]:
        """Every router request body (those offering `respond`), in arrival order."""
        return [ex.body for ex in self.router_exchanges]

    @property
    def pending(self) -> int:
        """How many scripted replies are still queued."""
        return len(self._queue)

    @property
    def router_pending(self) -> int:
        """How many scripted router replies are still queued."""
        return len(self._router_queue)

    def script(self, reply: Reply) -> Reply:
        """Queue `reply` for the next unanswered request; returns it (it is also the gate)."""
        self._queue.append(reply)
        return reply

    def script_router(self, reply: Reply) -> Reply:
        """Queue `reply` for the next router request (one offering `respond`); returns it."""
        self._router_queue.append(reply)
        return reply

    async def wait_router_requests(self, count: int = 1, timeout_s: float = 5.0) -> list[Body]:
        """Wait until at least `count` router requests have arrived."""
        await self.wait_until(lambda: len(self.router_exchanges) >= count, timeout_s)
        return self.router_requests

    async def wait_requests(self, count: int = 1, timeout_s: float = 5.0) -> list[Body]:
        """Wait until at least `count` requests have arrived."""
        await self.wait_until(lambda: len(self.exchanges) >= count, timeout_s)
        return self.requests

    async def wait_disconnect(self, index: int | None = None, timeout_s: float = 5.0) -> Exchange:
        """Wait until exchange `index` (default: any) loses its client before the stream ends."""

        def found() -> Exchange | None:
            candidates = self.exchanges if index is None else self.exchanges[index : index + 1]
            return next((ex for ex in candidates if ex.disconnected_at is not None), None)

        return await self.wait_until(found, timeout_s)

    async def wait_ended(self, index: int = -1, timeout_s: float = 5.0) -> Exchange:
        """Wait until exchange `index` (default: the latest, once one exists) is over."""
        await self.wait_requests(1 if index < 0 else index + 1, timeout_s)
        return await self.wait_until(lambda: (ex := self.exchanges[index]).ended and ex, timeout_s)

    async def wait_until(self, predicate: Callable[[], Any], timeout_s: float) -> Any:
        async with asyncio.timeout(timeout_s):
            while True:
                changed = self._changed
                if result := predicate():
                    return result
                await changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def __aenter__(self) -> ScriptedUpstream:
        config = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=0,
            log_config=None,
            log_level="warning",
            access_log=False,
            lifespan="off",
            ws="none",
            timeout_graceful_shutdown=2,
        )
        self._server = _InLoopServer(config)
        logging.getLogger("uvicorn.error").addFilter(self._log_filter)
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError("the scripted upstream exited during startup")
            await asyncio.sleep(0.005)
        self._port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        # Free held and endless streams first, or uvicorn waits on them during shutdown.
        self._closing = True
        for ex in [*self.exchanges, *self.router_exchanges]:
            ex.reply.release()
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            try:
                await asyncio.wait_for(self._task, timeout=10)
            finally:
                logging.getLogger("uvicorn.error").removeFilter(self._log_filter)
        self._port = None

    def _next_reply(self, body: Body) -> Reply:
        if is_router_request(body):
            if self._router_queue:
                return self._router_queue.popleft()
            if self.router_responder is not None:
                return self.router_responder(body)
            return Reply.respond()
        if self._queue:
            return self._queue.popleft()
        if self.responder is not None:
            return self.responder(body)
        return self.default

    async def _models(self, request: Request) -> Response:
        data = [
            {"id": m, "object": "model", "created": 0, "owned_by": "scripted"} for m in self.models
        ]
        return JSONResponse({"object": "list", "data": data})

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        reply = self._next_reply(body)
        log = self.router_exchanges if is_router_request(body) else self.exchanges
        ex = Exchange(len(log), body, reply, started_at=time.monotonic(), peer=_peer(request))
        log.append(ex)
        self._notify()
        if reply.error_body is not None:
            ex.completed_at = time.monotonic()
            return JSONResponse(reply.error_body, status_code=reply.status)
        ids = reply.call_ids or [f"call_{next(self._call_ids)}" for _ in reply.calls]
        if ex.stream:
            return _SSEResponse(self._events(ex, ids), ex, self._notify)
        return JSONResponse(await self._completion(ex, ids))

    async def _hold(self, ex: Exchange) -> None:
        ex.reply._blocked.set()
        self._notify()
        await ex.reply._gate.wait()

    def _fail(self, ex: Exchange) -> None:
        ex.failed_at = time.monotonic()
        self._notify()
        raise _AbortStream(f"scripted failure of exchange {ex.index}")

    def _usage(self, ex: Exchange, completion: int) -> Body:
        prompt = 3 + sum(
            4 + len(split_tokens(json.dumps(m.get("content") or ""))) for m in ex.messages
        )
        if ex.reply.usage is not None:
            prompt, completion = ex.reply.usage
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    async def _completion(self, ex: Exchange, ids: Sequence[str]) -> Body:
        reply = ex.reply
        if reply.first_delay:
            await asyncio.sleep(reply.first_delay)
        if reply.block_after is not None:
            await self._hold(ex)
        if reply.fail_after is not None:
            self._fail(ex)  # before the response starts: uvicorn answers a bare 500
        message: Body = {"role": "assistant", "content": "".join(reply.tokens) or None}
        if reply.calls:
            message["tool_calls"] = [
                {"id": i, "type": "function", "function": {"name": n, "arguments": _arguments(a)}}
                for (n, a), i in zip(reply.calls, ids, strict=True)
            ]
        choice = {"index": 0, "message": message, "logprobs": None}
        ex.completed_at = time.monotonic()
        self._notify()
        return {
            "id": f"chatcmpl-scripted-{ex.index}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": ex.model,
            "system_fingerprint": FINGERPRINT,
            "choices": [{**choice, "finish_reason": reply.finish_reason}],
            "usage": self._usage(ex, len(list(reply.deltas(ids))) if not reply.forever else 1),
        }

    async def _events(self, ex: Exchange, ids: Sequence[str]) -> AsyncIterator[bytes]:
        reply = ex.reply
        include_usage = bool((ex.body.get("stream_options") or {}).get("include_usage"))
        head = {
            "id": f"chatcmpl-scripted-{ex.index}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": ex.model,
            "system_fingerprint": FINGERPRINT,
        }

        def event(
            delta: Body | None, finish: str | None = None, usage: Body | None = None
        ) -> bytes:
            choices = (
                []
                if delta is None
                else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
            )
            chunk = {**head, "choices": choices}
            if include_usage:
                chunk["usage"] = usage
            return b"data: " + json.dumps(chunk).encode() + b"\n\n"

        role: Body = {"role": "assistant", "content": None if reply.calls else ""}
        if reply.first_delay:
            await asyncio.sleep(reply.first_delay)
        yield event(role)
        # As OpenAI does: at most `max_completion_tokens` (or `max_tokens`) tokens, and a
        # `length` finish when the answer was cut.
        limit = ex.body.get("max_completion_tokens") or ex.body.get("max_tokens")
        finish = reply.finish_reason
        for delta in reply.deltas(ids):
            if limit is not None and ex.chunks_sent >= limit:
                finish = "length"
                break
            if ex.chunks_sent == reply.block_after:
                await self._hold(ex)
            if ex.chunks_sent == reply.fail_after:
                self._fail(ex)
            if ex.chunks_sent == reply.end_after:
                break
            if reply.forever and self._closing:
                break
            yield event(delta)
            ex.chunks_sent += 1
            if ex.first_chunk_at is None:
                ex.first_chunk_at = time.monotonic()
                self._notify()
            await asyncio.sleep(reply.chunk_delay)
        if reply.block_after is not None and reply.block_after >= ex.chunks_sent:
            await self._hold(ex)
        if reply.fail_after is not None:
            self._fail(ex)
        if reply.end_after is not None:
            ex.completed_at = time.monotonic()
            self._notify()
            return
        yield event({}, finish)
        if include_usage:
            yield event(None, usage=self._usage(ex, ex.chunks_sent))
        yield b"data: [DONE]\n\n"
        ex.completed_at = time.monotonic()
        self._notify()

    # -- Anthropic's Messages API ----------------------------------------------------------

    async def _messages(self, request: Request) -> Response:
        body = await request.json()
        reply = self._next_reply(body)
        log = self.router_exchanges if is_router_request(body) else self.exchanges
        ex = Exchange(len(log), body, reply, started_at=time.monotonic(), peer=_peer(request))
        log.append(ex)
        self._notify()
        if reply.error_body is not None:
            ex.completed_at = time.monotonic()
            message = reply.error_body["error"]["message"]
            error = {"type": "error", "error": {"type": "api_error", "message": message}}
            return JSONResponse(error, status_code=reply.status)
        ids = reply.call_ids or [f"toolu_{next(self._call_ids):024d}" for _ in reply.calls]
        if ex.stream:
            return _SSEResponse(self._anthropic_events(ex, ids), ex, self._notify)
        return JSONResponse(await self._anthropic_message(ex, ids))

    def _anthropic_usage(self, ex: Exchange, completion: int) -> Body:
        prompt = self._usage(ex, completion)["prompt_tokens"]
        if ex.reply.usage is not None:
            prompt, completion = ex.reply.usage
        return {"input_tokens": prompt, "output_tokens": completion}

    def _stop_reason(self, reply: Reply, cut: bool) -> str:
        return "max_tokens" if cut else "tool_use" if reply.calls else "end_turn"

    async def _anthropic_message(self, ex: Exchange, ids: Sequence[str]) -> Body:
        reply = ex.reply
        if reply.block_after is not None:
            await self._hold(ex)
        if reply.fail_after is not None:
            self._fail(ex)
        content: list[Body] = []
        if reply.tokens:
            content.append({"type": "text", "text": "".join(reply.tokens)})
        for (name, args), call_id in zip(reply.calls, ids, strict=True):
            arguments = json.loads(args) if isinstance(args, str) else args
            content.append({"type": "tool_use", "id": call_id, "name": name, "input": arguments})
        ex.completed_at = time.monotonic()
        self._notify()
        return {
            "id": f"msg_scripted_{ex.index}",
            "type": "message",
            "role": "assistant",
            "model": ex.model,
            "content": content,
            "stop_reason": self._stop_reason(reply, cut=False),
            "stop_sequence": None,
            "usage": self._anthropic_usage(ex, len(reply.tokens) + len(reply.calls)),
        }

    async def _anthropic_events(self, ex: Exchange, ids: Sequence[str]) -> AsyncIterator[bytes]:
        reply = ex.reply

        def event(kind: str, **data: Any) -> bytes:
            return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()

        async def piece(data: bytes) -> bytes:
            """Gate one content piece as the OpenAI stream does: hold, fail, pace."""
            if ex.chunks_sent == reply.block_after:
                await self._hold(ex)
            if ex.chunks_sent == reply.fail_after:
                self._fail(ex)
            return data

        message: Body = {
            "id": f"msg_scripted_{ex.index}",
            "type": "message",
            "role": "assistant",
            "model": ex.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {**self._anthropic_usage(ex, 1), "output_tokens": 1},
        }
        yield event("message_start", message=message)
        limit = ex.body.get("max_tokens")
        cut = False
        block = 0
        if reply.tokens:
            text_block: Body = {"type": "text", "text": ""}
            yield event("content_block_start", index=block, content_block=text_block)
            yield event("ping")
            tokens: Iterator[str] = (
                itertools.cycle(reply.tokens) if reply.forever else iter(reply.tokens)
            )
            for token in tokens:
                if limit is not None and ex.chunks_sent >= limit:
                    cut = True
                    break
                if reply.forever and self._closing:
                    break
                delta = {"type": "text_delta", "text": token}
                yield await piece(event("content_block_delta", index=block, delta=delta))
                ex.chunks_sent += 1
                if ex.first_chunk_at is None:
                    ex.first_chunk_at = time.monotonic()
                    self._notify()
                await asyncio.sleep(reply.chunk_delay)
            yield event("content_block_stop", index=block)
            block += 1
        for (name, args), call_id in zip(reply.calls, ids, strict=True):
            tool_block: Body = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
            yield event("content_block_start", index=block, content_block=tool_block)
            for fragment in _fragments(_arguments(args), reply.arg_chunks):
                delta = {"type": "input_json_delta", "partial_json": fragment}
                yield await piece(event("content_block_delta", index=block, delta=delta))
                ex.chunks_sent += 1
                await asyncio.sleep(reply.chunk_delay)
            yield event("content_block_stop", index=block)
            block += 1
        if reply.block_after is not None and reply.block_after >= ex.chunks_sent:
            await self._hold(ex)
        if reply.fail_after is not None:
            self._fail(ex)
        stop = {"stop_reason": self._stop_reason(reply, cut), "stop_sequence": None}
        # The API's final usage is cumulative: input tokens too, not only the output.
        yield event("message_delta", delta=stop, usage=self._anthropic_usage(ex, ex.chunks_sent))
        yield event("message_stop")
        ex.completed_at = time.monotonic()
        self._notify()
