"""The `get_time` tool: the current date and time in an IANA time zone.

Zone data comes from the system (`/usr/share/zoneinfo`) or the `tzdata` package; a slim
container image without either knows only UTC. `zone_for_place` finds a zone by the city it
is named after ("Tokyo" is Asia/Tokyo), for a caller that has only a place's name.
"""

from __future__ import annotations

from datetime import UTC, datetime, tzinfo
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from langchain_core.tools import ToolException, tool

__all__ = [
    "UnknownTimezoneError",
    "current_time",
    "get_time",
    "resolve_timezone",
    "zone_for_place",
]

# The longest IANA name is about 30 characters; anything far longer is not a zone.
_MAX_NAME_CHARS = 64
# The areas whose zones are named after a place. The others are not places ("Etc/GMT+5" is
# five hours behind GMT, "US/Pacific") or are an old name for one ("Japan", "GB").
_PLACE_AREAS = frozenset(
    [
        "Africa",
        "America",
        "Antarctica",
        "Asia",
        "Atlantic",
        "Australia",
        "Europe",
        "Indian",
        "Pacific",
    ]
)


class UnknownTimezoneError(ValueError):
    """The name is not an IANA time zone known to this machine."""


def resolve_timezone(name: str) -> tzinfo:
    """The zone called `name`, matched case-insensitively ("europe/paris" works too)."""
    cleaned = name.strip()
    if cleaned.upper() in {"UTC", "Z", "GMT"}:
        return UTC
    if not cleaned or len(cleaned) > _MAX_NAME_CHARS:
        raise UnknownTimezoneError(_unknown(name))
    key = _canonical_names().get(cleaned.lower(), cleaned)
    try:
        return ZoneInfo(key)
    # ValueError covers malformed keys such as "../etc"; OSError a key naming a directory.
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise UnknownTimezoneError(_unknown(name)) from exc


def current_time(timezone: str = "UTC", *, now: datetime | None = None) -> str:
    """The time `now` (default: this instant) in `timezone`, as one line for a model.

    For example "2024-01-01T01:00:00+01:00 (Monday, Europe/Paris, CET)": the weekday, the
    zone's name and its abbreviation, which is left out when it is the name ("UTC").
    """
    zone = resolve_timezone(timezone)
    moment = (now or datetime.now(UTC)).astimezone(zone)
    labels = [f"{moment:%A}", getattr(zone, "key", "UTC")]
    abbreviation = moment.tzname()
    if abbreviation and abbreviation not in labels:
        labels.append(abbreviation)
    return f"{moment.isoformat(timespec='seconds')} ({', '.join(labels)})"


def zone_for_place(place: str) -> str | None:
    """The zone named after `place`, a city or an island, as a person writes it: "Tokyo" is
    Asia/Tokyo, "new york" America/New_York, "Port-au-Prince" America/Port-au-Prince. None
    when no zone is. Of a place's several names ("America/Buenos_Aires" and
    "America/Argentina/Buenos_Aires", the same clock), the shortest."""
    return _zones_by_place().get(" ".join(place.replace("_", " ").split()).lower())


@tool
def get_time(timezone: str = "UTC") -> str:
    """Get the current date and time.

    `timezone` is an IANA time zone name such as "Europe/Paris" or "America/New_York";
    it defaults to "UTC".
    """
    try:
        return current_time(timezone)
    except UnknownTimezoneError as exc:
        raise ToolException(f"Error: {exc}") from exc


# The model reads the error text as the tool's result and can retry with a valid zone.
get_time.handle_tool_error = True


@lru_cache(maxsize=1)
def _canonical_names() -> dict[str, str]:
    # Walking the zone tree takes milliseconds, so do it once per process.
    return {name.lower(): name for name in available_timezones()}


@lru_cache(maxsize=1)
def _zones_by_place() -> dict[str, str]:
    zones: dict[str, str] = {}
    for name in sorted(available_timezones(), key=lambda n: (len(n), n)):
        area, _, rest = name.partition("/")
        if area in _PLACE_AREAS and rest:
            zones.setdefault(rest.rsplit("/", 1)[-1].replace("_", " ").lower(), name)
    return zones


def _unknown(name: str) -> str:
    # The name comes from a model and may be huge: quote only as much as a zone could be.
    shown = name if len(name) <= _MAX_NAME_CHARS else f"{name[:_MAX_NAME_CHARS]}…"
    return f"unknown time zone {shown!r}; use an IANA name such as 'Europe/Paris' or 'UTC'"
