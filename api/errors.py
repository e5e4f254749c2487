"""Errors in the OpenAI envelope, and the one place exceptions become HTTP responses.

ApiError                      → its own status, {"error": {message, type, param, code}}
RequestValidationError        → 400 invalid_request_error (never FastAPI's 422 "detail")
StarletteHTTPException        → its status (404 for unknown routes, 405, 413, ...)
redis ConnectionError/Timeout → 503 "Redis is unreachable", with Retry-After
redis OutOfMemoryError        → 503 store_full: Redis at its maxmemory refused a write
anything else                 → 500 server_error, logged

Every 429 and 503 says when to try again (`Retry-After`, in seconds); every other 4xx
tells the SDKs not to retry (`x-should-retry: false`).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from redis.exceptions import ClusterDownError, OutOfMemoryError, RedisClusterException
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.json_response import JSONResponse
from shared.errors import ErrorCode

logger = logging.getLogger("bernard.api")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
}
# Codes for the statuses Starlette raises itself (no route, wrong method, body too large).
_HTTP_CODES = {
    404: ErrorCode.NOT_FOUND,
    405: ErrorCode.METHOD_NOT_ALLOWED,
    413: ErrorCode.BODY_TOO_LARGE,
}
# Seconds a client should wait before trying again after a 429 or a 503.
RETRY_AFTER_S = 1
# After a 503 `store_full`: memory frees as turns expire, not in a second.
STORE_FULL_RETRY_AFTER_S = 10


def envelope(
    message: str, *, type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The OpenAI error body."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class ApiError(StarletteHTTPException):
    """An error answered with `status` and the OpenAI envelope.

    An `HTTPException`, so that FastAPI lets it through where it turns every other
    exception into a bare 400: while it reads a body (api/json_route.py raises one there).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: ErrorCode | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(status, message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "server_error")
        self.headers = headers or {}

    def __str__(self) -> str:
        return self.message

    def body(self) -> dict[str, Any]:
        code = str(self.code) if self.code is not None else None
        return envelope(self.message, type=self.type, param=self.param, code=code)


def invalid(
    message: str, param: str | None = None, code: ErrorCode = ErrorCode.INVALID_VALUE
) -> ApiError:
    """A 400 `invalid_request_error` naming the offending parameter."""
    return ApiError(400, message, param=param, code=code)


def not_found(
    message: str, param: str | None = None, code: ErrorCode = ErrorCode.NOT_FOUND
) -> ApiError:
    """A 404 `not_found_error`: what the request names is not there, or not the owner's."""
    return ApiError(404, message, param=param, code=code)


def error_response(exc: ApiError) -> JSONResponse:
    headers: dict[str, str] = dict(exc.headers or {})
    if exc.status in (429, 503):
        headers.setdefault("retry-after", str(RETRY_AFTER_S))
    elif 400 <= exc.status < 500:
        headers["x-should-retry"] = "false"
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers or None)


_SCALAR_TAGS = frozenset({"str", "int", "float", "bool", "none", "dict", "list"})


def _is_union_tag(part: str) -> bool:
    """Union members in pydantic error locations: "str", "list[TextPart]", "StreamOptions"."""
    return "[" in part or part in _SCALAR_TAGS or part[:1].isupper()


def param_from_loc(loc: tuple[int | str, ...]) -> str | None:
    """`("body", "messages", 0, "role")` → `messages[0].role`; union member tags dropped."""
    path = ""
    for part in loc:
        if part in ("body", "query", "path", "header"):
            continue
        if isinstance(part, str) and _is_union_tag(part):
            continue
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or None


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers that turn every failure into the OpenAI envelope."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":
            # The position in the body is not a parameter.
            detail = (first.get("ctx") or {}).get("error", "")
            message = f"the body is not valid JSON: {detail}" if detail else "invalid JSON"
            return error_response(invalid(message))
        param = param_from_loc(tuple(first.get("loc", ())))
        message = first.get("msg", "invalid request")
        return error_response(invalid(f"{param}: {message}" if param else message, param))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "request failed"
        code = _HTTP_CODES.get(exc.status_code)
        return error_response(ApiError(exc.status_code, message, code=code))

    @app.exception_handler(RedisConnectionError)
    @app.exception_handler(RedisTimeoutError)
    # A Cluster without a primary for a slot (a shard failing over), or none reachable.
    @app.exception_handler(ClusterDownError)
    @app.exception_handler(RedisClusterException)
    async def _redis_down(request: Request, exc: Exception) -> JSONResponse:
        logger.warning("Redis unreachable: %s", exc)
        return error_response(
            ApiError(
                503, "Redis is unreachable; try again shortly", code=ErrorCode.REDIS_UNAVAILABLE
            )
        )

    # Past the memory guard (between two of its samples, or with it off), Redis itself
    # refuses the write: the same refusal, never a 500.
    @app.exception_handler(OutOfMemoryError)
    async def _redis_full(request: Request, exc: Exception) -> JSONResponse:
        logger.warning("Redis is full: %s", exc)
        return error_response(
            ApiError(
                503,
                "Redis is full (at its maxmemory) and refused to store this request; "
                "try again once it has room",
                code=ErrorCode.STORE_FULL,
                headers={"retry-after": str(STORE_FULL_RETRY_AFTER_S)},
            )
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(ApiError(500, "internal server error", code=ErrorCode.INTERNAL_ERROR))
