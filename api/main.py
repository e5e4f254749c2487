"""The FastAPI app: `uvicorn api.main:app`.

Routes live under `/v1` and, for clients configured with Bernard's older base URL, under
`/api/v1` as well. The lifespan opens one Redis client and one stream hub per process.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from redis.exceptions import RedisError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api import errors, metrics
from api.errors import ApiError, error_response
from api.hub import StreamHub
from api.routes import chat, health, models, turns
from api.state import AppState
from shared.connection import connect
from shared.logs import configure_logging
from shared.redis_checks import warn_if_evicting
from shared.settings import Settings, get_settings
from shared.turns import TurnStore

logger = logging.getLogger("bernard.api")
# A request gets its 503 after a few quick retries; the hub retries on its own for longer.
_REQUEST_RETRIES = 3


class BodyLimit:
    """Answer 413 for bodies over `max_bytes`, declared or streamed, before anything parses."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = ApiError(
            413, f"request body is over {self.max_bytes} bytes", code="body_too_large"
        )
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await error_response(too_large)(scope, receive, send)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise too_large
            return message

        await self.app(scope, limited, send)


def create_app(settings: Settings | None = None) -> FastAPI:
    """The app for `settings` (read from the environment when not given)."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        configure_logging()
        redis = connect(settings.redis_url, retries=_REQUEST_RETRIES)
        hub = StreamHub(connect(settings.redis_url))
        store = TurnStore(
            redis, retention_s=settings.turn_retention_s, stream_maxlen=settings.stream_maxlen
        )
        app.state.bernard = AppState(settings=settings, redis=redis, store=store, hub=hub)
        await hub.start()
        reaper = asyncio.create_task(_reap_forever(store, settings.lease_renew_s))
        _warn_if_open(settings)
        try:
            await warn_if_evicting(redis, logger)
        except OSError:
            logger.warning("Redis is not reachable at start; requests get 503 until it is")
        # What exists now lives as long as the process: keep it out of the collector's full
        # passes, which grow with every object they scan (see worker.main.startup).
        gc.freeze()
        try:
            yield
        finally:
            reaper.cancel()
            await hub.stop()
            await hub.redis.aclose()
            await redis.aclose()

    app = FastAPI(
        title="Bernard",
        version="0.1.0",
        description="A streaming agent backend behind an OpenAI-compatible API.",
        lifespan=lifespan,
    )
    errors.install(app)
    for prefix in ("/v1", "/api/v1"):
        for module in (chat, models, turns):
            app.include_router(module.router, prefix=prefix, include_in_schema=prefix == "/v1")
    app.include_router(health.router)
    app.include_router(metrics.router)
    app.add_middleware(
        CORSMiddleware,
        allow_origins=["*"],
        allow_methods=["GET", "POST", "OPTIONS"],
        # "*" covers Authorization, Content-Type and the SDKs' x-stainless-* headers.
        allow_headers=["*"],
        expose_headers=["X-Bernard-Turn-Id", "X-Bernard-Conversation-Id"],
    )
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    return app


async def _reap_forever(store: TurnStore, interval_s: float) -> None:
    """End turns whose worker died, even when no worker is left to notice."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            for turn_id in await store.reap_lapsed():
                logger.warning("turn %s failed: its worker was lost", turn_id)
        except (RedisError, OSError) as exc:
            logger.debug("reaper could not reach Redis: %s", exc)


def _warn_if_open(settings: Settings) -> None:
    host = os.environ.get("HOST", "127.0.0.1")
    if not settings.api_key_users() and host not in ("127.0.0.1", "localhost", "::1"):
        logger.warning(
            "BERNARD_API_KEYS is not set and the API is bound to %s: anyone who reaches it "
            "can use it. Set BERNARD_API_KEYS=key:user,...",
            host,
        )


app = create_app()
