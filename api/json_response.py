"""JSON responses rendered with orjson (FastAPI's `JSONResponse` is deprecated)."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response


class JSONResponse(Response):
    """A JSON body rendered by orjson."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)
