"""The `weather` tool: current conditions and a daily forecast from Open-Meteo.

Two Open-Meteo APIs, no key needed: the geocoding API (https://open-meteo.com/en/docs/
geocoding-api, `GET {geocoding}/v1/search?name=...&count=1`) turns the place name into
coordinates, and the forecast API (https://open-meteo.com/en/docs, `GET {open_meteo}/v1/
forecast?latitude=..&longitude=..&current=...&daily=...`) answers for them, in the place's own
time zone. Weather states come as WMO codes (listed on the forecast API's page), rendered here
as words.

Configured by `BERNARD_OPEN_METEO_URL` and `BERNARD_OPEN_METEO_GEOCODING_URL`; requests go
through the worker's shared HTTP client, limited by `BERNARD_TOOL_HTTP_TIMEOUT_S`.
"""

from __future__ import annotations

from datetime import date
from typing import Any, Literal

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import ToolException, tool
from pydantic import Field

from worker.tools.http import request_json
from worker.tools.progress import get_reporter
from worker.tools.runtime import get_runtime
from worker.tools.settings import SourceSettings
from worker.tools.texts import folded_text

__all__ = ["MAX_DAYS", "WMO_CODES", "WeatherSettings", "weather"]

MAX_DAYS = 16  # the forecast API's limit
MAX_LOCATION_CHARS = 200
_SERVICE = "the weather service (Open-Meteo)"


class WeatherSettings(SourceSettings):
    open_meteo_url: str = Field(
        "https://api.open-meteo.com",
        alias="BERNARD_OPEN_METEO_URL",
        description="Open-Meteo's forecast API (no key) for the `weather` tool; empty turns "
        "the tool off",
    )
    open_meteo_geocoding_url: str = Field(
        "https://geocoding-api.open-meteo.com",
        alias="BERNARD_OPEN_METEO_GEOCODING_URL",
        description="Open-Meteo's geocoding API, which finds the place named; empty turns "
        "the tool off",
    )


CURRENT = "temperature_2m,weather_code,wind_speed_10m,relative_humidity_2m"
DAILY = "temperature_2m_max,temperature_2m_min,precipitation_sum,weather_code"

IMPERIAL = {
    "temperature_unit": "fahrenheit",
    "wind_speed_unit": "mph",
    "precipitation_unit": "inch",
}

WMO_CODES = {
    0: "clear sky",
    1: "mainly clear",
    2: "partly cloudy",
    3: "overcast",
    45: "fog",
    48: "depositing rime fog",
    51: "light drizzle",
    53: "moderate drizzle",
    55: "dense drizzle",
    56: "light freezing drizzle",
    57: "dense freezing drizzle",
    61: "slight rain",
    63: "moderate rain",
    65: "heavy rain",
    66: "light freezing rain",
    67: "heavy freezing rain",
    71: "slight snowfall",
    73: "moderate snowfall",
    75: "heavy snowfall",
    77: "snow grains",
    80: "slight rain showers",
    81: "moderate rain showers",
    82: "violent rain showers",
    85: "slight snow showers",
    86: "heavy snow showers",
    95: "thunderstorm",
    96: "thunderstorm with slight hail",
    99: "thunderstorm with heavy hail",
}


@tool
async def weather(
    location: str,
    config: RunnableConfig,
    days: int = 3,
    units: Literal["metric", "imperial"] = "metric",
) -> str:
    """Get the current weather and a daily forecast for a place.

    `location` is a city or town name ("Berlin", "Springfield"). `days` is how many days of
    forecast to give (1-16, default 3). `units` is "metric" (°C, km/h, mm) or "imperial"
    (°F, mph, inch).
    """
    reporter = get_reporter(config)
    with reporter.reporting_errors():
        location = folded_text(location, "the location", MAX_LOCATION_CHARS)
        settings = get_runtime(config).tool_settings.of(WeatherSettings)
        if not (settings.open_meteo_url and settings.open_meteo_geocoding_url):
            raise ToolException("Error: the weather service is not configured")
        reporter.step(f"Locating “{location}”")
        found = await _get_json(
            config,
            f"{settings.open_meteo_geocoding_url.rstrip('/')}/v1/search",
            {"name": location, "count": "1", "language": "en", "format": "json"},
        )
        place = _place(found, location)
        reporter.step(f"Fetching the forecast for {place['label']}")
        params = {
            "latitude": str(place["latitude"]),
            "longitude": str(place["longitude"]),
            "current": CURRENT,
            "daily": DAILY,
            "timezone": "auto",
            "forecast_days": str(max(1, min(days, MAX_DAYS))),
            **(IMPERIAL if units == "imperial" else {}),
        }
        forecast = await _get_json(
            config, f"{settings.open_meteo_url.rstrip('/')}/v1/forecast", params
        )
        text = _render(place["label"], forecast)
    reporter.complete(f"Forecast for {place['label']}")
    return text


# The model reads the error text as the tool's result and can ask for another place.
weather.handle_tool_error = True


def wmo_words(code: Any) -> str:
    """A WMO weather code in words."""
    return WMO_CODES.get(code, f"weather code {code}") if isinstance(code, int) else "unknown"


def _place(data: Any, location: str) -> dict[str, Any]:
    """The first geocoding match as {label, latitude, longitude}; a tool error for none."""
    if not isinstance(data, dict):
        raise ToolException(f"Error: {_SERVICE} sent an unexpected geocoding response")
    results = data.get("results") or []  # no match: the key is absent
    if not isinstance(results, list):
        raise ToolException(f"Error: {_SERVICE} sent an unexpected geocoding response")
    if not results:
        raise ToolException(
            f"Error: no place called “{location}” was found; try the name of a nearby city"
        )
    first = results[0]
    try:
        name, lat, lon = str(first["name"]), float(first["latitude"]), float(first["longitude"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ToolException(f"Error: {_SERVICE} sent an unexpected geocoding response") from exc
    parts = [name]
    region, country = first.get("admin1"), first.get("country")
    if isinstance(region, str) and region and name not in region:
        parts.append(region)
    if isinstance(country, str) and country:
        parts.append(country)
    return {"label": ", ".join(parts), "latitude": lat, "longitude": lon}


def _render(label: str, data: Any) -> str:
    """The forecast as text: the place, the current conditions, then one line per day."""
    try:
        now, now_units = data["current"], data["current_units"]
        daily, daily_units = data["daily"], data["daily_units"]
        lines = [
            f"Weather for {label} ({data.get('timezone', 'local time')})",
            f"Now ({str(now['time']).replace('T', ' ')}): "
            f"{_amount(now['temperature_2m'], now_units['temperature_2m'])}, "
            f"{wmo_words(now['weather_code'])}, "
            f"wind {_amount(now['wind_speed_10m'], now_units['wind_speed_10m'])}, "
            f"humidity {_amount(now['relative_humidity_2m'], now_units['relative_humidity_2m'])}",
        ]
        for i, day in enumerate(daily["time"]):
            low = _amount(daily["temperature_2m_min"][i], daily_units["temperature_2m_min"])
            high = _amount(daily["temperature_2m_max"][i], daily_units["temperature_2m_max"])
            rain = _amount(daily["precipitation_sum"][i], daily_units["precipitation_sum"])
            lines.append(
                f"{date.fromisoformat(day):%a %Y-%m-%d}: {wmo_words(daily['weather_code'][i])}, "
                f"{low} to {high}, precipitation {rain}"
            )
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise ToolException(f"Error: {_SERVICE} sent an unexpected forecast response") from exc
    return "\n".join(lines)


def _amount(value: Any, unit: Any) -> str:
    if value is None:
        return "n/a"
    if not isinstance(value, int | float):
        raise TypeError(f"not a number: {value!r}")
    unit = "mph" if unit == "mp/h" else str(unit)  # the API spells mph "mp/h"
    return f"{value:g}{unit}" if unit.startswith("°") or unit == "%" else f"{value:g} {unit}"


async def _get_json(config: RunnableConfig, url: str, params: dict[str, str]) -> Any:
    # Open-Meteo explains a rejected request as {"error": true, "reason": "..."}.
    return await request_json(
        config, "GET", url, service=_SERVICE, params=params, reason_of=_reason
    )


def _reason(body: Any) -> str | None:
    return body.get("reason") if isinstance(body, dict) else None
