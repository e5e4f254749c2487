"""A fake MediaWiki (Wikipedia): the Action API's search and the REST page summary.

`GET /w/api.php?action=query&list=search&srsearch=...` answers the fixture
`search-<slug of srsearch>.json` (`search-empty.json` when there is none, or in "empty"
mode); `GET /api/rest_v1/page/summary/<title>` answers `summary-<slug of title>.json`, or
404 with `summary-not-found.json`. Mode "api_error" makes the Action API report an error
the way it does, with HTTP 200 (`api-error.json`). Modes and holding: tests/fakes/searxng.py.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.fakes.searxng import FakeService, slug


class FakeMediaWiki(FakeService):
    folder = "mediawiki"

    def routes(self) -> list[Route]:
        return [
            Route("/w/api.php", self.endpoint(self._search)),
            Route("/api/rest_v1/page/summary/{title:path}", self.endpoint(self._summary)),
        ]

    def _search(self, request: Request, mode: str) -> Any:
        # Shape: https://www.mediawiki.org/wiki/API:Search (list=search, format=json) and
        # https://www.mediawiki.org/wiki/API:Errors_and_warnings for "api_error".
        if mode == "api_error":
            return self.fixture("api-error.json")
        name = f"search-{slug(request.query_params.get('srsearch', ''))}.json"
        if mode == "empty" or not self.has_fixture(name):
            name = "search-empty.json"
        return self.fixture(name)

    def _summary(self, request: Request, mode: str) -> Any:
        # Shape: https://www.mediawiki.org/wiki/Specs/Summary/1.4.0; a missing page is a 404
        # whose body is a problem of type https://mediawiki.org/wiki/HyperSwitch/errors/not_found.
        name = f"summary-{slug(request.path_params['title'])}.json"
        if not self.has_fixture(name):
            return JSONResponse(self.fixture("summary-not-found.json"), status_code=404)
        return self.fixture(name)
