"""`GET /v1/webhooks/deliveries`: the owner's webhook attempts, newest first (the last
100, kept `BERNARD_WEBHOOK_LOG_RETENTION_S`): for each, the event and turn, the target's
origin, when it was sent, the receiver's status code or the error, and when it is tried
again (shared/webhooks.py `DeliveryLog`, worker/webhooks.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from api.auth import Owner
from api.state import State
from shared.webhooks import DeliveryLog

router = APIRouter()


@router.get("/webhooks/deliveries")
async def list_deliveries(owner: Owner, state: State) -> Any:
    log = DeliveryLog(state.redis, owner, retention_s=state.settings.webhook_log_retention_s)
    return {"object": "list", "data": await log.recent()}
