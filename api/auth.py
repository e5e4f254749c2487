"""Bearer-key authentication: `BERNARD_API_KEYS` maps keys to users.

Unset, the server is open and every request belongs to one local user.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request

from api.errors import ApiError
from api.state import AppState, get_state
from shared.errors import ErrorCode
from shared.settings import LOCAL_USER, Settings

__all__ = ["LOCAL_USER", "Owner", "authenticate", "current_user"]


def authenticate(request: Request, settings: Settings) -> str:
    """The user behind the request's bearer key; raises 401 when keys are set and it fails."""
    users = settings.api_key_users()
    if not users:
        return LOCAL_USER
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise ApiError(
            401,
            "missing bearer token: send Authorization: Bearer <key>",
            code=ErrorCode.INVALID_API_KEY,
        )
    # Compare against every key, always, so timing says nothing about which prefix matched.
    user = None
    for key, owner in users.items():
        if hmac.compare_digest(key.encode(), token.strip().encode()):
            user = owner
    if user is None:
        raise ApiError(401, "invalid API key", code=ErrorCode.INVALID_API_KEY)
    return user


async def current_user(request: Request, state: Annotated[AppState, Depends(get_state)]) -> str:
    """Dependency form of `authenticate`; runs before the body is validated (401 before 400).

    `async` although it never awaits: FastAPI runs a plain `def` dependency in a worker
    thread, a thread hop on every request for nothing.
    """
    user = authenticate(request, state.settings)
    request.state.user = user  # for the request's log line (api/access_log.py)
    return user


Owner = Annotated[str, Depends(current_user)]
