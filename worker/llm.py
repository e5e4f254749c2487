"""The LLM layer: one small interface over a LangChain chat model.

`complete` returns one message with its tool calls; `stream` gives text as it arrives, with
the call's `LlmResult` beside it once the text is out (worker/streamed.py). Aborting is
cancelling: cancelling the task that iterates `stream` closes the upstream HTTP connection.
Upstream failures become `LlmError`, here and only here, so the rest of the worker sees one
exception type.

`build_models` gives the worker its router and response models on upstream HTTP clients
that the worker owns: sized to its concurrency, a few connection pools for many turns
(`pool_shards`), and closed with it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Callable, Iterator, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, cast

import anthropic
import openai
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, ToolCall
from langchain_core.tools import BaseTool
from langchain_openai import ChatOpenAI

from shared.connection import redact
from shared.endings import ENDINGS
from shared.errors import ErrorCode
from shared.settings import Settings
from worker.openai_fast import UpstreamStreamError, openai_complete, openai_tokens
from worker.streamed import Streamed
from worker.upstream_sockets import use_asyncio_sockets

logger = logging.getLogger("bernard.worker")
# Turns in flight per upstream connection pool (`pool_shards`), and the most pools a worker
# keeps.
POOL_SHARE = 64
_MAX_POOLS = 16
# Tool lists a model keeps bound at once (`Llm.bind`).
_BOUND_CACHE = 8


class LlmError(Exception):
    """An upstream model call failed.

    The client sees `code` and `message`: the code's own words (shared/endings.py) and the
    upstream's HTTP status, or Bernard's own account (`shown`: where an upstream that could
    not be reached is), never what the upstream said, which may quote the prompt or the
    upstream's insides. That is `detail`, for the log (with BERNARD_LOG_PROMPTS=1:
    worker/telemetry.py).
    """

    def __init__(
        self,
        detail: str,
        code: ErrorCode = ErrorCode.UPSTREAM_ERROR,
        *,
        status: int | None = None,
        shown: str | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.code = code
        # The upstream's HTTP status, when it answered one (logged: the detail may quote
        # the prompt, the status never does).
        self.status = status
        self.shown = shown

    @property
    def message(self) -> str:
        if self.shown is not None:
            return self.shown
        words = ENDINGS[self.code].message
        return f"{words} (HTTP {self.status})" if self.status is not None else words


@dataclass(slots=True)
class LlmResult:
    """The end of one model call."""

    message: AIMessage
    usage: dict[str, int] | None
    latency_ms: float
    # What the upstream said ended the answer ("stop", "length", ...), when it said.
    finish_reason: str | None = None


def _usage(message: AIMessage | AIMessageChunk) -> dict[str, int] | None:
    meta = message.usage_metadata
    if not meta:
        return None
    return {
        "prompt_tokens": meta["input_tokens"],
        "completion_tokens": meta["output_tokens"],
        "total_tokens": meta["total_tokens"],
    }


# Upstream errors from either SDK; both are generated from the same template, so their
# status and timeout errors have the same shape.
_SDK_ERRORS: tuple[type[Exception], ...] = (openai.APIError, anthropic.APIError)


def _translate(exc: Exception) -> LlmError:
    status = getattr(exc, "status_code", None)
    if status is not None:
        return LlmError(
            f"upstream model returned HTTP {status}: {getattr(exc, 'message', exc)}",
            status=status,
        )
    if "Timeout" in type(exc).__name__:
        return LlmError("upstream model timed out", code=ErrorCode.UPSTREAM_TIMEOUT)
    # A connection that could not be made says where it was going (OPENAI_BASE_URL,
    # ANTHROPIC_BASE_URL), its password hidden: the SDK's own text is only "Connection
    # error.". One that broke off mid-answer was reached, and fails as the fast path does.
    request = getattr(exc, "request", None)
    if request is not None and _never_connected(exc):
        where = f"cannot reach the upstream model at {redact(str(request.url))}: {exc}"
        return LlmError(where, shown=where)
    return LlmError(f"upstream model call failed: {exc}")


def _never_connected(exc: BaseException) -> bool:
    """Whether the HTTP library's ConnectError is behind `exc` (the SDKs, and LangChain
    around them, each wrap it in an error of their own)."""
    cause: BaseException | None = exc
    for _ in range(5):
        if cause is None:
            return False
        if type(cause).__name__ == "ConnectError":
            return True
        cause = cause.__cause__
    return False


# Anthropic's stop reasons in OpenAI's words, which the turn reports.
_FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
}


def _finish_reason(message: AIMessage | AIMessageChunk) -> str | None:
    meta = message.response_metadata
    if meta.get("finish_reason"):
        return str(meta["finish_reason"])
    reason = meta.get("stop_reason")
    return _FINISH_REASONS.get(reason, reason) if reason else None


class Llm:
    """A chat model under one name, called for whole messages or streamed.

    `options` names the call options (`AgentRequest.sampling()`) this provider takes;
    others are dropped rather than sent to an API that would refuse them. A callable
    maps one the provider spells differently (Anthropic's `metadata.user_id` for `user`).
    """

    def __init__(
        self,
        model: BaseChatModel,
        name: str,
        options: Mapping[str, Callable[[Any], tuple[str, Any]] | None] | None = None,
        *,
        direct: bool = False,
        clients: Sequence[Any] = (),
    ) -> None:
        self.model = model
        self.name = name
        self.options = options
        # An OpenAI-compatible model, called on its SDK client without the SDK's request
        # transform and per-chunk models (worker/openai_fast.py). LangChain still builds the
        # request and parses the answer; for every other provider, the whole call is
        # LangChain's.
        self.direct = direct
        # The SDK clients direct calls are spread over (`build_models` says why several),
        # and the calls each has in flight (`_lease`); none: the model's own.
        self._clients = list(clients)
        self._in_flight = [0] * len(self._clients)
        # The model with tools bound, by the tools' identities. A worker binds the same few
        # tool lists on every turn, and binding converts each tool's schema (about 0.45 ms
        # for the default ten, on every router call). The tools are kept with their
        # binding, so no id in a key can be reused while it is cached.
        self._bound: dict[tuple[int, ...], tuple[Sequence[Any], Any]] = {}

    def bind(
        self, tools: Sequence[BaseTool | dict[str, Any]], options: Mapping[str, Any] | None = None
    ) -> Any:
        """The model with `tools` bound (the model itself when there are none); with
        `options` (`tool_choice`, `parallel_tool_calls`: a request's own, like its client
        tools), bound for this call alone, not cached."""
        if not tools:
            return self.model
        if options is not None:
            return self.model.bind_tools(list(tools), **options)
        key = tuple(id(tool) for tool in tools)
        cached = self._bound.get(key)
        if cached is None:
            if len(self._bound) >= _BOUND_CACHE:
                self._bound.pop(next(iter(self._bound)))
            cached = (list(tools), self.model.bind_tools(list(tools)))
            self._bound[key] = cached
        return cached[1]

    @contextlib.contextmanager
    def _lease(self) -> Iterator[Any]:
        """The SDK client for one direct call, held while it runs: the first pool with room
        for another call (`POOL_SHARE`), else the least busy. A worker with few turns calls
        through one pool, whose connections stay alive between turns; taking the pools in
        turn left each idle past the keep-alive, and every call opened a new connection."""
        if not self._clients:
            yield cast(Any, self.model).root_async_client
            return
        busy = self._in_flight
        index = next(
            (i for i, calls in enumerate(busy) if calls < POOL_SHARE),
            min(range(len(busy)), key=busy.__getitem__),
        )
        busy[index] += 1
        try:
            yield self._clients[index]
        finally:
            busy[index] -= 1

    def call_options(self, params: Mapping[str, Any] | None) -> dict[str, Any]:
        """`params` as this provider takes them."""
        if not params:
            return {}
        if self.options is None:
            return dict(params)
        out: dict[str, Any] = {}
        for name, value in params.items():
            if name not in self.options:
                continue
            rename = self.options[name]
            key, mapped = rename(value) if rename is not None else (name, value)
            out[key] = mapped
        return out

    async def complete(
        self,
        messages: Sequence[BaseMessage],
        tools: Sequence[BaseTool | dict[str, Any]] = (),
        options: Mapping[str, Any] | None = None,
    ) -> LlmResult:
        """One call with `tools` bound (with `options`: `bind`); the answer's `tool_calls`
        are already parsed."""
        runnable = self.bind(tools, options)
        started = time.perf_counter()
        try:
            if self.direct:
                bound = runnable.kwargs if tools else {}
                with self._lease() as client:
                    message = await openai_complete(
                        cast(Any, self.model), messages, bound, client=client
                    )
            else:
                message = await runnable.ainvoke(list(messages))
        except _SDK_ERRORS as exc:
            raise _translate(exc) from exc
        except UpstreamStreamError as exc:
            raise LlmError(f"upstream model call failed: {exc}") from exc
        latency_ms = (time.perf_counter() - started) * 1000
        return _result(message, _finish_reason(message), latency_ms)

    def stream(
        self,
        messages: Sequence[BaseMessage],
        params: Mapping[str, Any] | None = None,
        tools: Sequence[BaseTool | dict[str, Any]] = (),
        options: Mapping[str, Any] | None = None,
    ) -> Streamed[str | ToolCall, LlmResult]:
        """Each text delta as it arrives and each tool call once it is whole (`tools` bound
        with `options`, as `complete` binds them); beside them, once they are out, the
        `LlmResult` (the whole message, its tool calls, finish reason and usage).

        `params` are call options (`max_tokens`, `stop`, `temperature`, ...:
        `AgentRequest.sampling()`), passed as this provider takes them (`call_options`).
        """
        runnable = self.bind(tools, options)
        call_options = self.call_options(params)
        if self.direct:
            # What `bind_tools` bound (the tools as the API takes them, the tool choice),
            # then the call options, as `complete` sends them.
            sent = {**(runnable.kwargs if tools else {}), **call_options}
            return Streamed(lambda ended: self._direct_stream(messages, sent, ended))
        return Streamed(
            lambda ended: self._langchain_stream(runnable, messages, call_options, ended)
        )

    async def _langchain_stream(
        self,
        runnable: Any,
        messages: Sequence[BaseMessage],
        call_options: dict[str, Any],
        ended: Callable[[LlmResult], None],
    ) -> AsyncGenerator[str | ToolCall, None]:
        started = time.perf_counter()
        total: AIMessageChunk | None = None
        try:
            # aclosing: leaving early must close the upstream response, not leave it open.
            chunks_gen = cast(
                AsyncGenerator[Any, None],
                runnable.astream(list(messages), **call_options),
            )
            async with aclosing(chunks_gen) as chunks:
                async for chunk in chunks:
                    assert isinstance(chunk, AIMessageChunk)
                    total = chunk if total is None else total + chunk
                    # `.text`: OpenAI streams a string, Anthropic a list of content blocks.
                    if text := chunk.text:
                        yield text
        except _SDK_ERRORS as exc:
            raise _translate(exc) from exc
        message = AIMessage(content=total.text if total else "")
        finish_reason = None
        if total is not None:
            message.usage_metadata = total.usage_metadata
            message.tool_calls = list(total.tool_calls)
            message.invalid_tool_calls = list(total.invalid_tool_calls)
            finish_reason = _finish_reason(total)
        for call in message.tool_calls:
            yield call
        latency_ms = (time.perf_counter() - started) * 1000
        ended(_result(message, finish_reason, latency_ms))

    async def _direct_stream(
        self,
        messages: Sequence[BaseMessage],
        sent: dict[str, Any],
        ended: Callable[[LlmResult], None],
    ) -> AsyncGenerator[str | ToolCall, None]:
        calls: list[ToolCall] = []

        def end(message: AIMessage, finish_reason: str | None, latency_ms: float) -> None:
            calls.extend(message.tool_calls)
            ended(_result(message, finish_reason, latency_ms))

        try:
            with self._lease() as client:
                tokens = openai_tokens(
                    cast(Any, self.model), messages, sent, ended=end, client=client
                )
                async with aclosing(tokens) as texts:
                    async for text in texts:
                        yield text
        except _SDK_ERRORS as exc:
            raise _translate(exc) from exc
        except UpstreamStreamError as exc:
            raise LlmError(f"upstream model call failed: {exc}") from exc
        for call in calls:
            yield call


def _result(message: AIMessage, finish_reason: str | None, latency_ms: float) -> LlmResult:
    return LlmResult(
        message=message, usage=_usage(message), latency_ms=latency_ms, finish_reason=finish_reason
    )


@dataclass(slots=True)
class Models:
    """The worker's two models, and the upstream HTTP clients they use (none offline).
    When the roles share one model (`Settings.roles_share_model`), both are the same `Llm`."""

    router: Llm
    responder: Llm
    http_clients: list[Any] = field(default_factory=list)

    async def aclose(self) -> None:
        for client in self.http_clients:
            await client.aclose()


def build_models(settings: Settings) -> Models:
    """The router and response models, each from its provider (`BERNARD_ROUTER_PROVIDER`,
    `BERNARD_RESPONSE_PROVIDER`), or the offline demo model when no upstream is set."""
    if settings.demo_mode:
        from worker.demo_model import DemoChatModel

        demo = Llm(DemoChatModel(), "bernard-demo")
        return Models(demo, demo)
    # Our own clients rather than the ones the LangChain models cache process-wide: a
    # streaming turn holds one connection, so each pool is sized to the worker's concurrency
    # (the SDKs' default of 1,000 made turns past it wait, silently), and they live and
    # close with the worker rather than outliving the event loop their connections belong
    # to. Built through each SDK's own client class and limits type, so they keep the SDKs'
    # defaults whichever HTTP library the SDKs ship with.
    #
    # OpenAI calls spread over several such clients (`pool_shards`): at every request, as
    # it enters and as it leaves, httpx's pool looks over every connection it holds, about
    # 1.7 µs each. With 200 streaming turns, a router call cost 1,051 µs of worker CPU on
    # one pool and 644 on a pool per 64 turns (docs/benchmarks.md, cost per token).
    clients: dict[str, list[Any]] = {}

    def clients_for(provider: str) -> list[Any]:
        if provider not in clients:
            sdk: Any = anthropic if provider == "anthropic" else openai
            limits = type(sdk.DEFAULT_CONNECTION_LIMITS)(
                max_connections=settings.worker_concurrency,
                max_keepalive_connections=settings.worker_concurrency,
            )
            shards = pool_shards(settings.worker_concurrency) if sdk is openai else 1
            made = [
                sdk.DefaultAsyncHttpxClient(limits=limits, timeout=settings.llm_timeout_s)
                for _ in range(shards)
            ]
            # The OpenAI client's connections on plain asyncio sockets
            # (worker/upstream_sockets.py says what anyio's cost per read and per request).
            clients[provider] = [use_asyncio_sockets(c) for c in made] if sdk is openai else made
        return clients[provider]

    def llm(provider: str, model: str) -> Llm:
        first, *others = clients_for(provider)
        if provider == "anthropic":
            return Llm(_anthropic(settings, model, first), model, ANTHROPIC_OPTIONS)
        chat = _openai(settings, model, first)
        # The same SDK client (base URL, key, retries, timeouts) on each of the other pools.
        sdk_clients = [chat.root_async_client]
        sdk_clients += [chat.root_async_client.copy(http_client=http) for http in others]
        return Llm(chat, model, direct=True, clients=sdk_clients)

    router = llm(settings.router_provider, settings.router_model)
    # One model for both roles: one `Llm`, so both roles' calls share its bound tools.
    responder = (
        router
        if settings.roles_share_model
        else llm(settings.response_provider, settings.response_model)
    )
    return Models(router, responder, [http for made in clients.values() for http in made])


def pool_shards(concurrency: int) -> int:
    """How many connection pools a worker running `concurrency` turns at once spreads its
    OpenAI calls over: one for each `POOL_SHARE` turns, at most `_MAX_POOLS`."""
    return max(1, min(_MAX_POOLS, -(-concurrency // POOL_SHARE)))


def _openai(settings: Settings, model: str, http_client: Any) -> ChatOpenAI:
    return ChatOpenAI(
        model=model,
        base_url=settings.openai_base_url,
        api_key=settings.openai_api_key or "not-needed",
        stream_usage=True,
        timeout=settings.llm_timeout_s,
        max_retries=settings.llm_max_retries,
        # Its per-chunk `asyncio.wait_for` swallows a cancel on Python 3.11 when the next
        # chunk is already buffered, so aborts were lost; `timeout` bounds reads instead.
        stream_chunk_timeout=None,
        http_async_client=http_client,
    )


# What Anthropic's Messages API takes of the OpenAI options: `user` becomes
# `metadata.user_id`; `seed` and the penalties do not exist there.
ANTHROPIC_OPTIONS: dict[str, Callable[[Any], tuple[str, Any]] | None] = {
    "max_tokens": None,
    "temperature": None,
    "top_p": None,
    "stop": None,
    "user": lambda user: ("metadata", {"user_id": user}),
}


def _anthropic(settings: Settings, model: str, http_client: Any) -> BaseChatModel:
    # On the worker's client: `ChatAnthropic`'s own is cached for the process.
    from compat.langchain_anthropic import chat_anthropic

    return chat_anthropic(
        http_client,
        model=model,
        base_url=settings.anthropic_base_url,
        api_key=settings.anthropic_api_key or "not-needed",
        timeout=settings.llm_timeout_s,
        max_retries=settings.llm_max_retries,
        stream_usage=True,
        # Whole answers (the router's) are read as a stream too: its chunks' tool calls go
        # through LangChain's own parsing, which makes a `tool_use` whose input is JSON but
        # not an object (`[1, 2]`) an invalid call the model reads an error for, as
        # worker/openai_fast.py does on the OpenAI path; the whole message's parsing put it
        # on the message as it was, and the message failed its own validation.
        streaming=True,
    )
