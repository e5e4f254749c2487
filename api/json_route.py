"""Request bodies parsed by orjson instead of the standard library's `json`.

FastAPI parses a JSON body with `Request.json()`, which is `json.loads`. That accepts what
Bernard cannot carry on: a lone surrogate (`"\\ud800"`) becomes a `str` that no JSON
encoder will write back out (orjson raises, and the request answered 500), and an integer
of any size. orjson refuses the first as invalid JSON (FastAPI's own 400 path: its error
subclasses `json.JSONDecodeError`) and reads integers beyond 64 bits as floats, which the
strict integer fields then refuse. It is also several times faster on the large bodies a
chat request carries. The route class is FastAPI's documented way to replace the request.

A body may nest at most `MAX_JSON_DEPTH` levels (itself the first), and one nested deeper is
a 400 naming its top-level field. This is the one bound for every JSON a client sends:
what Bernard stores it wraps in records of its own (edited arguments sit five levels down
in a turn's record), and orjson writes at most 254 levels, so a deeper body was taken and
then failed as a 500 when it was stored. 64 is far more than any tool schema or message
needs.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from fastapi import Request, Response
from fastapi.routing import APIRoute

from api.errors import invalid

MAX_JSON_DEPTH = 64


class OrjsonRequest(Request):
    # The body once parsed (Starlette keeps its own in a private attribute; this is ours).
    _parsed: Any = None
    _was_parsed = False

    async def json(self) -> Any:
        if not self._was_parsed:
            body = orjson.loads(await self.body())
            check_depth(body)
            self._parsed, self._was_parsed = body, True
        return self._parsed


def check_depth(body: Any, limit: int = MAX_JSON_DEPTH) -> None:
    """Raise a 400 naming the top-level field (else none) in which `body` nests deeper than
    `limit` levels, counting itself as the first."""
    if type(body) not in (dict, list) or not _deeper(body, limit, 1):
        return
    field = None
    if isinstance(body, dict):
        field = next(
            key
            for key, value in body.items()
            if type(value) in (dict, list) and _deeper(value, limit, 2)
        )
    raise invalid(
        f"{field + ': ' if field else ''}nested deeper than {limit} levels, the most a body "
        "may nest",
        field,
    )


def _deeper(value: Any, limit: int, depth: int) -> bool:
    """Whether `value`, `depth` levels down, nests deeper than `limit`. Recursive (it stops
    at `limit`), and only into containers: 3 µs for a four-message chat request, 0.27 ms
    for one of 500 messages (a quarter of its parse), a loop with a stack several times
    that."""
    if depth > limit:
        return True
    for child in value.values() if type(value) is dict else value:
        kind = type(child)
        if (kind is dict or kind is list) and _deeper(child, limit, depth + 1):
            return True
    return False


class OrjsonRoute(APIRoute):
    """An `APIRoute` whose handler reads the body through `OrjsonRequest`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def orjson_handler(request: Request) -> Response:
            return await handler(OrjsonRequest(request.scope, request.receive))

        return orjson_handler
