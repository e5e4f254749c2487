"""Probes: `/healthz` (the process answers) and `/readyz` (Redis answers, both roles when
they are apart, has room (api/store_guard.py: otherwise `store_full` says why), and a worker
is alive). `/readyz` also says how the MCP servers the workers connect to are doing
(shared/mcp_health.py); a server that is down never makes Bernard unready."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter

from api.json_response import JSONResponse
from api.state import State
from shared import keys
from shared.connection import REDIS_ERRORS
from shared.mcp_health import mcp_servers

router = APIRouter()
# A worker renews its entry with its liveness (1 s by default); 15 s of silence is dead.
_WORKER_FRESH_S = 15


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(state: State) -> Any:
    try:
        if state.redis is not state.queue:  # the data role (shared/keys.py) is a Redis apart
            await state.redis.ping()
        workers = await state.queue.zcount(keys.WORKERS, time.time() - _WORKER_FRESH_S, "+inf")
        servers = await mcp_servers(state.queue, _WORKER_FRESH_S)
    except REDIS_ERRORS:
        return JSONResponse({"status": "unavailable", "redis": False}, status_code=503)
    full = state.guard.reason
    ready = bool(workers) and full is None
    body: dict[str, Any] = {
        "status": "ok" if ready else "unavailable",
        "redis": True,
        "workers": workers,
        "mcp_servers": [server.model_dump() for server in servers],
    }
    if full is not None:
        body["store_full"] = full
    return JSONResponse(body, status_code=200 if ready else 503)
