"""Serve an ASGI app on a real loopback port inside the test's own event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Generator

import uvicorn
from starlette.types import ASGIApp


class InLoopServer(uvicorn.Server):
    """A uvicorn server that leaves the process's signal handlers alone."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


@contextlib.asynccontextmanager
async def serve(app: ASGIApp, *, lifespan: str = "on") -> AsyncIterator[int]:
    """Run `app` on 127.0.0.1 and yield its port; stops the server on exit."""
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,
        log_config=None,
        log_level="warning",
        access_log=False,
        lifespan=lifespan,  # type: ignore[arg-type]
        ws="none",
        timeout_graceful_shutdown=2,
    )
    server = InLoopServer(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError("the server exited during startup")
        await asyncio.sleep(0.005)
    try:
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=10)
