"""`GET /v1/tools`: the tools the router may call, as the workers published them
(worker/tools/catalog.py): name, description, JSON schema of the arguments, and whether a
call waits for the user's confirmation."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter

from api.auth import Owner
from api.state import State
from shared import keys

router = APIRouter()


@router.get("/tools")
async def list_tools(owner: Owner, state: State) -> Any:
    raw = await state.queue.get(keys.TOOLS)
    data: list[dict[str, Any]] = orjson.loads(raw) if raw else []
    return {"object": "list", "data": data}
