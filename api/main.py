"""The FastAPI app: `uvicorn api.main:app`.

Routes live under `/v1` and, for clients configured with Bernard's older base URL, under
`/api/v1` as well. The lifespan opens one Redis client and one stream hub per process.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from redis.asyncio import Redis
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api import errors, metrics
from api.access_log import AccessLog
from api.attachments import Streams
from api.auth import KnownHosts, host_names, warn_if_local_hidden
from api.cluster_hub import ClusterHub
from api.errors import ApiError, error_response
from api.hub import Hub, StreamHub
from api.routes import (
    chat,
    conversations,
    events,
    health,
    models,
    playground,
    responses,
    status,
    tools,
    turns,
    webhooks,
)
from api.state import AppState
from api.store_guard import StoreGuard
from shared.backends import Wake, backend_of
from shared.connection import REDIS_ERRORS, connect, connect_data, queue_client
from shared.errors import ErrorCode
from shared.logs import configure_logging
from shared.rate_limit import Rate, RateLimiter
from shared.redis_checks import warn_if_evicting
from shared.settings import Settings, get_settings
from shared.timers import EVENTS_MAXLEN
from shared.traces import configure_tracing, flush_tracing
from shared.turns import TurnStore

logger = logging.getLogger("bernard.api")
# A request gets its 503 after a few quick retries; the hub retries on its own for longer.
_REQUEST_RETRIES = 3
# The hub that reads turn streams the way the data role's readers are woken there.
_HUBS: dict[Wake, type[StreamHub] | type[ClusterHub]] = {
    Wake.XREAD: StreamHub,
    Wake.CHANNEL: ClusterHub,
}


class BodyLimit:
    """Answer 413 in the error envelope for a body over `max_bytes`, declared or streamed.

    The body is read here, whole, before the app runs (FastAPI reads it whole anyway), so a
    chunked body over the limit is refused before anything parses it, with the same answer
    as a declared one. Starlette's own limit (FastAPI's `max_body_size`) answers a plain-text
    413 that the OpenAI SDKs cannot read.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        first: Message | None = None
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before sending it all
                first = message
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._too_large(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        if first is None:
            first = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        pending: list[Message] = [first]

        async def replay() -> Message:
            # The body once, then the client's own messages (a disconnect, for a stream).
            return pending.pop() if pending else await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = ApiError(
            413,
            f"request body is over {self.max_bytes} bytes (BERNARD_MAX_BODY_BYTES)",
            code=ErrorCode.BODY_TOO_LARGE,
        )
        await error_response(error)(scope, receive, send)


def create_app(settings: Settings | None = None) -> FastAPI:
    """The app for `settings` (read from the environment when not given)."""
    settings = settings or get_settings()
    # Here rather than at startup: uvicorn imports the app before its first line, which
    # then has the format of every other.
    configure_logging(settings)
    docs = settings.api_docs  # off by default: shared/settings.py says why
    app = FastAPI(
        title="Bernard",
        version="0.1.0",
        description="A streaming agent backend behind an OpenAI-compatible API.",
        lifespan=_lifespan(settings),
        docs_url="/docs" if docs else None,
        redoc_url="/redoc" if docs else None,
        openapi_url="/openapi.json" if docs else None,
    )
    errors.install_error_handlers(app)
    _include_routers(app)
    _add_middleware(app, settings)
    return app


def _lifespan(settings: Settings) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """What the app opens as it starts (its clients, hub, guard and reaper) and closes as it
    stops."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        traced = configure_tracing(settings, "bernard-api")
        hub_redis = connect_data(settings.redis_url)
        state = app.state.bernard = _app_state(settings, hub_redis)
        await state.hub.start()
        state.guard.start()
        reaper = asyncio.create_task(_reap_forever(state.store, settings.lease_renew_s))
        await _warn_at_start(settings, state)
        # What exists now lives as long as the process: keep it out of the collector's full
        # passes, which grow with every object they scan (see worker.main.startup).
        gc.freeze()
        try:
            yield
        finally:
            reaper.cancel()
            await state.guard.stop()
            await state.hub.stop()
            await state.schema_checks.close()
            await hub_redis.aclose()
            if state.queue is not state.redis:
                await state.queue.aclose()
            await state.redis.aclose()
            if traced:
                flush_tracing()

    return lifespan


def _app_state(settings: Settings, hub_redis: Redis) -> AppState:
    """The process's state: its Redis clients, turn store, stream hub (reading on
    `hub_redis`, a client of its own), open streams, rate limiter and memory guard."""
    # The data role, and the queue role: one client when one Redis holds both.
    redis = connect_data(settings.redis_url, retries=_REQUEST_RETRIES)
    queue = queue_client(
        settings, redis, lambda: connect(settings.queue_url, retries=_REQUEST_RETRIES)
    )
    # The fewest entries any stream it reads is trimmed to: a turn's, or a user's own
    # event stream (shared/timers.py). A reader further behind gets `stream_trimmed`.
    maxlen = min(settings.stream_maxlen, EVENTS_MAXLEN)
    hub: Hub = _HUBS[backend_of(hub_redis).wake](hub_redis, maxlen=maxlen)
    store = TurnStore(
        redis,
        retention_s=settings.turn_retention_s,
        stream_maxlen=settings.stream_maxlen,
        queue=queue,
        queue_name=settings.queue_name,
    )
    # Every server that holds Bernard's data (api/store_guard.py).
    servers = [redis] if queue is redis else [redis, queue]
    return AppState(
        settings=settings,
        redis=redis,
        store=store,
        hub=hub,
        streams=Streams(redis, settings, queue=queue),
        queue=queue,
        limiter=RateLimiter(queue, Rate.of(settings)),
        guard=StoreGuard(servers, settings.redis_memory_guard),
    )


async def _warn_at_start(settings: Settings, state: AppState) -> None:
    """Log what an operator should know as the API starts: an open API, a Redis that may
    evict Bernard's keys, a local address a proxy hides."""
    _warn_if_open(settings)
    try:
        await warn_if_evicting(state.redis, logger)
        if state.queue is not state.redis:
            await warn_if_evicting(state.queue, logger)
        await warn_if_local_hidden(state.redis, settings, logger)
    except REDIS_ERRORS:  # OSError among them
        logger.warning("Redis is not reachable at start; requests get 503 until it is")


# The routers served under `/v1` and, hidden from the schema, `/api/v1`.
_VERSIONED = (chat, conversations, events, models, responses, status, tools, turns, webhooks)


def _include_routers(app: FastAPI) -> None:
    for prefix in ("/v1", "/api/v1"):
        for module in _VERSIONED:
            app.include_router(module.router, prefix=prefix, include_in_schema=prefix == "/v1")
    app.include_router(health.router)
    app.include_router(metrics.router)
    app.include_router(playground.router)  # the web page at `/` and `/playground`


def _add_middleware(app: FastAPI, settings: Settings) -> None:
    """CORS, the body limit, the known hosts and the access log, innermost first."""
    app.add_middleware(
        CORSMiddleware,
        # None by default: the playground is the API's own origin (BERNARD_CORS_ORIGINS).
        allow_origins=settings.cors_origin_list(),
        allow_methods=["GET", "POST", "PATCH", "DELETE", "OPTIONS"],
        # "*" covers Authorization, Content-Type and the SDKs' x-stainless-* headers.
        allow_headers=["*"],
        expose_headers=["X-Bernard-Turn-Id", "X-Bernard-Conversation-Id"],
    )
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    names = host_names(settings, os.environ.get("HOST", "127.0.0.1"))
    if names is not None and "*" not in names:
        app.add_middleware(KnownHosts, names=names)
    app.add_middleware(AccessLog)  # outermost: a refused body or host is logged too


async def _reap_forever(store: TurnStore, interval_s: float) -> None:
    """End turns whose worker died, even when no worker is left to notice."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await store.reap_lapsed()
        except REDIS_ERRORS as exc:
            logger.debug("reaper could not reach Redis: %s", exc)


def _warn_if_open(settings: Settings) -> None:
    host = os.environ.get("HOST", "127.0.0.1")
    if not settings.api_key_users() and host not in ("127.0.0.1", "localhost", "::1"):
        logger.warning(
            "BERNARD_API_KEYS is not set and the API is bound to %s: anyone who reaches it "
            "can use it. Set BERNARD_API_KEYS=key:user,... (until then it answers requests "
            "for %s only: BERNARD_ALLOWED_HOSTS adds names)",
            host,
            ", ".join(host_names(settings, host) or ["any name"]),
        )


app = create_app()
