"""A fake SearXNG, and `FakeService`, the machinery the fakes of tests/fakes/ share.

A fake serves a Starlette app on a free loopback port in the test's own event loop
(`tests.support.serving.serve`). Its replies come from JSON fixtures under tests/fixtures/<service>/
that follow the real API's documented shape. `mode` says how it answers::

    async with FakeSearxng() as searxng:           # "ok": the fixture
        searxng.mode = "forbidden"                 # or any of MODES below
        searxng.hold()                             # requests wait for `release()`
        await searxng.wait_held()                  # a request arrived and is waiting
        searxng.release()

`only` limits a failure mode to the paths starting with it (the other paths answer "ok"),
so a test can fail the second of two calls. Every request is kept in `requests`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tests.support.serving import serve

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"

# How a fake answers. "ok" and "empty" are the service's own (a subclass picks the fixture);
# the others are the same for every service.
MODES = (
    "ok",
    "empty",
    "slow",  # answers only after `delay_s`, longer than the tool's HTTP timeout
    "unauthorized",  # 401
    "forbidden",  # 403
    "error",  # 500
    "malformed",  # 200 with a body that is not JSON
    "wrong_shape",  # 200 with JSON that is not the API's shape
)
_STATUS = {"unauthorized": 401, "forbidden": 403, "error": 500}


@dataclass(frozen=True)
class Seen:
    """One request the fake received: its path and query parameters."""

    path: str
    params: dict[str, str]


def slug(text: str) -> str:
    """A fixture name part for `text`: "Mercury (planet)" -> "mercury-planet"."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


class FakeService:
    """A fake HTTP service; a subclass names its fixture folder and its routes."""

    folder: ClassVar[str]

    def __init__(self, mode: str = "ok", *, only: str | None = None, delay_s: float = 5.0) -> None:
        self.mode = mode
        self.only = only
        self.delay_s = delay_s
        self.requests: list[Seen] = []
        self.base_url = ""
        self._gate: asyncio.Event | None = None
        self._hold_only: str | None = None
        self._held = asyncio.Event()
        self._closing = asyncio.Event()
        self._stack = contextlib.AsyncExitStack()

    def routes(self) -> list[Route]:
        raise NotImplementedError

    def fixture(self, name: str) -> Any:
        return json.loads((FIXTURES / self.folder / name).read_text())

    def has_fixture(self, name: str) -> bool:
        return (FIXTURES / self.folder / name).is_file()

    def hold(self, only: str | None = None) -> None:
        """Requests from now on (those whose path starts with `only`, when given) wait for
        `release()` before they are answered."""
        self._gate = asyncio.Event()
        self._hold_only = only

    def holds(self, request: Request) -> bool:
        """Whether `request` waits for `release()`."""
        return self._gate is not None and (
            self._hold_only is None or request.url.path.startswith(self._hold_only)
        )

    async def held(self, request: Request) -> None:
        """Wait for `release()` if `request` is held."""
        if self.holds(request) and self._gate is not None:
            self._held.set()
            await self._gate.wait()

    async def wait_held(self) -> None:
        """Until a request arrived and is being held."""
        await asyncio.wait_for(self._held.wait(), 5)

    def release(self) -> None:
        if self._gate is not None:
            self._gate.set()

    async def __aenter__(self) -> Self:
        port = await self._stack.enter_async_context(serve(Starlette(routes=self.routes())))
        self.base_url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._closing.set()  # slow and held replies end now, so the server stops promptly
        self.release()
        await self._stack.aclose()

    def mode_for(self, request: Request) -> str:
        if self.only is None or request.url.path.startswith(self.only):
            return self.mode
        return "ok"

    def endpoint(
        self, reply: Callable[[Request, str], Any]
    ) -> Callable[[Request], Awaitable[Response]]:
        """A route handler: records the request, applies hold and mode, else `reply(request,
        mode)` builds the answer (a `Response`, or a payload sent as JSON)."""

        async def handle(request: Request) -> Response:
            self.requests.append(Seen(request.url.path, dict(request.query_params)))
            await self.held(request)
            mode = self.mode_for(request)
            if mode == "slow":
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), self.delay_s)
            if mode in _STATUS:
                code = _STATUS[mode]
                return PlainTextResponse(f"{code} {_PHRASES[code]}", status_code=code)
            if mode == "malformed":
                return Response('{"results": [{"title": "cut sh', media_type="application/json")
            if mode == "wrong_shape":
                return JSONResponse(["not", "the", "documented", "shape"])
            answer = reply(request, mode)
            return answer if isinstance(answer, Response) else JSONResponse(answer)

        return handle


_PHRASES = {401: "Unauthorized", 403: "Forbidden", 500: "Internal Server Error"}


class FakeSearxng(FakeService):
    """`GET /search?q=...&format=json`: fixture search.json, or empty.json in "empty" mode."""

    folder = "searxng"

    def routes(self) -> list[Route]:
        return [Route("/search", self.endpoint(self._search))]

    def _search(self, request: Request, mode: str) -> Any:
        # Shape: https://docs.searxng.org/dev/search_api.html (format=json) — a dict with
        # "query", "number_of_results", "results" [{"url", "title", "content", ...}], ...
        if request.query_params.get("format") != "json":
            return PlainTextResponse("<html>results</html>", media_type="text/html")
        return self.fixture("empty.json" if mode == "empty" else "search.json")
