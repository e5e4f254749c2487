"""Request bodies parsed by orjson instead of the standard library's `json`.

FastAPI parses a JSON body with `Request.json()`, which is `json.loads`. That accepts what
Bernard cannot carry on: a lone surrogate (`"\\ud800"`) becomes a `str` that no JSON
encoder will write back out (orjson raises, and the request answered 500), and an integer
of any size. orjson refuses the first as invalid JSON (FastAPI's own 400 path: its error
subclasses `json.JSONDecodeError`) and reads integers beyond 64 bits as floats, which the
strict integer fields then refuse. It is also several times faster on the large bodies a
chat request carries. The route class is FastAPI's documented way to replace the request.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from fastapi import Request, Response
from fastapi.routing import APIRoute


class OrjsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = orjson.loads(await self.body())
        return self._json


class OrjsonRoute(APIRoute):
    """An `APIRoute` whose handler reads the body through `OrjsonRequest`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def orjson_handler(request: Request) -> Response:
            return await handler(OrjsonRequest(request.scope, request.receive))

        return orjson_handler
