"""`GET /v1/status`: the deployment as its clients need to know it (api/status.py builds it):
what `bernard doctor` and the playground read, for any authenticated user."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from api.auth import Owner
from api.state import State
from api.status import build_status

router = APIRouter()


@router.get("/status")
async def get_status(owner: Owner, state: State) -> Any:
    status = await state.status.get(lambda: build_status(state.settings, state.redis, state.queue))
    return status.model_dump(mode="json")
