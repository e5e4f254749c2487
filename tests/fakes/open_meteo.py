"""A fake Open-Meteo: the geocoding API and the forecast API on one port.

`GET /v1/search?name=...` answers `geocoding-<slug of name>.json` (`geocoding-empty.json`,
which has no "results" key, when there is none or in "empty" mode); `GET /v1/forecast`
answers `forecast-metric.json`, or `forecast-imperial.json` for `temperature_unit=fahrenheit`,
its daily series cut to `forecast_days`. Mode "bad_request" answers 400 with the API's error
body (`error.json`). Modes and holding: tests/fakes/searxng.py.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.fakes.searxng import FakeService, slug


class FakeOpenMeteo(FakeService):
    folder = "open_meteo"

    def routes(self) -> list[Route]:
        return [
            Route("/v1/search", self.endpoint(self._geocode)),
            Route("/v1/forecast", self.endpoint(self._forecast)),
        ]

    def _geocode(self, request: Request, mode: str) -> Any:
        # Shape: https://open-meteo.com/en/docs/geocoding-api ("results": [{"name",
        # "latitude", "longitude", "country", "admin1", ...}], absent when nothing matches).
        name = f"geocoding-{slug(request.query_params.get('name', ''))}.json"
        if mode == "empty" or not self.has_fixture(name):
            name = "geocoding-empty.json"
        return self.fixture(name)

    def _forecast(self, request: Request, mode: str) -> Any:
        # Shape: https://open-meteo.com/en/docs ("current"/"current_units", "daily"/
        # "daily_units" with one array per variable); errors: {"error": true, "reason": ...}.
        if mode == "bad_request":
            return JSONResponse(self.fixture("error.json"), status_code=400)
        imperial = request.query_params.get("temperature_unit") == "fahrenheit"
        data = self.fixture("forecast-imperial.json" if imperial else "forecast-metric.json")
        days = int(request.query_params.get("forecast_days", "7"))
        data["daily"] = {key: values[:days] for key, values in data["daily"].items()}
        return data
