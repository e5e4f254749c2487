"""Bearer-key authentication: `BERNARD_API_KEYS` maps keys to users.

Unset, the server is open, every request is the local user's, and the Host header stands in
for keys: the API answers only requests for its own names (`host_names`), so a web page whose
name is rebound to 127.0.0.1 is refused (400 `invalid_host`). `/metrics` is the operator's:
it answers loopback, and elsewhere only `BERNARD_METRICS_KEY`. `Owner` charges the request
to its user's rate (shared/rate_limit.py); routes that start a turn take `TurnOwner`, whose
admission script charges the turn's cost (api/admission.py).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from typing import Annotated

from fastapi import Depends, Request
from redis.asyncio import Redis
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.admission import rate_limited
from api.errors import ApiError, error_response
from api.state import State
from shared import keys
from shared.errors import ErrorCode
from shared.rate_limit import RateLimitedError
from shared.settings import LOCAL_USER, Settings

__all__ = [
    "LOCAL_USER",
    "KnownHosts",
    "Owner",
    "TurnOwner",
    "authenticate",
    "current_user",
    "host_names",
    "turn_user",
]

# The names a server without keys always answers to: its own on loopback.
LOCAL_NAMES = ("localhost", "127.0.0.1", "[::1]")
# Addresses a server listens on that are no name a client sends.
_WILDCARDS = frozenset({"", "0.0.0.0", "::"})
# The probes: they hold nothing of a user's, and a prober sends the address it reached.
_PROBES = frozenset({"/healthz", "/readyz"})
_PASSED = "bernard.known_host"


async def warn_if_local_hidden(redis: Redis, settings: Settings, logger: logging.Logger) -> int:
    """With `BERNARD_API_KEYS` set and no key for the user `local`, warn when `local` (every
    request's user while the server ran open) has conversations: no key reaches them now.
    How many it has (0 when nothing is said). Redis errors propagate."""
    users = settings.api_key_users()
    if not users or LOCAL_USER in users.values():
        return 0
    count = int(await redis.zcard(keys.conversations(LOCAL_USER)))
    if count:
        logger.warning(
            "BERNARD_API_KEYS is set, and the %d conversation(s) made while the server ran "
            "without keys (user '%s') are now hidden: no key belongs to that user. To reach "
            "them, give it a key: BERNARD_API_KEYS=...,<key>:%s",
            count,
            LOCAL_USER,
            LOCAL_USER,
        )
    return count


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
        if _same(key, token):
            user = owner
    if user is None:
        raise ApiError(401, "invalid API key", code=ErrorCode.INVALID_API_KEY)
    return user


async def turn_user(request: Request, state: State) -> str:
    """Dependency form of `authenticate`; runs before the body is validated (401 before 400).

    `async` although it never awaits: FastAPI runs a plain `def` dependency in a worker
    thread, a thread hop on every request for nothing.
    """
    user = authenticate(request, state.settings)
    request.state.user = user  # for the request's log line (api/access_log.py)
    return user


async def current_user(user: Annotated[str, Depends(turn_user)], state: State) -> str:
    """`turn_user`, with the request charged one token of the user's rate."""
    try:
        await state.limiter.take(user)
    except RateLimitedError as exc:
        raise rate_limited(state.settings, exc) from None
    return user


Owner = Annotated[str, Depends(current_user)]
# For a route that starts a turn: its admission charges the request.
TurnOwner = Annotated[str, Depends(turn_user)]


def _same(key: str, token: str) -> bool:
    return hmac.compare_digest(key.encode(), token.strip().encode())


def from_loopback(request: Request) -> bool:
    """Whether the client is on this host: a loopback address, or a Unix socket's peer.
    Behind a proxy that sends X-Forwarded-For, uvicorn puts the client's address here."""
    if request.client is None or not request.client.host:
        return True
    try:
        address = ipaddress.ip_address(request.client.host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


async def metrics_scraper(request: Request, state: State) -> None:
    """Let a scrape of `/metrics` through (see the module docstring), else 403 or 401."""
    if from_loopback(request):
        return
    key = state.settings.metrics_key
    if not key:
        raise ApiError(
            403,
            "/metrics answers on loopback only; set BERNARD_METRICS_KEY to scrape it from "
            "elsewhere",
            code=ErrorCode.PERMISSION_DENIED,
        )
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token or not _same(key, token):
        raise ApiError(
            401,
            "scraping /metrics from elsewhere takes Authorization: Bearer <BERNARD_METRICS_KEY>",
            code=ErrorCode.INVALID_API_KEY,
        )


def host_names(settings: Settings, bound: str) -> list[str] | None:
    """The Host names the API answers to (`*.lan` patterns among them), listening on
    `bound` (`HOST`); None for any: with `BERNARD_API_KEYS` set, a key says who asks."""
    if settings.api_key_users():
        return None
    names = [*LOCAL_NAMES, *settings.allowed_host_names()]
    address = bound.strip().strip("[]").lower()
    if address not in _WILDCARDS:
        names.append(f"[{address}]" if ":" in address else address)
    return list(dict.fromkeys(names))


async def _discard(message: Message) -> None:
    """Where `KnownHosts` sends Starlette's own refusal: its envelope goes instead."""


class KnownHosts:
    """Answer only requests for one of `names` (`host_names`), others with a 400 in the API's
    envelope. Starlette's `TrustedHostMiddleware` decides (its Host parsing and patterns);
    its plain-text refusal is discarded for Bernard's envelope: it calls the app it wraps
    only for a trusted host, and that app marks the request."""

    def __init__(self, app: ASGIApp, names: list[str]) -> None:
        self.app = app
        self.check = TrustedHostMiddleware(self._trusted, allowed_hosts=names, www_redirect=False)

    @staticmethod
    async def _trusted(scope: Scope, receive: Receive, send: Send) -> None:
        scope[_PASSED] = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in _PROBES:
            await self.app(scope, receive, send)
            return
        await self.check(scope, receive, _discard)
        if scope.pop(_PASSED, False):
            await self.app(scope, receive, send)
            return
        host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
        error = ApiError(
            400,
            f"this server answers for its own names only while BERNARD_API_KEYS is unset, "
            f"and the Host header {host[:100]!r} is not one (add it to BERNARD_ALLOWED_HOSTS)",
            param="Host",
            code=ErrorCode.INVALID_HOST,
        )
        await error_response(error)(scope, receive, send)
