"""One log line per HTTP request, and with tracing on, the request's span.

`AccessLog` wraps the whole app (outside the body limit, so a 413 is logged too) and logs
`request` on the `bernard.api` logger once the response has ended (a stream: once it
closed) with `method`, `path`, `route` (the path's template), `status`, `duration_ms`, and
when they are known `user` (set by api/auth.py), `turn_id` and `conversation_id` (from the
route's path or the `X-Bernard-*` headers of the answer). Never headers, the query string
or the body. Health probes and metrics scrapes log at debug: a load balancer asks often.

With tracing on (shared/traces.py), the request is a server span, current while the app
runs, so the turn it creates stores its `traceparent` (api/turn_service.py) and the worker's
spans join this trace.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared import traces

__all__ = ["AccessLog"]

logger = logging.getLogger("bernard.api")

# Paths polled by machines: logged at debug.
_QUIET_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
_TURN_HEADER = b"x-bernard-turn-id"
_CONVERSATION_HEADER = b"x-bernard-conversation-id"
# A path parameter in a route's template: `{turn_id}`, `{name:path}`.
_PARAM = re.compile(r"\{(\w+)(?::[^}]*)?\}")


class AccessLog:
    """ASGI middleware: the `request` line (and span) of every HTTP request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        seen: dict[str, Any] = {"status": 500}

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
                for name, value in message.get("headers", ()):
                    if name == _TURN_HEADER:
                        seen["turn_id"] = value.decode("latin-1")
                    elif name == _CONVERSATION_HEADER:
                        seen["conversation_id"] = value.decode("latin-1")
            await send(message)

        tracer = traces.tracer()
        if tracer is None:
            try:
                await self.app(scope, receive, sending)
            finally:
                _log(scope, seen, started)
            return

        from opentelemetry.trace import SpanKind, Status, StatusCode

        method = scope["method"]
        with tracer.start_as_current_span(
            method,
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": scope["path"]},
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                await self.app(scope, receive, sending)
            finally:
                fields = _log(scope, seen, started)
                if "route" in fields:
                    span.update_name(f"{method} {fields['route']}")
                    span.set_attribute("http.route", fields["route"])
                span.set_attribute("http.response.status_code", fields["status"])
                for name, attribute in (
                    ("user", "enduser.id"),
                    ("turn_id", "bernard.turn_id"),
                    ("conversation_id", "gen_ai.conversation.id"),
                ):
                    if name in fields:
                        span.set_attribute(attribute, fields[name])
                if fields["status"] >= 500:
                    span.set_status(Status(StatusCode.ERROR))


def _route(scope: Scope, params: dict[str, Any]) -> str | None:
    """The matched route's template with the prefix it was included under
    (`/v1/turns/{turn_id}`), or None when no route matched.

    A route knows its path only below the prefix of the router it came from, so the prefix
    is what the request's path holds before the part the template matched."""
    template = getattr(scope.get("route"), "path", None)
    if not isinstance(template, str):
        return None
    matched = _PARAM.sub(lambda m: str(params.get(m[1], m[0])), template)
    path: str = scope["path"]
    prefix = path[: -len(matched)] if matched and path.endswith(matched) else ""
    return prefix + template


def _log(scope: Scope, seen: dict[str, Any], started: float) -> dict[str, Any]:
    """Log the request's line; return its fields."""
    fields: dict[str, Any] = {
        "method": scope["method"],
        "path": scope["path"],
        "status": seen["status"],
        "duration_ms": round((time.perf_counter() - started) * 1000, 1),
    }
    params = scope.get("path_params") or {}
    route = _route(scope, params)
    if route:
        fields["route"] = route
    user = (scope.get("state") or {}).get("user")
    if user:
        fields["user"] = user
    for name in ("turn_id", "conversation_id"):
        value = seen.get(name) or params.get(name)
        if value:
            fields[name] = value
    if scope["path"] in _QUIET_PATHS:
        level = logging.DEBUG
    elif fields["status"] >= 500:
        level = logging.WARNING
    else:
        level = logging.INFO
    logger.log(level, "request", extra=fields)
    return fields
