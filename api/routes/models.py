"""`GET /v1/models`: the one model Bernard serves."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from api.auth import Owner
from api.turn_service import check_model
from shared.settings import MODEL_ID

router = APIRouter()
_CREATED = 1_735_689_600  # 2025-01-01: a fixed date, so clients caching the list see no change


def _model() -> dict[str, Any]:
    return {"id": MODEL_ID, "object": "model", "created": _CREATED, "owned_by": "bernard"}


@router.get("/models")
async def list_models(owner: Owner) -> dict[str, Any]:
    return {"object": "list", "data": [_model()]}


@router.get("/models/{model_id}")
async def get_model(model_id: str, owner: Owner) -> dict[str, Any]:
    check_model(model_id)
    return _model()
